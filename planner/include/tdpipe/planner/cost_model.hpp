// cost_model.hpp — FLOPs, bytes, memory and time of a scenario's ops
// (Megatron formulas, tensor-parallel split, recompute, attention per slice).
#pragma once

#include <cstdint>
#include <vector>

#include "tdpipe/ir/lowering.hpp"
#include "tdpipe/ir/plan.hpp"
#include "tdpipe/ir/scenario.hpp"

namespace tdpipe::planner {

/// Per-op costs of one model chunk for one micro-batch slice.
struct OpCost {
  double flops = 0;
  double seconds = 0;
};

struct MemoryEstimate {
  double weights_bytes = 0, grads_bytes = 0, optimizer_bytes = 0;
  double activation_bytes = 0;  ///< peak, for the schedule's in-flight count
  double total_bytes() const { return weights_bytes + grads_bytes + optimizer_bytes + activation_bytes; }
};

/// GEMM efficiency (fraction of peak) for a GEMM of m×k·k×n; documented default curve.
double gemm_efficiency(double m, double n, double k);

/// Tokens per slice so that each slice costs the same given its prefix (Seq1F1B);
/// S = 1 gives {seq}.
std::vector<int> solve_slices(const ir::Scenario& scenario, int slices);

/// Fills flops / est_seconds / mem_bytes of every compute op of a compute-only plan
/// (synthetic scenarios: the given F/B/W times) and returns the options lowering
/// needs (p2p bytes, gradient bytes per chunk).
void apply_costs(ir::Plan& plan, const ir::Scenario& scenario);

/// What lowering needs from the cost model: p2p bytes per producer op, gradient
/// bytes per (rank, chunk).
ir::LoweringOptions lowering_options(const ir::Plan& plan, const ir::Scenario& scenario);

/// Peak memory per pipeline rank for a plan with costs (weights, grads, Adam
/// states, peak activations from the plan's in-flight count).
std::vector<MemoryEstimate> memory_per_rank(const ir::Plan& plan, const ir::Scenario& scenario);

}  // namespace tdpipe::planner
