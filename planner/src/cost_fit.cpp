// cost_fit.cpp — terms of an op, the least-change fit of their coefficients, and
// pricing a plan with a fitted model (see cost_fit.hpp).
#include "tdpipe/planner/cost_fit.hpp"
#include "tdpipe/planner/serving_cost.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>

#include <Eigen/Dense>
#include <fmt/format.h>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/planner/cost_model.hpp"

namespace tdpipe::planner {
namespace {

using ir::OpKind;

enum Term { kOp, kLayer, kGemm, kAttention, kElementwise, kComm, kEmbedding, kHead, kOptimizer };

// GEMM calls a layer's op of `kind` makes in the cost model: four with weights (QKV,
// projection, MLP up, down) per pass, and standard attention's batched score and value
// products (two forward, four backward); B repeats the forward's under full recompute and
// the attention products under selective recompute.
double gemm_calls_per_layer(OpKind kind, const ir::Scenario& sc) {
  const bool flash = sc.model.attention == "flash";
  const double f = 4 + (flash ? 0 : 2);
  double b = 4 + (flash ? 0 : 4);
  if (sc.parallel.recompute == ir::Recompute::Full) b += f;
  if (sc.parallel.recompute == ir::Recompute::Selective && !flash) b += 2;
  switch (kind) {
    case OpKind::F: return f;
    case OpKind::B: return b;
    case OpKind::W: return 4;
    case OpKind::BW: return b + 4;
    default: return 0;
  }
}

// The cost model itself, at its large-size limits: each part at the documented efficiency
// of its kind of kernel (GEMMs — the LM head included — at gemm_max, the attention core at
// gemm_max or, fused, at flash_attention, streaming kernels at hbm; the attention and head
// terms also carry a few bytes — softmax, final LayerNorm, loss — that chunk_cost streams
// at hbm), collectives and the optimizer step as priced, and per layer the fixed part of
// gemm_efficiency's saturation curve: a GEMM of t seconds at peak takes
// (t + gemm_half_seconds) / gemm_max, so each call adds gemm_half_seconds / gemm_max.
double prior(int term, const ir::Scenario& sc, OpKind kind) {
  const Efficiencies& e = default_efficiencies();
  const double slow = 1 / sc.cluster.compute_efficiency;  // a stack profile's scale of every kernel
  switch (term) {
    case kOp: return 0;
    case kLayer: return slow * gemm_calls_per_layer(kind, sc) * e.gemm_half_seconds / e.gemm_max;
    case kAttention: return slow / (sc.model.attention == "flash" ? e.flash_attention : e.gemm_max);
    case kGemm:
    case kHead: return slow / e.gemm_max;
    case kElementwise:
    case kEmbedding: return slow / e.hbm;
    default: return 1;  // collectives and the optimizer step: chunk_cost's own seconds
  }
}

// Slice `slice`'s (tokens, prefix) in `plan` (the whole sequence without slicing).
std::pair<int, int> slice_shape(const ir::Plan& plan, int slice) {
  const int seq = plan.scenario.model.seq;
  if (plan.slices <= 1 || plan.slice_tokens.empty()) return {seq, 0};
  if (slice < 0 || slice >= static_cast<int>(plan.slice_tokens.size()))
    throw Error(fmt::format("cost terms: slice {} outside the plan's {} slices", slice, plan.slice_tokens.size()));
  int prefix = 0;
  for (int j = 0; j < slice; ++j) prefix += plan.slice_tokens[static_cast<std::size_t>(j)];
  return {plan.slice_tokens[static_cast<std::size_t>(slice)], prefix};
}

// The chunk's layers: plan.stage_layers, or the even split a plan without them has.
int chunk_layers_of(const ir::Plan& plan, int virtual_stage) {
  const auto [a, b] = ir::layer_range(plan.stage_layers, plan.scenario.model.layers, virtual_stage,
                                      plan.virtual_stages());
  return b - a;
}

}  // namespace

CostTerms cost_model_coefficients(const ir::Scenario& scenario, OpKind kind) {
  CostTerms c{};
  for (int i = 0; i < traces::kCostTermCount; ++i) c[static_cast<std::size_t>(i)] = prior(i, scenario, kind);
  return c;
}

namespace {

/// `t` with the layer count and the parts of an op's work filled in.
CostTerms with_parts(CostTerms t, int layers, const CostParts& p) {
  t[kLayer] = layers;
  t[kGemm] = p.gemm;
  t[kAttention] = p.attention;
  t[kElementwise] = p.elementwise;
  t[kComm] = p.comm;
  t[kEmbedding] = p.embedding;
  t[kHead] = p.head;
  return t;
}

}  // namespace

CostTerms op_terms(const ir::Plan& plan, int rank, const ir::Op& op) {
  const ir::Scenario& sc = plan.scenario;
  if (sc.synthetic)
    throw Error(fmt::format("scenario '{}' is synthetic (its op times are given): a fitted cost model prices "
                            "ops from the model's shapes, which it has none of", sc.name));
  if (rank < 0 || rank >= plan.num_ranks() || rank >= static_cast<int>(plan.stage_of.size()))
    throw Error(fmt::format("cost terms: rank {} outside the plan's {} ranks", rank, plan.num_ranks()));
  const std::vector<int>& chunks = plan.stage_of[static_cast<std::size_t>(rank)];
  const ir::GpuSpec gpu = gpu_of_rank(sc, rank);
  const int vstages = plan.virtual_stages();
  CostTerms t{};
  t[kOp] = 1;
  if (op.kind == OpKind::OPT) {
    double params = 0;
    for (int vs : chunks) params += params_of_chunk(sc, vs, vstages, chunk_layers_of(plan, vs));
    t[kOptimizer] = optimizer_seconds(sc, gpu, params);
    return t;
  }
  if (!ir::is_compute(op.kind))
    throw Error(fmt::format("cost terms: {} is not a compute op", ir::to_string(op.kind)));
  if (ir::is_serving(op.kind)) {
    if (!plan.serve || op.mb < 0 || op.mb >= static_cast<int>(plan.serve->batches.size()))
      throw Error(fmt::format("cost terms: {} names batch {}, which the plan's serving table does not have",
                              ir::to_string(op.kind), op.mb));
    const ServingCost cost(sc, plan.num_ranks());
    return with_parts(t, cost.layers(rank),
                      cost.batch_parts(rank, plan.serve->batches[static_cast<std::size_t>(op.mb)].items));
  }
  if (op.chunk < 0 || op.chunk >= static_cast<int>(chunks.size()))
    throw Error(fmt::format("cost terms: rank {} has no chunk {}", rank, op.chunk));
  const int vs = chunks[static_cast<std::size_t>(op.chunk)];
  const int layers = chunk_layers_of(plan, vs);
  const auto [tokens, prefix] = slice_shape(plan, op.slice);
  return with_parts(t, layers, chunk_cost_parts(sc, gpu, op.kind, vs, vstages, layers, tokens, prefix));
}

double fitted_seconds(const traces::FittedCostModel& model, OpKind kind, const CostTerms& terms) {
  const auto it = model.coefficients.find(kind);
  if (it == model.coefficients.end()) return -1;
  double s = 0;
  for (int i = 0; i < traces::kCostTermCount; ++i) s += it->second.at(static_cast<std::size_t>(i)) * terms[i];
  return s;
}

namespace {

struct Row {
  CostTerms x;
  double y = 0, weight = 0;
};

// Least change to the cost model (see the banner) for one kind's rows. Rows are weighted
// by their samples in absolute seconds: an iteration is a sum of op times, so an op's
// error counts by its length and by how often it runs.
std::vector<double> fit_kind(const std::vector<Row>& rows, const ir::Scenario& sc, OpKind kind) {
  const int n = traces::kCostTermCount;
  auto prior = [&sc, kind](int term) { return planner::prior(term, sc, kind); };
  std::vector<double> c(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j) c[static_cast<std::size_t>(j)] = prior(j);
  std::vector<int> active;
  for (int j = 0; j < n; ++j) {
    double mass = 0;
    for (const Row& r : rows) mass += std::abs(r.x[j]);
    if (mass > 0) active.push_back(j);
  }
  while (!active.empty()) {
    const auto m = static_cast<Eigen::Index>(rows.size());
    const auto k = static_cast<Eigen::Index>(active.size());
    Eigen::MatrixXd a(m, k);
    Eigen::VectorXd b(m), scale(k);
    for (Eigen::Index i = 0; i < m; ++i) {
      const Row& r = rows[static_cast<std::size_t>(i)];
      const double w = std::sqrt(r.weight);
      double rest = r.y;
      for (int j = 0; j < n; ++j) rest -= (std::find(active.begin(), active.end(), j) != active.end()
                                               ? prior(j) : c[static_cast<std::size_t>(j)]) * r.x[j];
      b(i) = w * rest;
      for (Eigen::Index q = 0; q < k; ++q) a(i, q) = w * r.x[active[static_cast<std::size_t>(q)]];
    }
    for (Eigen::Index q = 0; q < k; ++q) {
      scale(q) = a.col(q).norm();
      a.col(q) /= scale(q);
    }
    // Directions the probes barely exercise (pivots under 1e-3 of the largest, columns
    // scaled to unit norm; e.g. GEMM and element-wise work, both ∝ tokens × layers for one
    // model shape) are left out of the solution: minimum norm shares their change instead
    // of opposing them.
    Eigen::CompleteOrthogonalDecomposition<Eigen::MatrixXd> cod;
    cod.setThreshold(1e-3);
    cod.compute(a);
    const Eigen::VectorXd z = cod.solve(b);
    // The most negative coefficient by its weight in the fit (coefficient × column norm:
    // terms differ in units), pinned first.
    int worst = -1;
    double worst_weight = 0;
    for (Eigen::Index q = 0; q < k; ++q) {
      const int j = active[static_cast<std::size_t>(q)];
      c[static_cast<std::size_t>(j)] = prior(j) + z(q) / scale(q);
      const double weight = c[static_cast<std::size_t>(j)] * scale(q);
      if (weight < worst_weight) worst = j, worst_weight = weight;
    }
    if (worst < 0) break;
    // A negative speed or fixed cost is no physics: pin it at 0 and refit the others.
    c[static_cast<std::size_t>(worst)] = 0;
    active.erase(std::find(active.begin(), active.end(), worst));
  }
  return c;
}

}  // namespace

CostFit fit_cost_model(const std::vector<MeasuredRun>& runs) {
  std::map<OpKind, std::vector<Row>> rows;
  CostFit fit;
  for (const MeasuredRun& run : runs) {
    const ir::Plan& plan = *run.plan;
    // One GPU (preset) for every rank of every probe: its peak rates are the terms' units.
    for (int r = 0; r < plan.num_ranks(); ++r) {
      const std::string gpu = gpu_of_rank(plan.scenario, r).name;
      if (fit.model.gpu.empty()) fit.model.gpu = gpu;
      if (gpu != fit.model.gpu)
        throw Error(fmt::format("cost fit: the probes run on GPUs '{}' and '{}': a fitted model describes one "
                                "machine; calibrate each kind of GPU on its own", fit.model.gpu, gpu));
    }
    const std::string layout = fmt::format("{} v={} S={}", plan.schedule, plan.chunks, std::max(1, plan.slices));
    for (const traces::ProfileOp& g : run.profile->ops) {
      if (g.samples <= 0 || !(g.seconds > 0)) continue;
      // A rank and chunk that run this virtual stage (OPT: filed under the rank's first chunk).
      std::optional<std::pair<int, int>> where;
      for (int r = 0; r < static_cast<int>(plan.stage_of.size()) && !where; ++r)
        for (int c = 0; c < static_cast<int>(plan.stage_of[static_cast<std::size_t>(r)].size()); ++c)
          if (plan.stage_of[static_cast<std::size_t>(r)][static_cast<std::size_t>(c)] == g.virtual_stage &&
              (g.kind != OpKind::OPT || c == 0)) {
            where = {r, c};
            break;
          }
      if (!where)
        throw Error(fmt::format("cost fit: {}: measured {} on virtual stage {}, which the plan does not have",
                                layout, ir::to_string(g.kind), g.virtual_stage));
      ir::Op op;
      op.kind = g.kind;
      op.chunk = where->second;
      op.slice = std::max(0, g.slice);
      rows[g.kind].push_back(Row{op_terms(plan, where->first, op), g.seconds, static_cast<double>(g.samples)});
      fit.points.push_back(FitPoint{layout, g.kind, g.virtual_stage, std::max(0, g.slice), g.samples, g.seconds, 0});
    }
  }
  if (rows.empty())
    throw Error(fmt::format("cost fit: the runs measured no compute op with samples ({} run(s) given)", runs.size()));
  for (const auto& [kind, r] : rows) fit.model.coefficients[kind] = fit_kind(r, runs.front().plan->scenario, kind);
  std::map<OpKind, std::size_t> next;
  for (FitPoint& p : fit.points) {
    const Row& r = rows[p.kind][next[p.kind]++];
    p.fitted_seconds = fitted_seconds(fit.model, p.kind, r.x);
  }
  return fit;
}

traces::Profile fitted_profile(const std::vector<ir::Plan>& plans, const std::vector<traces::Profile>& measured,
                               CostFit* fit_out) {
  if (plans.empty() || plans.size() != measured.size())
    throw Error(fmt::format("cost fit: {} probe plans but {} measurements", plans.size(), measured.size()));
  std::vector<MeasuredRun> runs;
  for (std::size_t i = 0; i < plans.size(); ++i) runs.push_back({&plans[i], &measured[i]});
  CostFit fit = fit_cost_model(runs);

  traces::Profile prof = measured.front();
  prof.ops.clear();
  prof.stages = 0;  // the model prices any pipeline depth
  prof.model = fit.model;
  for (const char* key : {"schedule", "chunks", "slices", "slice_tokens", "median_iteration_seconds",
                          "median_trace_iteration_seconds", "p2p_latency_samples"})
    prof.metadata.erase(key);
  double latency = 0, weight = 0;
  std::vector<std::string> names;
  for (std::size_t i = 0; i < measured.size(); ++i) {
    const auto& m = measured[i].metadata;
    double w = 0;
    if (const auto n = m.find("p2p_latency_samples"); n != m.end()) w = std::strtod(n->second.c_str(), nullptr);
    latency += w * measured[i].p2p.latency_seconds;
    weight += w;
    const ir::Plan& plan = plans[i];
    names.push_back(plan.slices > 1 ? fmt::format("{}:{}", plan.schedule, plan.slices) : plan.schedule);
    if (const auto span = m.find("median_trace_iteration_seconds"); span != m.end())
      prof.metadata["probe_" + names.back() + "_median_trace_iteration_seconds"] = span->second;
  }
  if (weight > 0) {
    prof.p2p.latency_seconds = latency / weight;
    prof.metadata["p2p_latency_samples"] = fmt::format("{:.0f}", weight);
  }
  prof.metadata["probes"] = fmt::format("{}", fmt::join(names, ","));
  std::vector<double> errors;
  for (const FitPoint& p : fit.points)
    errors.push_back(std::abs(p.fitted_seconds - p.measured_seconds) / p.measured_seconds);
  std::sort(errors.begin(), errors.end());
  prof.metadata["fit_groups"] = std::to_string(fit.points.size());
  prof.metadata["fit_median_abs_error"] = fmt::format("{:.4f}", errors[errors.size() / 2]);
  prof.metadata["fit_max_abs_error"] = fmt::format("{:.4f}", errors.back());
  if (fit_out) *fit_out = std::move(fit);
  return prof;
}

traces::ProfileApplied apply_profile(const traces::Profile& profile, ir::Plan& plan, bool ops_only) {
  if (profile.model.empty()) return traces::apply_profile(profile, plan, ops_only);
  const traces::FittedCostModel& model = profile.model;
  auto has = [&](OpKind k) { return model.coefficients.count(k) > 0; };
  if (plan.scenario.synthetic)
    throw Error(fmt::format("scenario '{}' is synthetic (its op times are given): a fitted cost model prices ops "
                            "from the model's shapes, which it has none of", plan.scenario.name));
  // The coefficients are speeds relative to one GPU's peak rates, measured on one machine.
  for (int r = 0; r < plan.num_ranks(); ++r)
    if (const std::string gpu = gpu_of_rank(plan.scenario, r).name; gpu != model.gpu)
      throw Error(fmt::format("profile's cost model was fitted on GPU '{}' ({}); scenario '{}' runs rank {} on '{}': "
                              "a machine's measured speeds do not carry to another GPU — calibrate on it, or give "
                              "the other cluster's speed with a stack profile (tdpipe calibrate --from-run)",
                              model.gpu, profile.platform.device, plan.scenario.name, r, gpu));
  traces::ProfileApplied applied;
  for (int r = 0; r < plan.num_ranks(); ++r) {
    for (ir::Op& op : plan.ranks[static_cast<std::size_t>(r)]) {
      if (!ir::is_compute(op.kind)) continue;
      auto price = [&](OpKind kind) {
        ir::Op as = op;
        as.kind = kind;
        return op_terms(plan, r, as);
      };
      double s = -1;
      bool fallback = true;
      if (ir::is_serving(op.kind)) {
        // A prefill or decode step is a forward pass: the forward's speeds, part by part.
        if (has(OpKind::F)) s = fitted_seconds(model, OpKind::F, op_terms(plan, r, op));
        fallback = false;
      } else if (has(op.kind)) {
        s = fitted_seconds(model, op.kind, price(op.kind));
        fallback = false;
      } else if (op.kind == OpKind::BW && has(OpKind::B) && has(OpKind::W)) {
        s = fitted_seconds(model, OpKind::B, price(OpKind::B)) + fitted_seconds(model, OpKind::W, price(OpKind::W));
      } else if ((op.kind == OpKind::B || op.kind == OpKind::W) && has(OpKind::BW)) {
        s = fitted_seconds(model, OpKind::BW, price(op.kind));  // the fused op's speeds, part by part
      }
      if (s >= 0) {
        op.est_seconds = s;
        ++applied.ops_from_profile;
        applied.ops_fallback += fallback;
      } else {
        ++applied.ops_kept;
      }
    }
  }
  if (!ops_only) {
    traces::apply_profile_platform(profile, plan);
    applied.links = profile.p2p.latency_seconds > 0;
  }
  return applied;
}

}  // namespace tdpipe::planner
