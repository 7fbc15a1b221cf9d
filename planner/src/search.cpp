// search.cpp — enumerate layouts, bound them, plan the promising ones (search.hpp).
//
// The lower bound. In the analytic engine every compute op of a rank runs on that
// rank's one compute stream, one after another, for its cost-model time; an F of
// virtual stage j cannot start before the same micro-batch slice has gone forward
// through virtual stages 0 … j−1 (each F, and a SEND between two ranks); a backward of
// stage j is followed by the backwards of stages j−1 … 0 of the same slice. So for each
// rank r, with busy_r = m·Σ (F + B + W over its chunks and slices) + its optimizer step:
//   T ≥ fill_r + busy_r,  fill_r = min over its stages j and slices s of the forward
//                          chain through stages < j (F times and p2p transfers);
//   and for schedules whose backward is one fused BW op (gpipe, 1f1b, interleaved,
//   tdpipe), whose last op before the optimizer step is a BW:
//   T ≥ fill_r + busy_r − opt_r + drain_r + opt_0, drain_r the backward chain below
//       its first stage.
// And for the memory-bounded `auto` scheduler, whose rank r holds at most budget_r bytes
// of activations: an F of slice j adds act_rj bytes that stay until its B starts, and
// that B cannot start before the slice went forward through the stages after r and back
// (occ_rj: F there, every later stage's F and B, the transfers both ways). The live bytes
// are a function of the rank's op order alone, so they stay within the budget in the
// engine's timeline too, and ∫ live dt ≤ budget_r · (the rank's last B start):
//   T ≥ m · Σ_j act_rj · occ_rj / budget_r + opt_r.
// Collectives, contention and every wait beyond these are left out, so the bound never
// exceeds the engine's time (checked for every layout of small spaces in the tests).
#include "tdpipe/planner/search.hpp"

#include <algorithm>
#include <optional>
#include <chrono>
#include <limits>
#include <map>
#include <queue>
#include <thread>
#include <tuple>

#include <fmt/format.h>

#include "schedule_common.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/lowering.hpp"
#include "tdpipe/ir/scenario_check.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/cost_model.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/planner/generators.hpp"
#include "tdpipe/traces/metrics.hpp"

namespace tdpipe::planner {
namespace {

constexpr double kGiB = double(1u << 30);
constexpr double kInf = std::numeric_limits<double>::infinity();

bool sliced(const std::string& schedule) { return schedule == "tdpipe" || schedule == "auto"; }
bool fused_backward(const std::string& schedule) {
  return schedule == "gpipe" || schedule == "1f1b" || schedule == "interleaved" || schedule == "tdpipe";
}
/// Schedules whose op order depends on (p, m, v) only, not on costs.
bool fixed_order(const std::string& schedule) { return !sliced(schedule); }


/// Costs the bound needs, memoised across layouts: one layer and each end (embedding on
/// the first stage, head + loss on the last, both when there is one stage) per
/// (tensor-parallel shape, GPU, slice); partitions and slice cuts per layout shape.
class BoundCache {
 public:
  struct KindCosts {
    double f = 0, b = 0, w = 0;
  };
  struct SliceCosts {
    KindCosts layer, first, last, both, middle;
  };

  const SliceCosts& slice_costs(const ir::Scenario& sc, const ir::GpuSpec& gpu, int tokens, int prefix) {
    const auto key = std::make_tuple(shape_key(sc), gpu_key(gpu), tokens, prefix);
    auto it = slice_costs_.find(key);
    if (it != slice_costs_.end()) return it->second;
    // chunk_cost = layers · layer_cost + stage_ends_cost, exactly.
    auto seconds = [](const LayerCost& l) { return KindCosts{l.f.seconds, l.b.seconds, l.w.seconds}; };
    SliceCosts c;
    c.layer = seconds(layer_cost(sc, gpu, tokens, prefix));
    c.first = seconds(stage_ends_cost(sc, gpu, true, false, tokens, prefix));
    c.last = seconds(stage_ends_cost(sc, gpu, false, true, tokens, prefix));
    c.both = seconds(stage_ends_cost(sc, gpu, true, true, tokens, prefix));
    c.middle = seconds(stage_ends_cost(sc, gpu, false, false, tokens, prefix));
    return slice_costs_.emplace(key, c).first->second;
  }

  const std::vector<int>& partition(const ir::Scenario& sc, const std::string& schedule, int v) {
    const bool vshape = schedule == "zb-v";
    // The data-parallel degree moves GPUs only on a mixed cluster.
    const auto key = std::make_tuple(shape_key(sc), sc.parallel.pipeline, v, vshape,
                                     sc.cluster.groups.size() > 1 ? sc.parallel.data : 0);
    auto it = partitions_.find(key);
    if (it != partitions_.end()) return it->second;
    const int p = sc.parallel.pipeline;
    return partitions_.emplace(key, partition_layers(sc, detail::stage_placement(schedule, p, v), p * v))
        .first->second;
  }

  /// The least Σ over any cut on TeraPipe's grid of one layer's F+B+W (no cut's slices
  /// cost less; the ends are bounded by 0).
  double least_cut_layer(const ir::Scenario& sc, const ir::GpuSpec& gpu) {
    const auto key = std::make_tuple(shape_key(sc), gpu_key(gpu));
    auto it = least_cut_.find(key);
    if (it != least_cut_.end()) return it->second;
    const std::vector<int> at = slice_grid(sc.model.seq, kAutoSliceUnits);
    const int G = static_cast<int>(at.size()) - 1;
    std::vector<double> f(static_cast<std::size_t>(G) + 1, kInf);
    f[0] = 0;
    for (int b = 1; b <= G; ++b)
      for (int a = 0; a < b; ++a) {
        const LayerCost l = layer_cost(sc, gpu, at[b] - at[a], at[a]);
        f[b] = std::min(f[b], f[a] + l.f.seconds + l.b.seconds + l.w.seconds);
      }
    return least_cut_.emplace(key, f[G]).first->second;
  }

  /// Slice lengths of a plan of S slices (kAutoSlices: TeraPipe's) as build_plan cuts them.
  const std::vector<int>& cuts(const ir::Scenario& sc, int S) {
    // TeraPipe's cuts depend on p, m and the partition; on a mixed cluster rank 0's GPU
    // (whose costs cut equal slices) on where t, p and d put it.
    const bool mixed = sc.cluster.groups.size() > 1;
    const auto key = std::make_tuple(shape_key(sc), S, S == kAutoSlices || mixed ? sc.parallel.pipeline : 0,
                                     S == kAutoSlices ? sc.microbatches() : 0,
                                     S == kAutoSlices || mixed ? sc.parallel.data : 0, sc.parallel.layers_per_stage_auto,
                                     gpu_key(gpu_of_rank(sc, 0)));
    auto it = cuts_.find(key);
    if (it != cuts_.end()) return it->second;
    std::vector<int> c = S == kAutoSlices ? auto_slice_tokens(sc, kAutoSliceUnits) : solve_slices(sc, S);
    return cuts_.emplace(key, std::move(c)).first->second;
  }

  /// Peak count of units (micro-batch × chunk × slice) in flight on each rank of a
  /// fixed-order schedule: F adds one, B or BW frees one (W-held inputs not counted).
  const std::vector<int>& inflight(const std::string& schedule, int p, int m, int v) {
    const auto key = std::make_tuple(schedule, p, m, v);
    auto it = inflight_.find(key);
    if (it != inflight_.end()) return it->second;
    ScheduleParams params;
    params.stages = p;
    params.microbatches = m;
    params.chunks = v;
    const ir::Plan plan = make_schedule(schedule, params);
    std::vector<int> peak;
    for (const auto& ops : plan.ranks) peak.push_back(ir::peak_inflight(ops));
    return inflight_.emplace(key, std::move(peak)).first->second;
  }

 private:
  using Shape = std::tuple<int, int, int, bool>;
  static Shape shape_key(const ir::Scenario& sc) {
    return {sc.parallel.tensor, sc.parallel.micro_batch, static_cast<int>(sc.parallel.recompute),
            sc.parallel.sequence_parallel};
  }
  /// Every field of a GpuSpec the costs read.
  using GpuKey = std::tuple<std::string, double, double, double, double>;
  static GpuKey gpu_key(const ir::GpuSpec& g) {
    return {g.name, g.peak_flops, g.hbm_bytes, g.hbm_bytes_per_second, g.nvlink_bytes_per_second};
  }
  std::map<std::tuple<Shape, GpuKey, int, int>, SliceCosts> slice_costs_;
  std::map<std::tuple<Shape, int, int, bool, int>, std::vector<int>> partitions_;
  std::map<std::tuple<Shape, int, int, int, int, bool, GpuKey>, std::vector<int>> cuts_;
  std::map<std::tuple<std::string, int, int, int>, std::vector<int>> inflight_;
  std::map<std::tuple<Shape, GpuKey>, double> least_cut_;
};

/// What the bound and the memory prune know of a layout's plan.
struct Shape {
  int p = 1, v = 1, S = 1, m = 1;
  std::vector<std::vector<int>> stage_of;
  std::vector<int> layers;                 ///< per virtual stage
  std::vector<int> tokens, prefix;         ///< per slice
  std::vector<int> owner;                  ///< virtual stage → rank
  std::vector<ir::GpuSpec> gpu;            ///< per rank
  std::vector<double> params;              ///< per rank
  /// Slices auto, not cut yet: one "slice" whose F+B+W is the least any cut costs, no
  /// fill or drain (bound_of gives a rough bound).
  bool least_cut = false;
};

/// Decoder layers rank r holds.
int rank_layers(const Shape& s, int r) {
  int n = 0;
  for (int vs : s.stage_of[static_cast<std::size_t>(r)]) n += s.layers[static_cast<std::size_t>(vs)];
  return n;
}

Shape shape_of(const ir::Scenario& sc, const std::string& schedule, int slices, BoundCache& cache,
               bool cut = true) {
  Shape s;
  s.p = sc.parallel.pipeline;
  s.v = chunks_for(schedule, sc);
  s.m = sc.microbatches();
  s.stage_of = detail::stage_placement(schedule, s.p, s.v);
  const int VS = s.p * s.v;
  if (sc.parallel.layers_per_stage_auto) s.layers = cache.partition(sc, schedule, s.v);
  else if (!sc.parallel.layers_per_stage.empty()) s.layers = sc.parallel.layers_per_stage;
  else s.layers.assign(static_cast<std::size_t>(VS), sc.model.layers / VS);
  std::vector<int> cuts = {sc.model.seq};
  s.least_cut = sliced(schedule) && slices == kAutoSlices && !cut;
  if (sliced(schedule) && (slices > 1 || slices == kAutoSlices) && !s.least_cut) cuts = cache.cuts(sc, slices);
  s.S = static_cast<int>(cuts.size());
  for (int j = 0, acc = 0; j < s.S; ++j) {
    s.tokens.push_back(cuts[j]);
    s.prefix.push_back(acc);
    acc += cuts[j];
  }
  s.owner.assign(static_cast<std::size_t>(VS), 0);
  for (int r = 0; r < s.p; ++r)
    for (int vs : s.stage_of[r]) s.owner[vs] = r;
  for (int r = 0; r < s.p; ++r) {
    s.gpu.push_back(gpu_of_rank(sc, r));
    double params = 0;
    for (int vs : s.stage_of[r]) params += params_of_chunk(sc, vs, VS, s.layers[vs]);
    s.params.push_back(params);
  }
  return s;
}


/// `auto`'s memory bound on rank r (the argument at the top): m · Σ_j act_rj · occ_rj /
/// budget_r, with the budget as auto_costs sets it (from the same static memory) and a
/// 1 % margin over it; 0 for other schedules, slices not cut yet, or no budget to speak of.
double memory_area_seconds(const ir::Scenario& sc, const std::string& schedule, const Shape& s, int r,
                           const std::vector<double>& f, const std::vector<double>& b,
                           const std::vector<double>& hop) {
  if (schedule != "auto" || s.least_cut || s.v != 1 || sc.synthetic) return 0;
  const int VS = s.p, vs = r;
  double per_mb = 0, area = 0;
  for (int j = 0; j < s.S; ++j) {
    const double act = activation_bytes(sc, vs, VS, s.layers[vs], s.tokens[j], s.prefix[j]);
    double occ = f[vs * s.S + j];
    for (int k = vs + 1; k < VS; ++k) occ += f[k * s.S + j] + b[k * s.S + j];
    for (int k = vs; k + 1 < VS; ++k) occ += 2 * hop[k * s.S + j];
    per_mb += act;
    area += act * occ;
  }
  const double budget = auto_budget_bytes(
      sc, s.p, s.m, per_mb, s.gpu[r].hbm_bytes - static_memory(sc, s.params[r], rank_layers(s, r)).total_bytes());
  if (!(budget >= per_mb) || !(area > 0)) return 0;  // (build_plan refuses it, naming why)
  return s.m * area / (1.01 * budget);
}

TimeBound bound_of(const ir::Scenario& sc, const std::string& schedule, const Shape& s, BoundCache& cache) {
  const int VS = s.p * s.v;
  // Per virtual stage and slice: F, B, W seconds on the owner's GPU.
  std::vector<double> f(static_cast<std::size_t>(VS) * s.S), b(f.size()), bw(f.size()), all(f.size());
  for (int vs = 0; vs < VS; ++vs) {
    const ir::GpuSpec& gpu = s.gpu[s.owner[vs]];
    for (int j = 0; j < s.S; ++j) {
      const int n = s.layers[vs];
      if (s.least_cut) {  // slices not cut: the least any cut costs, no chain
        all[vs * s.S + j] = cache.least_cut_layer(sc, gpu) * n;
        continue;
      }
      const auto& c = cache.slice_costs(sc, gpu, s.tokens[j], s.prefix[j]);
      const auto& ends = VS == 1 ? c.both : vs == 0 ? c.first : vs == VS - 1 ? c.last : c.middle;
      const double F = c.layer.f * n + ends.f, B = c.layer.b * n + ends.b, W = c.layer.w * n + ends.w;
      f[vs * s.S + j] = F;
      b[vs * s.S + j] = B;
      bw[vs * s.S + j] = B + W;
      all[vs * s.S + j] = F + B + W;
    }
  }
  // Transfer of slice j between consecutive virtual stages on different ranks.
  ir::Plan probe = detail::plan_skeleton("probe", s.p, 1, s.v, s.S);
  probe.stage_of = s.stage_of;
  probe.data = sc.parallel.data;
  probe.scenario = sc;
  if (s.S > 1) probe.slice_tokens = s.tokens;
  probe.stage_layers = s.layers;
  const ir::LoweringOptions lowering = lowering_options(probe, sc);
  std::vector<double> hop(static_cast<std::size_t>(VS) * s.S, 0.0);  // [vs·S + j]: vs → vs+1
  for (int j = 0; j < s.S; ++j) {
    const auto bytes = lowering.p2p_bytes(detail::compute_op(ir::OpKind::F, 0, 0, j));
    for (int vs = 0; vs + 1 < VS && !s.least_cut; ++vs)
      if (s.owner[vs] != s.owner[vs + 1])
        hop[vs * s.S + j] = p2p_seconds(probe, s.owner[vs], s.owner[vs + 1], bytes);
  }
  // chain_f[j][k]: forward chain of slice j through stages < k; chain_b likewise backward.
  std::vector<std::vector<double>> chain_f(s.S, std::vector<double>(VS, 0.0)), chain_b = chain_f;
  for (int j = 0; j < s.S; ++j)
    for (int k = 1; k < VS; ++k) {
      chain_f[j][k] = chain_f[j][k - 1] + f[(k - 1) * s.S + j] + hop[(k - 1) * s.S + j];
      chain_b[j][k] = chain_b[j][k - 1] + bw[(k - 1) * s.S + j] + hop[(k - 1) * s.S + j];
    }
  // Data parallelism: a chunk's gradient buckets are reduced (one after another on the
  // DP stream) as its last backward finishes them — the last bucket no earlier than that
  // op's end (every bucket, without overlap_grad_reduce) — and the optimizer step waits
  // for them; with a sharded optimizer every bucket's all-gather follows the step; with
  // 1-bit Adam a bucket is its compression kernels and a ring of the packed bytes.
  double buckets = 0;  // the most on any chunk: each is rounded to whole ns by the engine
  const bool sharded = lowering.shard_optimizer;
  auto bucket_seconds = [&](int r, std::int64_t bytes) {
    if (sharded) return reduce_scatter_seconds(probe, r, bytes);
    if (const std::int64_t e = lowering.compress_element_bytes; e > 0) {  // 1-bit Adam, as lowering cuts it
      const std::int64_t elements = (bytes + e - 1) / e;
      return compressed_allreduce_seconds(probe, r, ir::compressed_bucket_bytes(elements, sc.parallel.data)) +
             (lowering.compress_seconds ? lowering.compress_seconds(r, elements) : 0.0);
    }
    return allreduce_seconds(probe, r, bytes);
  };
  std::vector<double> gather(static_cast<std::size_t>(s.p), 0.0);
  auto chunk_reduce = [&](int r, int c) {
    if (sc.parallel.data <= 1 || !lowering.grad_bytes) return 0.0;
    const std::int64_t bytes = lowering.grad_bytes(r, c), bucket = std::max<std::int64_t>(1, lowering.bucket_bytes);
    const std::int64_t whole = bytes / bucket, rest = bytes % bucket;
    buckets = std::max(buckets, double(whole + (rest > 0)));
    const double all = (whole > 0 ? double(whole) * bucket_seconds(r, bucket) : 0.0) +
                       (rest > 0 ? bucket_seconds(r, rest) : 0.0);
    if (sharded) gather[static_cast<std::size_t>(r)] += all;  // all-gather: reduce-scatter's volume
    if (!lowering.overlap_dp || bytes <= 0) return all;
    return bucket_seconds(r, rest > 0 ? rest : bucket);  // the last bucket (the chunk's first parameters)
  };
  std::vector<double> least_reduce(static_cast<std::size_t>(s.p), kInf);
  double reduce_vs0 = 0;  // the chunk of virtual stage 0, on rank 0
  for (int r = 0; r < s.p; ++r)
    for (int c = 0; c < int(s.stage_of[r].size()); ++c) {
      const double sec = chunk_reduce(r, c);
      least_reduce[r] = std::min(least_reduce[r], sec);
      if (s.stage_of[r][c] == 0) reduce_vs0 = sec;
    }
  // OPT as lowering prices it (a sharded optimizer steps 1/d of the parameters).
  auto opt_seconds = [&](int r) {
    return lowering.optimizer_seconds ? lowering.optimizer_seconds(r) : optimizer_seconds(sc, s.gpu[r], s.params[r]);
  };
  const double opt0 = opt_seconds(0) + gather[0];
  TimeBound out;
  for (int r = 0; r < s.p; ++r) {
    double compute = 0;
    int first = VS;
    for (int vs : s.stage_of[r]) {
      first = std::min(first, vs);
      for (int j = 0; j < s.S; ++j) compute += all[vs * s.S + j];
    }
    compute *= s.m;
    const double opt = opt_seconds(r);
    double fill = kInf, drain = kInf;
    for (int j = 0; j < s.S; ++j) {
      fill = std::min(fill, chain_f[j][first]);
      drain = std::min(drain, chain_b[j][first]);
    }
    double t = fill + compute + least_reduce[r] + opt + gather[static_cast<std::size_t>(r)];
    if (fused_backward(schedule) && r > 0) t = std::max(t, fill + compute + drain + reduce_vs0 + opt0);
    if (const double area = memory_area_seconds(sc, schedule, s, r, f, b, hop); area > 0) t = std::max(t, area + opt);
    out.seconds = std::max(out.seconds, t);
    out.compute_seconds = std::max(out.compute_seconds, compute + opt);
  }
  // The engine rounds each op to whole ns: allow that much per op (compute, transfers,
  // gradient buckets, optimizer).
  const double ops = double(s.m) * VS * s.S * 5 + 8.0 * s.p + 4 * buckets;
  out.seconds = std::max(0.0, out.seconds * (1 - 1e-9) - ops * 1e-9);
  return out;
}

double score_of(const Layout& l, const ir::Scenario& base, Objective obj, double seconds) {
  const double tokens = double(l.global_batch) * base.model.seq;
  switch (obj) {
    case Objective::Time: return seconds;
    case Objective::TokensPerSecond: return seconds > 0 ? -tokens / seconds : -kInf;
    case Objective::Cost: return double(l.gpus) * seconds / 3600.0 / (tokens / 1e6);
  }
  return seconds;
}

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) out.push_back(i);
  return out;
}

}  // namespace

Objective objective_from_string(const std::string& name) {
  if (name == "time") return Objective::Time;
  if (name == "tokens_per_s") return Objective::TokensPerSecond;
  if (name == "cost") return Objective::Cost;
  throw Error(fmt::format("--objective {}: expected time, tokens_per_s or cost", name));
}

const char* to_string(Objective o) {
  return o == Objective::Time ? "time" : o == Objective::TokensPerSecond ? "tokens_per_s" : "cost";
}

const char* to_string(Verdict v) {
  switch (v) {
    case Verdict::Ranked: return "ranked";
    case Verdict::NoFit: return "does-not-fit";
    case Verdict::Bounded: return "bounded";
    case Verdict::TooLarge: return "too-large";
    case Verdict::Failed: return "refused";
  }
  return "?";
}

std::string Layout::label() const {
  std::string s = fmt::format("t{} p{} d{} mb{}", tensor, pipeline, data, micro_batch);
  if (recompute != ir::Recompute::None) s += " rc=" + ir::recompute_name(recompute);
  if (sequence_parallel) s += " sp";
  s += " " + schedule;
  if (!budget.empty()) s += ":" + budget;
  if (schedule == "interleaved") s += fmt::format(" v{}", chunks);
  if (slices == kAutoSlices) s += " S=auto";
  else if (slices > 1) s += fmt::format(" S={}", slices);
  if (partition_auto) s += " part=auto";
  return s;
}

ir::Scenario apply_layout(const ir::Scenario& base, const Layout& l) {
  ir::Scenario sc = base;
  auto& par = sc.parallel;
  par.tensor = l.tensor;
  par.pipeline = l.pipeline;
  par.data = l.data;
  par.chunks = l.schedule == "interleaved" ? l.chunks : 1;  // zb-v's two chunks are its own
  par.micro_batch = l.micro_batch;
  par.global_batch = l.global_batch;
  par.recompute = l.recompute;
  par.sequence_parallel = l.sequence_parallel;
  par.tp_comm_overlap = base.parallel.tp_comm_overlap && l.sequence_parallel;  // it overlaps SP's collectives
  par.slices = l.slices > 1 ? l.slices : 1;
  par.slices_auto = l.slices == kAutoSlices;
  par.layers_per_stage.clear();
  par.layers_per_stage_auto = l.partition_auto;
  if (!l.budget.empty()) par.memory_budget = l.budget;
  sc.schedule = l.schedule;
  if (sc.cluster.groups.size() == 1 && l.gpus != sc.cluster.gpus()) {
    if (l.gpus < sc.cluster.gpus_per_node) {
      sc.cluster.gpus_per_node = l.gpus;
      sc.cluster.groups[0].nodes = 1;
    } else {
      sc.cluster.groups[0].nodes = l.gpus / sc.cluster.gpus_per_node;
    }
  }
  return sc;
}

TimeBound iteration_lower_bound(const ir::Scenario& scenario, const std::string& schedule, int slices) {
  BoundCache cache;
  const int S = slices != 0 ? slices : scenario.parallel.slices_auto ? kAutoSlices : scenario.parallel.slices;
  return bound_of(scenario, schedule, shape_of(scenario, schedule, S, cache), cache);
}

std::vector<Candidate> enumerate_layouts(const ir::Scenario& base, const SearchOptions& o) {
  if (base.synthetic)
    throw Error(fmt::format("{}: search needs a model and a cluster; a synthetic scenario has neither", base.name));
  const auto& cl = base.cluster;
  const bool homogeneous = cl.groups.size() == 1;
  const int gpn = cl.gpus_per_node;
  std::vector<int> gpu_counts;
  const int N = o.gpus > 0 ? o.gpus : cl.gpus();
  if (o.gpus > 0 && !homogeneous)
    throw Error(fmt::format("--gpus {}: {} mixes node groups; search it on its own cluster (leave out --gpus)",
                            o.gpus, base.name));
  if (o.gpus > 0 && !(o.gpus % gpn == 0 || gpn % o.gpus == 0))
    throw Error(fmt::format("--gpus {}: expected a multiple of cluster.gpus_per_node ({}) or a divisor of it",
                            o.gpus, gpn));
  gpu_counts.push_back(N);
  if (o.objective == Objective::Cost && homogeneous)
    for (int g = N / 2; g >= gpn && N % g == 0 && g % gpn == 0; g /= 2) gpu_counts.push_back(g);
  std::vector<int> batches = o.global_batches;
  if (batches.empty()) batches.push_back(base.parallel.global_batch);
  if (batches.size() > 1 && o.objective == Objective::Time)
    throw Error("--global-batch: several batches only compare by tokens_per_s or cost (a smaller batch "
                "always has a shorter iteration); give one, or --objective tokens_per_s");
  for (int b : batches)
    if (b < 1) throw Error(fmt::format("--global-batch {}: expected a positive integer", b));
  std::vector<std::string> schedules = o.schedules.empty() ? schedule_names() : o.schedules;
  for (const auto& s : schedules)
    if (std::find(schedule_names().begin(), schedule_names().end(), s) == schedule_names().end())
      throw Error(fmt::format("--schedules: unknown schedule {}", s));
  auto wanted = [&](const char* name) { return std::find(schedules.begin(), schedules.end(), name) != schedules.end(); };

  const int L = base.model.layers;
  std::vector<ir::Recompute> recomputes = o.recomputes;
  if (recomputes.empty()) {
    recomputes = {ir::Recompute::None, ir::Recompute::Full};
    if (base.model.attention != "flash") recomputes.insert(recomputes.begin() + 1, ir::Recompute::Selective);
  }
  std::vector<bool> sp_settings;
  if (o.sequence_parallel != SearchOptions::Toggle::On) sp_settings.push_back(false);
  if (o.sequence_parallel != SearchOptions::Toggle::Off) sp_settings.push_back(true);

  BoundCache cache;
  std::vector<Candidate> out;
  for (int G : gpu_counts)
    for (int B : batches)
      for (int t : divisors(std::min(G, gpn))) {
        if (gpn % t != 0) continue;
        for (int p : divisors(G / t)) {
          if (p > L) break;
          const int d = G / (t * p);
          for (int mb = 1; mb <= o.max_micro_batch; mb *= 2) {
            if (B % (mb * d) != 0) continue;
            const int m = B / (mb * d);
            for (ir::Recompute rc : recomputes)
              for (bool sp : sp_settings) {
                if (sp && t == 1) continue;
                // Schedule variants (schedule, v, S, budget).
                struct Variant {
                  std::string schedule;
                  int v, S;
                  std::string budget;
                };
                std::vector<Variant> variants;
                if (p == 1) {
                  if (wanted("1f1b")) variants.push_back({"1f1b", 1, 1, ""});
                } else {
                  for (const char* s : {"gpipe", "1f1b", "zb-h1", "zb-h2"})
                    if (wanted(s)) variants.push_back({s, 1, 1, ""});
                  if (wanted("zb-v") && 2 * p <= L) variants.push_back({"zb-v", 2, 1, ""});
                  if (wanted("interleaved") && m % p == 0)
                    for (int v = 2; v <= o.max_chunks && p * v <= L; ++v) variants.push_back({"interleaved", v, 1, ""});
                  std::vector<int> cuts;
                  for (int S : o.slice_counts)
                    if (S > 1 && S <= base.model.seq) cuts.push_back(S);
                  if (o.auto_slices) cuts.push_back(kAutoSlices);
                  if (wanted("tdpipe"))
                    for (int S : cuts) variants.push_back({"tdpipe", 1, S, ""});
                  if (wanted("auto")) {
                    for (const char* b : {"1f1b", "2x1f1b", "max"}) variants.push_back({"auto", 1, 1, b});
                    for (int S : cuts) variants.push_back({"auto", 1, S, "max"});
                  }
                }
                for (const Variant& var : variants)
                  for (bool part : {false, true}) {
                    const int VS = p * var.v;
                    if (!part && L % VS != 0) continue;
                    if (part && VS == 1) continue;
                    Candidate c;
                    Layout& l = c.layout;
                    l.gpus = G, l.tensor = t, l.pipeline = p, l.data = d, l.chunks = var.v;
                    l.micro_batch = mb, l.global_batch = B, l.recompute = rc, l.sequence_parallel = sp;
                    l.schedule = var.schedule, l.slices = var.S, l.budget = var.budget, l.partition_auto = part;
                    const ir::Scenario sc = apply_layout(base, l);
                    if (auto problem = ir::find_problem(sc)) {
                      if (problem->field == "parallel.tensor" || problem->field == "parallel") continue;  // not a layout of this model
                      c.verdict = Verdict::Failed;
                      c.reason = fmt::format("refused: {}: {}", problem->field, problem->what);
                      out.push_back(std::move(c));
                      continue;
                    }
                    try {
                      // No partition puts less than the average on the fullest rank: refuse
                      // before partitioning when even the average cannot fit.
                      const double total = VS == 1 ? params_of_chunk(sc, 0, 1, L)
                                                   : params_of_chunk(sc, 0, 2, L) + params_of_chunk(sc, 1, 2, 0);
                      const double smallest_hbm = gpu_of_rank(sc, 0).hbm_bytes;
                      // (Under parameter offload a rank's memory is not linear in its
                      // layers — two are on the device however many it holds — so the
                      // average bounds nothing; the per-rank check below decides.)
                      const double average = static_memory(sc, total / p, L / p).total_bytes();
                      if (homogeneous && !sc.parallel.offload() && average > smallest_hbm) {
                        c.static_bytes = average;
                        c.hbm_bytes = smallest_hbm;
                        c.verdict = Verdict::NoFit;
                        c.reason = fmt::format("does not fit: weights, gradients and optimizer state alone need "
                                               "{:.1f} GiB per GPU on average, of {:.1f} GiB",
                                               c.static_bytes / kGiB, c.hbm_bytes / kGiB);
                        out.push_back(std::move(c));
                        continue;
                      }
                      const Shape s = shape_of(sc, l.schedule, l.slices, cache, /*cut=*/false);
                      c.rough_bound = s.least_cut;
                      // The auto partition may equal the even split: the same plan, listed once.
                      if (part && L % VS == 0 && s.layers == std::vector<int>(VS, L / VS)) continue;
                      double worst = 0;
                      for (int r = 0; r < s.p; ++r) {
                        const double need = static_memory(sc, s.params[r], rank_layers(s, r)).total_bytes();
                        c.static_bytes = std::max(c.static_bytes, need);
                        if (need / s.gpu[r].hbm_bytes > worst) {
                          worst = need / s.gpu[r].hbm_bytes;
                          c.hbm_bytes = s.gpu[r].hbm_bytes;
                        }
                      }
                      if (worst > 1) {
                        c.verdict = Verdict::NoFit;
                        c.reason = fmt::format("does not fit: weights, gradients and optimizer state alone need "
                                               "{:.1f} GiB of {:.1f} GiB",
                                               c.static_bytes / kGiB, c.hbm_bytes / kGiB);
                      } else {
                        const TimeBound tb = bound_of(sc, l.schedule, s, cache);
                        c.bound_seconds = tb.seconds;
                        c.bound_compute_seconds = tb.compute_seconds;
                      }
                    } catch (const Error& e) {
                      c.verdict = Verdict::Failed;
                      c.reason = fmt::format("refused: {}", e.what());
                    }
                    out.push_back(std::move(c));
                  }
              }
          }
        }
      }
  return out;
}

namespace {

/// Activation memory no plan of this layout can go below, on the fullest rank: the
/// schedule's peak count of units in flight (fixed-order schedules; one unit otherwise)
/// times the smallest unit the rank holds. nullopt when every rank fits.
std::optional<std::string> activation_prune(const ir::Scenario& sc, const Layout& l, const Shape& s,
                                            BoundCache& cache) {
  const int VS = s.p * s.v;
  std::vector<int> count(static_cast<std::size_t>(s.p), 1);
  if (fixed_order(l.schedule)) count = cache.inflight(l.schedule, s.p, s.m, s.v);
  for (int r = 0; r < s.p; ++r) {
    double unit = kInf;
    for (int vs : s.stage_of[r])
      for (int j = 0; j < s.S; ++j)
        unit = std::min(unit, activation_bytes(sc, vs, VS, s.layers[vs], s.tokens[j], s.prefix[j]));
    const double need = static_memory(sc, s.params[r], rank_layers(s, r)).total_bytes() + count[r] * unit;
    if (need > s.gpu[r].hbm_bytes)
      return fmt::format("does not fit: needs at least {:.1f} GiB of {:.1f} GiB on rank {} ({} micro-batch "
                         "unit(s) of activations in flight)",
                         need / kGiB, s.gpu[r].hbm_bytes / kGiB, r, count[r]);
  }
  return std::nullopt;
}

}  // namespace

namespace {

void evaluate_with(const ir::Scenario& base, Candidate& c, const SearchOptions& o, BoundCache& cache) {
  const Layout& l = c.layout;
  const ir::Scenario sc = apply_layout(base, l);
  try {
    // Before cutting TeraPipe's slices, the plan must fit max_ops with one slice.
    if (estimate_ops(sc, l.schedule, sliced(l.schedule) && l.slices == kAutoSlices ? 1 : l.plan_slices()) >
        o.max_ops) {
      c.verdict = Verdict::TooLarge;
      c.reason = fmt::format("too large: more than {} ops (--max-ops)", o.max_ops);
      return;
    }
    const Shape s = shape_of(sc, l.schedule, l.slices, cache);  // with the slices cut
    if (auto why = activation_prune(sc, l, s, cache)) {
      c.verdict = Verdict::NoFit;
      c.reason = *why;
      return;
    }
    if (estimate_ops(sc, l.schedule, sliced(l.schedule) ? s.S : 0) > o.max_ops) {
      c.verdict = Verdict::TooLarge;
      c.reason = fmt::format("too large: more than {} ops (--max-ops)", o.max_ops);
      return;
    }
    const BuiltPlan built = build_plan(sc, l.schedule, l.plan_slices(), o.max_ops);
    const traces::Trace trace = evaluate(built.lowered);
    const traces::Metrics metrics = traces::compute_metrics(trace);
    c.planned = true;
    c.iteration_seconds = double(metrics.iteration_ns) * 1e-9;
    c.tokens_per_second = tokens_per_second(sc, c.iteration_seconds);
    c.mfu = mfu(sc, c.iteration_seconds);
    // Peak memory per GPU and the verdict, as report::make_report gives them.
    std::vector<double> peak;
    std::optional<std::string> no_fit;
    if (sc.synthetic) {
      for (const auto& rm : built.report.ranks) peak.push_back(rm.peak_activation_bytes);
    } else {
      const auto memory = memory_per_rank(built.lowered, sc);
      for (const auto& m : memory) peak.push_back(m.total_bytes());
      no_fit = check_fits(memory, sc);
    }
    int busiest = 0;
    for (int r = 0; r < int(metrics.ranks.size()); ++r)
      if (metrics.ranks[r].compute_ns > metrics.ranks[busiest].compute_ns) busiest = r;
    // On the busiest rank: compute, data moving while it does not compute (a RECV's span
    // is mostly waiting for the peer: that is bubble, not communication), the rest idle.
    std::vector<traces::TimeSpan> compute, moving;
    for (const auto& e : trace.events) {
      if (e.rank != busiest || !e.kind) continue;
      if (ir::is_compute(*e.kind)) compute.emplace_back(e.start_ns, e.end_ns());
      else if (*e.kind != ir::OpKind::RECV) moving.emplace_back(e.start_ns, e.end_ns());
    }
    const traces::BusyUnion busy = traces::busy_union(std::move(compute), std::move(moving));
    c.compute_seconds = double(busy.compute_ns) * 1e-9;
    c.comm_seconds = double(busy.exposed_comm_ns()) * 1e-9;
    c.bubble_seconds = std::max(0.0, c.iteration_seconds - c.compute_seconds - c.comm_seconds);
    double worst = -1;
    for (int r = 0; r < int(peak.size()); ++r) {
      const double have = gpu_of_rank(sc, r).hbm_bytes;
      const double need = peak[r];
      if (need / have > worst) worst = need / have, c.peak_bytes = need, c.hbm_bytes = have;
    }
    c.score = score_of(l, base, o.objective, c.iteration_seconds);
    if (no_fit) {
      c.verdict = Verdict::NoFit;
      c.reason = *no_fit;
    } else {
      c.verdict = Verdict::Ranked;
    }
  } catch (const Error& e) {
    c.verdict = Verdict::Failed;
    c.reason = fmt::format("refused: {}", e.what());
  } catch (const std::exception& e) {  // e.g. memory: the layout fails, the search goes on
    c.verdict = Verdict::Failed;
    c.reason = fmt::format("refused: internal error: {}", e.what());
  }
}

/// The bound of a candidate whose slices were not cut yet, with the cuts made.
void refine_bound(const ir::Scenario& base, Candidate& c, BoundCache& cache) {
  c.rough_bound = false;
  try {
    const ir::Scenario sc = apply_layout(base, c.layout);
    const TimeBound tb = bound_of(sc, c.layout.schedule, shape_of(sc, c.layout.schedule, c.layout.slices, cache), cache);
    c.bound_seconds = tb.seconds;
    c.bound_compute_seconds = tb.compute_seconds;
  } catch (const Error& e) {
    c.verdict = Verdict::Failed;
    c.reason = fmt::format("refused: {}", e.what());
  }
}

}  // namespace

void evaluate_candidate(const ir::Scenario& base, Candidate& c, const SearchOptions& o) {
  BoundCache cache;
  evaluate_with(base, c, o, cache);
}

SearchResult search_layouts(const ir::Scenario& base, const SearchOptions& o, int worker, int workers,
                            const Exchange& exchange) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.top < 1) throw Error(fmt::format("--top {}: expected at least 1", o.top));
  if (workers < 1 || worker < 0 || worker >= workers || (workers > 1 && !exchange))
    throw Error(fmt::format("search: worker {} of {} (several workers need an exchange)", worker, workers));
  // Each thread holds one plan at a time (up to max_ops ops, GBs): at most 4 by default.
  const int threads =
      std::max(1, o.threads > 0 ? o.threads : std::min(4, int(std::thread::hardware_concurrency())));
  SearchResult res;
  res.candidates = enumerate_layouts(base, o);
  auto& cands = res.candidates;
  res.considered = static_cast<int>(cands.size());
  auto bound_score = [&](int i) { return score_of(cands[i].layout, base, o.objective, cands[i].bound_seconds); };
  // Best first by bound (ties: enumeration order): a min-heap of (score, index).
  using Entry = std::pair<double, int>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
  for (int i = 0; i < int(cands.size()); ++i)
    if (cands[i].verdict == Verdict::Bounded) queue.emplace(cands[i].bound_score = bound_score(i), i);
    else if (cands[i].verdict == Verdict::NoFit) ++res.pruned_memory;
  const std::size_t total = cands.size();
  std::size_t decided = total - queue.size();

  std::vector<double> best;  // scores of Ranked candidates, sorted, at most K
  auto kth = [&] { return int(best.size()) < o.top ? kInf : best.back(); };
  std::vector<BoundCache> caches(static_cast<std::size_t>(threads));  // one per thread, for this search
  for (;;) {
    // The next round: up to workers × threads candidates whose exact bound can still
    // beat the K-th best; rough bounds are made exact on the way (on every worker alike).
    std::vector<int> round;
    while (int(round.size()) < workers * threads && !queue.empty() && queue.top().first < kth()) {
      const int i = queue.top().second;
      queue.pop();
      if (cands[i].rough_bound) {
        refine_bound(base, cands[i], caches[0]);
        if (cands[i].verdict == Verdict::Bounded) queue.emplace(cands[i].bound_score = bound_score(i), i);
        else ++decided;
        continue;
      }
      round.push_back(i);
    }
    if (round.empty()) break;
    std::vector<int> mine;
    for (std::size_t k = 0; k < round.size(); ++k)
      if (int(k) % workers == worker) mine.push_back(round[k]);
    std::vector<std::thread> pool;
    for (int th = 1; th < threads && th < int(mine.size()); ++th)
      pool.emplace_back([&, th] {
        for (std::size_t k = th; k < mine.size(); k += threads) evaluate_with(base, cands[mine[k]], o, caches[th]);
      });
    for (std::size_t k = 0; k < mine.size(); k += threads) evaluate_with(base, cands[mine[k]], o, caches[0]);
    for (auto& t : pool) t.join();
    if (exchange) exchange(cands, mine);
    for (int i : round) {
      const Candidate& c = cands[i];
      ++decided;
      if (c.planned) ++res.planned;
      else if (c.verdict == Verdict::NoFit) ++res.pruned_memory;
      if (c.verdict != Verdict::Ranked) continue;
      best.insert(std::upper_bound(best.begin(), best.end(), c.score), c.score);
      if (int(best.size()) > o.top) best.pop_back();
    }
    if (o.progress) o.progress(double(decided) / double(std::max<std::size_t>(1, total)), res.planned);
  }
  res.pruned_bound = static_cast<int>(queue.size());
  for (int i = 0; i < int(cands.size()); ++i)
    if (cands[i].verdict == Verdict::Ranked) res.top.push_back(i);
  std::stable_sort(res.top.begin(), res.top.end(), [&](int a, int b) { return cands[a].score < cands[b].score; });
  if (int(res.top.size()) > o.top) res.top.resize(static_cast<std::size_t>(o.top));
  rank_losers(res, o);
  if (o.progress) o.progress(1.0, res.planned);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

void rank_losers(SearchResult& res, const SearchOptions& o) {
  if (res.top.empty()) return;
  const Candidate& w = res.candidates[res.top.front()];
  for (int i = 0; i < int(res.candidates.size()); ++i) {
    Candidate& c = res.candidates[i];
    if (i == res.top.front()) {
      c.reason = "best";
      continue;
    }
    if (c.verdict == Verdict::Ranked) {
      const double d = c.score - w.score;
      if (o.objective == Objective::Cost) {
        c.reason = fmt::format("cost: {:+.4f} GPU-hours per 1M tokens ({:+.1f} %)", d, 100 * d / w.score);
      } else if (o.objective == Objective::TokensPerSecond) {
        c.reason = fmt::format("tokens_per_s: {:+.0f} ({:+.1f} %)", -d, 100 * d / w.score);
      } else {
        // Where the extra time is, on each one's busiest rank.
        const double dc = c.compute_seconds - w.compute_seconds, db = c.bubble_seconds - w.bubble_seconds,
                     dm = c.comm_seconds - w.comm_seconds;
        const double most = std::max({dc, db, dm});
        const char* part = most == dc ? "compute" : most == db ? "bubble" : "comm";
        c.reason = fmt::format("{}: {:+.3f} s (iteration {:+.1f} %)", part, most, 100 * d / w.score);
      }
    } else if (c.verdict == Verdict::Bounded) {
      c.reason = fmt::format("bound: {} {:.3f} s ({}), no better than the top {}",
                             c.rough_bound ? "before its slices are cut, at least" : "at least", c.bound_seconds,
                             c.bound_compute_seconds >= w.iteration_seconds
                                 ? "its compute alone exceeds the best's iteration"
                                 : "compute, pipeline fill and drain, gradient reduce",
                             int(res.top.size()));
    }
  }
}

}  // namespace tdpipe::planner
