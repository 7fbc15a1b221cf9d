// scenario_check.hpp — the one set of rules a Scenario must meet, whichever file
// format it came from (YAML, JSON, a plan's embedded scenario) or code built it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tdpipe/ir/scenario.hpp"

namespace tdpipe::ir {

/// One broken rule: the field it is about, as the scenario's keys name it
/// ("parallel.tensor", "cluster.groups[0].nodes"; "parallel" for a rule over several
/// keys), and what was expected.
struct ScenarioProblem {
  std::string field;
  std::string what;
};

/// The first broken rule of `scenario`, or nullopt: every count positive, every
/// bandwidth and FLOP rate positive and finite, latencies ≥ 0, names from their lists,
/// t·p·d equal to the cluster's GPUs, layers split evenly over p·v (or a given
/// layers_per_stage of p·v entries ≥ 1 summing to the layers), kv_heads a divisor of
/// heads, hidden/heads/kv_heads/ffn divisible by t, the batch by micro_batch·d,
/// interleaving's m % p, slices ≤ seq.
std::optional<ScenarioProblem> find_problem(const Scenario& scenario);

/// parallel.memory_budget as GiB when it is a positive number ("40", "12.5"), else nullopt
/// (the named budgets 1f1b, 2x1f1b, max).
std::optional<double> memory_budget_gib(const std::string& text);

/// Names a scenario's schedule may take, dtypes, MLP kinds, attention kernels, recompute
/// modes, topologies, optimizers.
const std::vector<std::string>& scenario_schedule_names();
const std::vector<std::string>& scenario_dtypes();
const std::vector<std::string>& scenario_mlp_names();
const std::vector<std::string>& scenario_attention_names();
const std::vector<std::string>& scenario_recompute_names();
const std::vector<std::string>& scenario_topologies();
const std::vector<std::string>& scenario_optimizer_names();
const std::vector<std::string>& scenario_param_offload_names();

}  // namespace tdpipe::ir
