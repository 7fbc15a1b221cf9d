// balance.cpp — measured slowdowns, EWMA, Hungarian and bottleneck assignment, and the
// partition ⇄ assignment alternation (see balance.hpp).
#include "tdpipe/planner/balance.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <tuple>

#include <fmt/format.h>

#include "tdpipe/ir/placement.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/planner/cost_model.hpp"

namespace tdpipe::planner {
namespace {

void check_square(const std::vector<std::vector<double>>& cost, const char* what) {
  for (const auto& row : cost) {
    if (row.size() != cost.size())
      throw Error(fmt::format("{}: expected a square cost matrix, got a row of {} for {} rows", what, row.size(),
                              cost.size()));
    for (double c : row)
      if (!std::isfinite(c)) throw Error(fmt::format("{}: expected finite costs, got {}", what, c));
  }
}

/// A perfect matching of rows to columns using only edges allowed[r][c] (Kuhn's
/// augmenting paths), or nothing.
bool perfect_matching(const std::vector<std::vector<bool>>& allowed) {
  const int n = static_cast<int>(allowed.size());
  std::vector<int> col_of(n, -1), row_of(n, -1);
  std::vector<char> seen;
  auto augment = [&](auto&& self, int r) -> bool {
    for (int c = 0; c < n; ++c) {
      if (!allowed[r][c] || seen[c]) continue;
      seen[c] = 1;
      if (row_of[c] < 0 || self(self, row_of[c])) {
        row_of[c] = r;
        col_of[r] = c;
        return true;
      }
    }
    return false;
  };
  for (int r = 0; r < n; ++r) {
    seen.assign(n, 0);
    if (!augment(augment, r)) return false;
  }
  return true;
}

/// Whether slot `r` of the scenario lies inside one node group (d = 1, whole nodes per
/// slot), and which.
std::vector<int> group_of_slots(const ir::Scenario& sc) {
  const int p = sc.parallel.pipeline, t = sc.parallel.tensor, per_node = sc.cluster.gpus_per_node;
  if (sc.parallel.data != 1 || t % per_node != 0) return {};
  const int nodes_per_slot = t / per_node;
  const ir::Placement place{t, p, 1};
  std::vector<int> out;
  for (int r = 0; r < p; ++r) {
    long node = ir::Placement::node_of(place.gpu(0, r, 0), per_node);
    int g = 0;
    while (g < static_cast<int>(sc.cluster.groups.size()) && node >= sc.cluster.groups[g].nodes)
      node -= sc.cluster.groups[g++].nodes;
    if (g == static_cast<int>(sc.cluster.groups.size()) || node + nodes_per_slot > sc.cluster.groups[g].nodes) return {};
    out.push_back(g);
  }
  return out;
}

/// The cluster's groups in the order the stages now run on them, when each group's
/// slots stay together; nullopt otherwise.
std::optional<std::vector<ir::NodeGroup>> reorder_groups(const ir::Scenario& sc, const std::vector<int>& slot_of_stage) {
  const std::vector<int> group = group_of_slots(sc);
  if (group.empty()) return std::nullopt;
  const int nodes_per_slot = sc.parallel.tensor / sc.cluster.gpus_per_node;
  std::vector<ir::NodeGroup> out;
  std::vector<char> done(sc.cluster.groups.size(), 0);
  // Each group's slots must come as one run, in their own order: then stage k lands on
  // the same node of the same group as slot_of_stage[k] (its device moves with it).
  int last = -1, prev_slot = -1;
  for (int slot : slot_of_stage) {
    const int g = group[static_cast<std::size_t>(slot)];
    if (g != last) {
      if (done[static_cast<std::size_t>(g)]) return std::nullopt;  // this group's slots are split
      if (last >= 0) done[static_cast<std::size_t>(last)] = 1;
      out.push_back(sc.cluster.groups[static_cast<std::size_t>(g)]);
      out.back().nodes = 0;
      last = g;
    } else if (slot != prev_slot + 1) {
      return std::nullopt;  // reordered inside its group: not a group order
    }
    prev_slot = slot;
    out.back().nodes += nodes_per_slot;
  }
  for (std::size_t g = 0; g < out.size(); ++g)  // every group whole: the run started at its first slot
    if (out[g].nodes == 0) return std::nullopt;
  return out;
}

/// The cost model's one-micro-batch, full-sequence F+B+W of one decoder layer and of
/// the ends (embedding / head / loss) of stage k of p on `gpu`.
struct StageModel {
  double layer = 0, ends = 0;
};
StageModel stage_model(const ir::Scenario& sc, const ir::GpuSpec& gpu, int k, int p) {
  StageModel m;
  for (ir::OpKind kind : {ir::OpKind::F, ir::OpKind::B, ir::OpKind::W}) {
    const double one = chunk_cost(sc, gpu, kind, k, p, 1, sc.model.seq, 0).seconds;
    const double none = chunk_cost(sc, gpu, kind, k, p, 0, sc.model.seq, 0).seconds;
    m.layer += one - none;
    m.ends += none;
  }
  return m;
}

}  // namespace

Slowdown measured_slowdown(const ir::Scenario& sc, const ir::Plan& plan, const traces::Trace& trace) {
  std::vector<std::map<std::tuple<int, int, int, int>, double>> modelled(plan.ranks.size());
  for (std::size_t r = 0; r < plan.ranks.size(); ++r)
    for (const ir::Op& op : plan.ranks[r])
      if (ir::is_chunk_work(op.kind)) modelled[r][{static_cast<int>(op.kind), op.mb, op.chunk, op.slice}] = op.est_seconds;
  // A trace of another partition of the same schedule has the same ops but other work.
  if (auto it = trace.metadata.find("stage_layers"); it != trace.metadata.end()) {
    const std::string mine = fmt::format("{}", fmt::join(plan.stage_layers, ","));
    if (!plan.stage_layers.empty() && it->second != mine)
      throw Error(fmt::format("trace: measured with stage_layers [{}], the plan has [{}]; balance the scenario and "
                              "schedule the trace ran (--schedule {}{}; its -o output, if it was balanced)",
                              it->second, mine, trace.schedule.empty() ? "NAME" : trace.schedule,
                              plan.schedule == trace.schedule ? "" : fmt::format(", not {}", plan.schedule)));
  }
  const int p = plan.num_ranks(), replicas = std::max(1, plan.data), workers = p * replicas;
  std::vector<double> measured(plan.ranks.size(), 0.0), model(plan.ranks.size(), 0.0);
  std::vector<double> in_layers(plan.ranks.size(), 0.0);
  std::vector<char> split(plan.ranks.size(), 1);  // every event of the rank says its layers' part
  for (const traces::TraceEvent& e : trace.events) {
    if (!e.kind || !ir::is_chunk_work(*e.kind) || e.rank < 0) continue;
    // Replicas' workers are numbered replica · p + rank (the executors' traces).
    if (e.rank >= workers)
      throw Error(fmt::format("trace: event {} on rank {}, but the plan has {} ranks x {} replicas", e.name, e.rank,
                              p, replicas));
    const int r = e.rank % p;
    const auto it = modelled[r].find({static_cast<int>(*e.kind), e.mb, e.chunk, e.slice});
    if (it == modelled[r].end())
      throw Error(fmt::format("trace: event {} on rank {} is not an op of the plan ({} schedule); measure this plan",
                              e.name, e.rank, plan.schedule));
    measured[r] += static_cast<double>(e.dur_ns) * 1e-9;
    model[r] += it->second;
    if (e.layers_ns < 0) split[r] = 0;
    else in_layers[r] += static_cast<double>(e.layers_ns) * 1e-9;
  }
  Slowdown out;
  out.ends.assign(static_cast<std::size_t>(p), 1.0);
  for (int r = 0; r < p; ++r) {
    if (!(model[r] > 0) || !(measured[r] > 0))
      throw Error(fmt::format("trace: no compute op of rank {} with a time (measured {} s, modelled {} s)", r,
                              measured[r], model[r]));
    out.device.push_back(measured[r] / model[r]);
  }
  // Layers apart from the ends: per micro-batch against the model's full-sequence F+B+W.
  const bool one_chunk = plan.chunks == 1 && static_cast<int>(plan.stage_layers.size()) == p && !sc.synthetic &&
                         sc.stages() == p;
  for (int r = 0; one_chunk && r < p; ++r) {
    const int n = plan.stage_layers[static_cast<std::size_t>(r)];
    if (!split[r] || n <= 0 || !(in_layers[r] > 0)) continue;
    const StageModel m = stage_model(sc, gpu_of_rank(sc, r), r, p);
    const double per_mb = 1.0 / (static_cast<double>(plan.microbatches) * replicas);
    if (!(m.layer > 0)) continue;
    const double rest = (measured[r] - in_layers[r]) * per_mb;
    if (!(m.ends > 1e-12 * m.layer)) {
      // A stage without modelled ends: its small rest (copies, bookkeeping) scales with
      // its device like its layers, so it joins the device's factor.
      out.device[r] = measured[r] * per_mb / (n * m.layer);
      continue;
    }
    const double device = in_layers[r] * per_mb / (n * m.layer);
    if (!std::isfinite(device)) continue;
    out.device[r] = device;
    if (rest > 0) out.ends[r] = rest / (device * m.ends);
  }
  return out;
}

Ewma::Ewma(double alpha) : alpha_(alpha) {
  if (!(alpha > 0 && alpha <= 1)) throw Error(fmt::format("EWMA: alpha = {}; expected 0 < alpha ≤ 1", alpha));
}

void Ewma::reorder(const std::vector<int>& from) {
  if (from.size() != value_.size()) throw Error(fmt::format("EWMA: reorder of {} values by {}", value_.size(), from.size()));
  std::vector<double> next(value_.size());
  for (std::size_t k = 0; k < from.size(); ++k) next[k] = value_.at(static_cast<std::size_t>(from[k]));
  value_ = std::move(next);
}

void Ewma::add(const std::vector<double>& sample) {
  if (samples_ > 0 && sample.size() != value_.size())
    throw Error(fmt::format("EWMA: a sample of {} values after samples of {}", sample.size(), value_.size()));
  if (samples_ == 0) value_ = sample;
  else
    for (std::size_t i = 0; i < sample.size(); ++i) value_[i] = alpha_ * sample[i] + (1 - alpha_) * value_[i];
  ++samples_;
}

std::vector<int> min_sum_assignment(const std::vector<std::vector<double>>& cost) {
  check_square(cost, "assignment");
  const int n = static_cast<int>(cost.size());
  if (n == 0) return {};
  // Kuhn–Munkres with potentials (1-indexed; column 0 is the virtual start).
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> u(n + 1, 0), v(n + 1, 0);
  std::vector<int> match(n + 1, 0), way(n + 1, 0);
  for (int i = 1; i <= n; ++i) {
    match[0] = i;
    int j0 = 0;
    std::vector<double> minv(n + 1, inf);
    std::vector<char> used(n + 1, 0);
    do {
      used[j0] = 1;
      const int i0 = match[j0];
      double delta = inf;
      int j1 = 0;
      for (int j = 1; j <= n; ++j) {
        if (used[j]) continue;
        const double cur = cost[i0 - 1][j - 1] - u[i0] - v[j];
        if (cur < minv[j]) minv[j] = cur, way[j] = j0;
        if (minv[j] < delta) delta = minv[j], j1 = j;
      }
      for (int j = 0; j <= n; ++j) {
        if (used[j]) u[match[j]] += delta, v[j] -= delta;
        else minv[j] -= delta;
      }
      j0 = j1;
    } while (match[j0] != 0);
    do {
      const int j1 = way[j0];
      match[j0] = match[j1];
      j0 = j1;
    } while (j0 != 0);
  }
  std::vector<int> out(n);
  for (int j = 1; j <= n; ++j) out[match[j] - 1] = j - 1;
  return out;
}

std::vector<int> bottleneck_assignment(const std::vector<std::vector<double>>& cost) {
  check_square(cost, "bottleneck assignment");
  const int n = static_cast<int>(cost.size());
  if (n == 0) return {};
  std::vector<double> values;
  for (const auto& row : cost) values.insert(values.end(), row.begin(), row.end());
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  auto feasible = [&](double bound) {
    std::vector<std::vector<bool>> allowed(n, std::vector<bool>(n));
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < n; ++c) allowed[r][c] = cost[r][c] <= bound;
    return perfect_matching(allowed);
  };
  std::size_t lo = 0, hi = values.size() - 1;  // values[hi] is always feasible
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    if (feasible(values[mid])) hi = mid;
    else lo = mid + 1;
  }
  const double bound = values[lo];
  // The least total among assignments within the bound: edges above it cost more than
  // any assignment within it could.
  double total = 0;
  for (double c : values) total += std::abs(c);
  const double penalty = (n + 1) * (total + 1);
  std::vector<std::vector<double>> within = cost;
  for (auto& row : within)
    for (double& c : row)
      if (c > bound) c = penalty;
  return min_sum_assignment(within);
}

Rebalance rebalance(const ir::Scenario& sc, const Slowdown& slowdown) {
  if (sc.synthetic) throw Error(fmt::format("{}: balancing re-partitions a model's layers; a synthetic scenario has none", sc.name));
  if (sc.parallel.chunks != 1)
    throw Error(fmt::format("{}: balancing handles one model chunk per rank (parallel.chunks = {})", sc.name,
                            sc.parallel.chunks));
  const int p = sc.parallel.pipeline, L = sc.model.layers;
  if (static_cast<int>(slowdown.device.size()) != p)
    throw Error(fmt::format("balance: {} slowdowns for {} pipeline ranks; expected one per rank",
                            slowdown.device.size(), p));
  if (!slowdown.ends.empty() && static_cast<int>(slowdown.ends.size()) != p)
    throw Error(fmt::format("balance: {} ends factors for {} stages; expected one per stage (or none)",
                            slowdown.ends.size(), p));
  for (const auto* v : {&slowdown.device, &slowdown.ends})
    for (double s : *v)
      if (!(s > 0) || !std::isfinite(s))
        throw Error(fmt::format("balance: slowdown {}; expected a positive finite factor", s));
  // One layer and the ends (embedding / head) of stage k on slot j: one micro-batch's
  // full-sequence F+B+W, on slot j's GPU, times slot j's device factor (and the ends'
  // own factor, which stays with stage k).
  std::vector<std::vector<double>> layer(p, std::vector<double>(p)), ends(p, std::vector<double>(p));
  for (int j = 0; j < p; ++j) {
    const ir::GpuSpec gpu = gpu_of_rank(sc, j);
    for (int k = 0; k < p; ++k) {
      const StageModel m = stage_model(sc, gpu, k, p);
      const double own = slowdown.ends.empty() ? 1.0 : slowdown.ends[static_cast<std::size_t>(k)];
      layer[k][j] = slowdown.device[j] * m.layer;
      ends[k][j] = slowdown.device[j] * own * m.ends;
    }
  }
  auto stage_seconds = [&](const std::vector<int>& parts, const std::vector<int>& slot) {
    std::vector<double> out(p);
    for (int k = 0; k < p; ++k) out[k] = parts[k] * layer[k][slot[k]] + ends[k][slot[k]];
    return out;
  };
  auto spread = [](const std::vector<double>& t) {
    return *std::max_element(t.begin(), t.end()) / *std::min_element(t.begin(), t.end()) - 1;
  };
  auto worst = [](const std::vector<double>& t) { return *std::max_element(t.begin(), t.end()); };
  auto partition_for = [&](const std::vector<int>& slot) {
    std::vector<double> per(p), fixed(p);
    for (int k = 0; k < p; ++k) per[k] = layer[k][slot[k]], fixed[k] = ends[k][slot[k]];
    return partition_by(L, per, fixed);
  };

  Rebalance out;
  std::vector<int> identity(p);
  std::iota(identity.begin(), identity.end(), 0);
  std::vector<std::vector<int>> stage_of(p);  // one chunk per rank: rank r runs stage r
  for (int r = 0; r < p; ++r) stage_of[r] = {r};
  out.layers_before = partition_layers(sc, stage_of, p);
  out.seconds_before = stage_seconds(out.layers_before, identity);
  out.spread_before = spread(out.seconds_before);

  // Partition ⇄ assignment until neither changes; keep the best bottleneck seen.
  std::vector<int> slot = identity, parts = partition_for(identity);
  std::vector<int> best_slot = slot, best_parts = parts;
  const std::vector<int> identity_parts = parts;
  double best = worst(stage_seconds(parts, slot));
  for (int round = 1; round <= 2 * p; ++round) {
    out.rounds = round;
    std::vector<std::vector<double>> cost(p, std::vector<double>(p));
    for (int k = 0; k < p; ++k)
      for (int j = 0; j < p; ++j) cost[k][j] = parts[k] * layer[k][j] + ends[k][j];
    const std::vector<int> next_slot = bottleneck_assignment(cost);
    const std::vector<int> next_parts = partition_for(next_slot);
    if (next_slot == slot && next_parts == parts) break;
    slot = next_slot;
    parts = next_parts;
    const double w = worst(stage_seconds(parts, slot));
    if (w < best) best = w, best_slot = slot, best_parts = parts;
  }
  out.scenario = sc;
  if (best_slot != identity) {
    if (auto groups = reorder_groups(sc, best_slot)) {
      out.scenario.cluster.groups = *groups;
    } else {
      best_slot = identity;  // not expressible as a group order: stay in rank order
      best_parts = identity_parts;
    }
  }
  out.device_of_stage = best_slot;
  out.layers_after = best_parts;
  out.seconds_after = stage_seconds(best_parts, best_slot);
  out.spread_after = spread(out.seconds_after);
  out.scenario.parallel.layers_per_stage = best_parts;
  out.scenario.parallel.layers_per_stage_auto = false;
  return out;
}

}  // namespace tdpipe::planner
