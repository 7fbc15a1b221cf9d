// build_plan.cpp — generate → cost → lower → validate.
#include "tdpipe/planner/build_plan.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/lowering.hpp"
#include "schedule_common.hpp"
#include "tdpipe/ir/scenario_check.hpp"
#include "tdpipe/planner/cost_model.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/planner/generators.hpp"

namespace tdpipe::planner {

int chunks_for(std::string_view schedule, const ir::Scenario& scenario) {
  if (schedule == "zb-v") return 2;
  if (schedule == "interleaved") return scenario.chunks() > 1 ? scenario.chunks() : 2;
  return 1;
}

namespace {

bool sliced(std::string_view schedule) { return schedule == "tdpipe" || schedule == "auto"; }

bool wants_auto_slices(std::string_view schedule, const ir::Scenario& scenario, int slices) {
  return sliced(schedule) && (slices == kAutoSlices || (slices == 0 && scenario.parallel.slices_auto));
}

int slices_for(std::string_view schedule, const ir::Scenario& scenario, int slices) {
  if (wants_auto_slices(schedule, scenario, slices)) return 1;  // until solved (build_plan)
  return sliced(schedule) ? (slices > 0 ? slices : scenario.parallel.slices) : 1;
}

/// One F, B and W of micro-batch 0 per rank and slice (one chunk per rank), costed by
/// apply_costs exactly as the final plan will be — same partition, same `slice_tokens`
/// (empty: equal-cost cuts) — the planner's cost table.
ir::Plan costed_probe(const ir::Scenario& sc, int p, int m, int S, const std::vector<int>& slice_tokens) {
  ir::Plan probe = detail::plan_skeleton("probe", p, m, 1, S);
  probe.data = sc.synthetic ? 1 : sc.parallel.data;
  probe.scenario = sc;
  probe.slice_tokens = slice_tokens;
  for (auto& ops : probe.ranks)
    for (int s = 0; s < S; ++s)
      for (ir::OpKind k : {ir::OpKind::F, ir::OpKind::B, ir::OpKind::W}) ops.push_back(detail::compute_op(k, 0, 0, s));
  apply_costs(probe, sc);
  return probe;
}

/// The rank of a costed probe whose micro-batch (all its slices) takes longest; the
/// first such rank on ties.
int bottleneck_rank(const ir::Plan& probe) {
  int worst = 0;
  double worst_seconds = -1;
  for (int r = 0; r < probe.num_ranks(); ++r) {
    double sec = 0;
    for (const ir::Op& op : probe.ranks[r]) sec += op.est_seconds;
    if (sec > worst_seconds) worst_seconds = sec, worst = r;
  }
  return worst;
}

/// The auto scheduler's cost table: the costed probe's F, B and W per rank and slice;
/// link times from the analytic engine's placement; each rank's budget from
/// parallel.memory_budget.
AutoCosts auto_costs(const ir::Scenario& sc, const ScheduleParams& params) {
  const int p = params.stages, S = params.slices, m = params.microbatches;
  const ir::Plan probe = costed_probe(sc, p, m, S, params.slice_tokens);
  AutoCosts c;
  auto table = [&] { return std::vector<std::vector<double>>(p, std::vector<double>(S, 0.0)); };
  c.f_seconds = c.b_seconds = c.w_seconds = c.f_bytes = c.b_bytes = c.w_bytes = table();
  for (int r = 0; r < p; ++r)
    for (const ir::Op& op : probe.ranks[r]) {
      auto& sec = op.kind == ir::OpKind::F ? c.f_seconds : op.kind == ir::OpKind::B ? c.b_seconds : c.w_seconds;
      auto& mem = op.kind == ir::OpKind::F ? c.f_bytes : op.kind == ir::OpKind::B ? c.b_bytes : c.w_bytes;
      sec[r][op.slice] = op.est_seconds;
      mem[r][op.slice] = op.mem_bytes;
    }
  // A synthetic scenario without activation_bytes counts memory in slices held (F to B).
  bool no_bytes = true;
  for (const auto& row : c.f_bytes)
    for (double b : row) no_bytes = no_bytes && !(b > 0);
  if (no_bytes) {
    if (ir::memory_budget_gib(sc.parallel.memory_budget))
      throw Error(fmt::format("{}: parallel.memory_budget {} GiB needs activation sizes, which this scenario "
                              "does not have (synthetic.activation_bytes); use 1f1b, 2x1f1b or max",
                              sc.name, sc.parallel.memory_budget));
    c.f_bytes = table();
    c.b_bytes = table();
    for (int r = 0; r < p; ++r)
      for (int s = 0; s < S; ++s) c.f_bytes[r][s] = 1, c.b_bytes[r][s] = -1;
  }
  const ir::LoweringOptions lowering = lowering_options(probe, sc);
  for (int r = 0; r + 1 < p; ++r) {
    double worst = 0;  // the longest slice's transfer: a bound for every slice
    for (const ir::Op& op : probe.ranks[r])
      if (op.kind == ir::OpKind::F) worst = std::max(worst, p2p_seconds(probe, r, r + 1, lowering.p2p_bytes(op)));
    c.p2p_seconds.push_back(worst);
  }
  const std::string& budget = sc.parallel.memory_budget;
  const std::vector<MemoryEstimate> memory = memory_per_rank(probe, sc);
  for (int r = 0; r < p; ++r) {
    double per_mb = 0;
    for (int s = 0; s < S; ++s) per_mb += c.f_bytes[r][s];
    // "max" without a device: everything.
    const double free = sc.synthetic || no_bytes ? m * per_mb
                                                 : gpu_of_rank(sc, r).hbm_bytes - memory[r].weights_bytes -
                                                       memory[r].grads_bytes - memory[r].optimizer_bytes;
    const double b = auto_budget_bytes(sc, p, m, per_mb, free);
    if (!(b >= per_mb))
      throw Error(fmt::format("{}: parallel.memory_budget {}: rank {} may hold {:.2f} GiB of activations but one "
                              "micro-batch needs {:.2f} GiB; expected a larger budget (or more pipeline stages, "
                              "recompute, a smaller micro_batch)",
                              sc.name, budget, r, b / double(1u << 30), per_mb / double(1u << 30)));
    c.budget_bytes.push_back(b);
  }
  return c;
}

/// F, B, W seconds of one layer and of a stage's ends for every slice on the grid of
/// solve_slices_terapipe, memoised per cost shape (everything layer_cost and the ends
/// read: the model, the tensor-parallel shape, the fabric and the GPU).
struct SliceGridCosts {
  struct Kinds {
    double layer[3] = {0, 0, 0}, ends[3] = {0, 0, 0};
  };
  std::unordered_map<std::int64_t, Kinds> by_slice;  ///< (tokens << 32) | prefix
  const Kinds& at(int tokens, int prefix) const {
    return by_slice.at((static_cast<std::int64_t>(tokens) << 32) | static_cast<std::int64_t>(prefix));
  }
};

const SliceGridCosts& slice_grid_costs(const ir::Scenario& sc, const ir::GpuSpec& gpu, bool first, bool last,
                                       int max_units) {
  const std::string key = fmt::format("{}|{}|{}|{}", cost_shape_key(sc, gpu), first, last, max_units);
  thread_local std::map<std::string, SliceGridCosts> memo;
  if (auto it = memo.find(key); it != memo.end()) return it->second;
  if (memo.size() >= 256) memo.clear();
  const std::vector<int> at = slice_grid(sc.model.seq, max_units);
  const int G = static_cast<int>(at.size()) - 1;
  SliceGridCosts out;
  for (int a = 0; a < G; ++a)
    for (int b = a + 1; b <= G; ++b) {
      const int from = at[a], len = at[b] - at[a];
      const LayerCost layer = layer_cost(sc, gpu, len, from);
      const LayerCost ends = stage_ends_cost(sc, gpu, first, last, len, from);
      SliceGridCosts::Kinds k;
      k.layer[0] = layer.f.seconds, k.layer[1] = layer.b.seconds, k.layer[2] = layer.w.seconds;
      k.ends[0] = ends.f.seconds, k.ends[1] = ends.b.seconds, k.ends[2] = ends.w.seconds;
      out.by_slice.emplace((static_cast<std::int64_t>(len) << 32) | from, k);
    }
  return memo.emplace(key, std::move(out)).first->second;
}

}  // namespace

std::vector<int> auto_slice_tokens(const ir::Scenario& sc, int max_units) {
  if (sc.synthetic)
    throw Error(fmt::format("{}: slices auto cuts a sequence by the cost model; a synthetic scenario has no "
                            "tokens (give synthetic.slices or --slices N)", sc.name));
  const int p = sc.stages(), m = sc.microbatches();
  // One stage's slice = the bottleneck stage's cost at that length and prefix (the stage
  // whose full-sequence F+B+W is largest), as the pipeline runs at its pace.
  const ir::Plan probe = costed_probe(sc, p, m, 1, {});
  const int worst = bottleneck_rank(probe);
  const int layers = probe.stage_layers.at(static_cast<std::size_t>(worst));
  const ir::GpuSpec gpu = gpu_of_rank(sc, worst);
  // One slice's F, B and W are n·(a layer's) + (the stage's ends), chunk_cost's own sums;
  // the layer and end costs on the grid depend on the shape, not on p, m or the
  // partition, so they are kept across calls (the search solves many layouts of one shape).
  const SliceGridCosts& grid = slice_grid_costs(sc, gpu, worst == 0, worst == p - 1, max_units);
  auto compute = [&](double tokens, double prefix) {
    const auto& k = grid.at(static_cast<int>(tokens), static_cast<int>(prefix));
    double sec = 0;
    for (int i = 0; i < 3; ++i) sec += k.layer[i] * layers + k.ends[i];
    return sec;
  };
  // Activations forward and gradients back cross the slowest link once each.
  const double bytes_per_token =
      double(lowering_options(probe, sc).p2p_bytes(detail::compute_op(ir::OpKind::F, 0, 0, 0))) / sc.model.seq;
  std::map<int, double> transfer_of;  // by length: few distinct ones on the grid
  auto transfer = [&](double tokens) {
    if (p == 1) return 0.0;
    const int len = static_cast<int>(tokens);
    if (auto it = transfer_of.find(len); it != transfer_of.end()) return it->second;
    const auto bytes = static_cast<std::int64_t>(std::llround(bytes_per_token * len));
    double worst_link = 0;
    for (int r = 0; r + 1 < p; ++r) worst_link = std::max(worst_link, p2p_seconds(probe, r, r + 1, bytes));
    return transfer_of[len] = 2 * worst_link;
  };
  return solve_slices_terapipe(sc.model.seq, p, m, max_units, compute, transfer);
}

namespace {
// Decoder layers of the fullest virtual stage (parameter offload streams each one).
std::int64_t most_layers(const ir::Scenario& sc, std::string_view schedule) {
  const auto& given = sc.parallel.layers_per_stage;
  if (!given.empty()) return *std::max_element(given.begin(), given.end());
  const std::int64_t vs = std::int64_t{std::max(1, sc.stages())} * chunks_for(schedule, sc);
  // (an auto partition puts at most twice the average on a stage, as its cost allows)
  const std::int64_t even = (sc.model.layers + vs - 1) / vs;
  return sc.parallel.layers_per_stage_auto ? std::min<std::int64_t>(sc.model.layers, 2 * even) : even;
}

// Ops per (micro-batch, chunk, slice): F, B, W, SEND/RECV of activation and gradient,
// and under parameter offload a LOAD per layer for F and for B (or BW).
std::int64_t ops_per_unit(const ir::Scenario& sc, std::string_view schedule) {
  std::int64_t n = 3 + 4;
  if (!sc.synthetic && sc.parallel.offload()) n += 2 * most_layers(sc, schedule);
  return n;
}
}  // namespace

std::int64_t estimate_ops(const ir::Scenario& scenario, std::string_view schedule, int slices) {
  const std::int64_t per_unit = ops_per_unit(scenario, schedule);
  // slices auto: at most one slice per unit of the solver's grid.
  const std::int64_t S = wants_auto_slices(schedule, scenario, slices)
                             ? std::min<std::int64_t>(std::max(1, scenario.model.seq), kAutoSliceUnits)
                             : slices_for(schedule, scenario, slices);
  const std::int64_t units = std::int64_t{scenario.microbatches()} * chunks_for(schedule, scenario) * S;
  std::int64_t per_rank_extra = 64;  // OPT, a few data-parallel buckets and their batches
  // Parameter offload: OPT's LOAD and OFFLOAD of each layer's state.
  if (!scenario.synthetic && scenario.parallel.offload())
    per_rank_extra += 2 * chunks_for(schedule, scenario) * most_layers(scenario, schedule);
  if (!scenario.synthetic && scenario.parallel.data > 1) {
    // A bucket per bucket_mb of gradients (two ops each with a sharded optimizer), at
    // most the whole model's on one rank: a tiny bucket_mb must be refused, not allocated.
    const double model_params =
        params_of_chunk(scenario, 0, 2, scenario.model.layers) + params_of_chunk(scenario, 1, 2, 0);
    const double buckets = std::ceil(model_params * static_bytes_per_param(scenario).grads_bytes /
                                     std::max(1.0, scenario.parallel.bucket_mb * (1 << 20)));
    const double per_bucket = scenario.parallel.distributed_optimizer ? 2 : 1;
    per_rank_extra += static_cast<std::int64_t>(std::min(buckets * per_bucket, 1e15));
  }
  return std::int64_t{scenario.stages()} * (units * per_unit + per_rank_extra);
}

BuiltPlan build_plan(const ir::Scenario& scenario, std::string_view schedule, int slices, std::int64_t max_ops) {
  ScheduleParams params;
  params.stages = scenario.stages();
  params.microbatches = scenario.microbatches();
  params.chunks = chunks_for(schedule, scenario);
  params.slices = slices_for(schedule, scenario, slices);
  if ((slices > 1 || slices == kAutoSlices) && !sliced(schedule))
    throw Error(fmt::format("--slices {}: temporal slices apply to the tdpipe and auto schedules only, not {}",
                            slices == kAutoSlices ? "auto" : std::to_string(slices), schedule));
  if (wants_auto_slices(schedule, scenario, slices)) {
    // Refuse an absurd plan before solving (even one slice is too many ops), then
    // check again with the S chosen.
    if (estimate_ops(scenario, schedule, 1) <= max_ops) {
      params.slice_tokens = auto_slice_tokens(scenario, kAutoSliceUnits);
      params.slices = static_cast<int>(params.slice_tokens.size());
      if (params.slices == 1) params.slice_tokens.clear();  // not sliced: the plan says so
    }
    slices = params.slices;
  }
  if (const std::int64_t ops = estimate_ops(scenario, schedule, slices); ops > max_ops) {
    // Both copies (compute-only and lowered) are held while planning.
    const double gib = 2.0 * static_cast<double>(ops) * sizeof(ir::Op) / double(1u << 30);
    throw Error(fmt::format(
        "{}: the {} plan would have up to {} ops (p = {} stages x m = {} micro-batches x v = {} chunks "
        "x S = {} slices x {}), about {:.1f} GiB while planned; the limit is {} ops (--max-ops N raises it)",
        scenario.name, schedule, ops, params.stages, params.microbatches, params.chunks, params.slices,
        ops_per_unit(scenario, schedule), gib, max_ops));
  }
  if (!scenario.synthetic && scenario.parallel.layers_per_stage.empty() && !scenario.parallel.layers_per_stage_auto &&
      scenario.model.layers % (params.stages * params.chunks) != 0)
    throw Error(fmt::format(
        "{}: schedule {} runs {} chunk(s) on each of {} stages, so model.layers ({}) must be "
        "divisible by {} (or give parallel.layers_per_stage: a list or auto)",
        scenario.name, schedule, params.chunks, params.stages, scenario.model.layers,
        params.stages * params.chunks));
  // Equal-cost slices (solve_slices) leave params.slice_costs empty: every slice costs the
  // same given its prefix, which the tdpipe list scheduler then assumes. TeraPipe's cuts
  // are not equal: their relative costs go to the scheduler.
  // Costs of the bottleneck stage, on which the cuts were chosen.
  if (!params.slice_tokens.empty() && params.slices > 1) {
    const ir::Plan probe = costed_probe(scenario, params.stages, 1, params.slices, params.slice_tokens);
    params.slice_costs.assign(static_cast<std::size_t>(params.slices), 0.0);
    for (const ir::Op& op : probe.ranks[static_cast<std::size_t>(bottleneck_rank(probe))])
      params.slice_costs[static_cast<std::size_t>(op.slice)] += op.est_seconds;
  }

  BuiltPlan out;
  if (schedule == "auto") params.auto_costs = auto_costs(scenario, params);
  out.compute_only = make_schedule(schedule, params);
  out.compute_only.slice_tokens = params.slice_tokens;
  // Activation bytes are checked against the budget by the validator (no budget in
  // slice units: a synthetic scenario without activation sizes has 0-byte ops).
  if (schedule == "auto" && (!scenario.synthetic || scenario.synthetic->activation_bytes > 0))
    out.compute_only.memory_budget_bytes = params.auto_costs.budget_bytes;
  out.compute_only.data = scenario.synthetic ? 1 : scenario.parallel.data;
  out.compute_only.scenario = scenario;
  apply_costs(out.compute_only, scenario);
  // lower() proves its order deadlock-free (see ValidateOptions); every other check runs.
  // Blocking transfers (overlap_p2p false) add dependencies that proof does not cover:
  // replayed then.
  ir::ValidateOptions checks;
  checks.check_deadlock = !scenario.parallel.overlap_p2p;
  ir::LoweredPlan lowered =
      ir::lower_validated(out.compute_only, lowering_options(out.compute_only, scenario), checks);
  out.lowered = std::move(lowered.plan);
  out.report = std::move(lowered.report);
  return out;
}

}  // namespace tdpipe::planner
