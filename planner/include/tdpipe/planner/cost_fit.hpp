// cost_fit.hpp — the cost model's own parameters fitted to measured runs (`tdpipe
// calibrate`), so that one calibration predicts any chunking, slicing, partition or
// schedule on the machine it was measured on.
//
// An op's terms (traces::kCostTerms) are what the cost model says it is made of — the
// work of its weight GEMMs, attention core, element-wise kernels, embedding and LM head
// as seconds at the GPU's peak rates (planner::CostParts: FLOPs / peak, bytes / HBM
// bandwidth), its TP collectives and the optimizer step as priced — plus a count of 1
// per op and of the chunk's layers: the fixed costs (dispatch, per-GEMM start-up, thread
// hand-offs) that the cost model's efficiency curves stand for on a GPU. A fitted model
// prices an op of kind K as Σ coefficient[K][term] × term: a part's coefficient is
// 1 / the fraction of peak it achieves on the measured machine; "op" and "layer" are
// seconds.
//
// The fit is least squares over the measured op groups of every probe run — each group
// an op of one (kind, virtual stage, slice) of one layout, its mean duration, weighted
// by its sample count — for the least change to the cost model that explains them: the
// unknowns are the coefficients' departures from the cost model's (1 / the documented
// efficiency for a part, gemm_efficiency's fixed cost per GEMM call per layer, 0 per op:
// cost_model_coefficients), solved with minimum norm over columns
// scaled to equal weight, so parts the probes cannot tell apart (for one model shape,
// GEMM FLOPs and element-wise bytes both grow with tokens × layers) share the change, and
// a part they never exercise (e.g. TP collectives at t = 1) keeps the cost model's
// coefficient. A coefficient that comes out negative is pinned at 0 and the rest refitted.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "tdpipe/ir/plan.hpp"
#include "tdpipe/traces/profile.hpp"

namespace tdpipe::planner {

using CostTerms = std::array<double, traces::kCostTermCount>;

/// The terms of compute op `op` (F, B, W, BW or OPT) of `rank` in `plan`, which carries
/// its scenario, stage_layers and slice_tokens; of a serving PREFILL/DECODE, its batch's
/// (ServingCost::batch_parts).
CostTerms op_terms(const ir::Plan& plan, int rank, const ir::Op& op);

/// The coefficients of an op of `kind` that are the cost model itself (the fit's starting
/// point): each part at the documented efficiency of its kind of kernel, collectives and
/// the optimizer step as priced, and per layer gemm_efficiency's fixed cost per GEMM
/// call — chunk_cost where GEMMs are large (no HBM roofline); no fixed cost per op.
CostTerms cost_model_coefficients(const ir::Scenario& scenario, ir::OpKind kind);

/// One measured op group and what the fitted model says of it.
struct FitPoint {
  std::string layout;  ///< the probe: schedule, chunks and slices
  ir::OpKind kind = ir::OpKind::F;
  int virtual_stage = 0, slice = 0;
  int samples = 0;
  double measured_seconds = 0, fitted_seconds = 0;
};

struct CostFit {
  traces::FittedCostModel model;
  std::vector<FitPoint> points;
};

/// A measured run: a plan and the op-table profile measured for it (exec calibrate).
struct MeasuredRun {
  const ir::Plan* plan = nullptr;
  const traces::Profile* profile = nullptr;
};

/// Fits a model per op kind measured in `runs` (kinds without samples are left out of
/// the model: apply_profile prices BW from B and W, and B or W from BW's coefficients).
/// Throws tdpipe::Error when no run has a compute op group.
CostFit fit_cost_model(const std::vector<MeasuredRun>& runs);

/// The profile `tdpipe calibrate` writes from probe runs: `measured[i]` is the op-table
/// profile of `plans[i]`. Its model is fit_cost_model's (returned in `fit` too, if
/// given); its platform and transport are the first probe's, except the p2p hand-off
/// latency, every probe's fitted latency weighted by its clean hand-offs
/// (metadata p2p_latency_samples); no op table and no stage count (it prices any);
/// metadata: the probes, each probe's median trace span
/// (probe_<schedule[:S]>_median_trace_iteration_seconds), the fit's group count and
/// median / max |relative error|.
traces::Profile fitted_profile(const std::vector<ir::Plan>& plans, const std::vector<traces::Profile>& measured,
                               CostFit* fit = nullptr);

/// Seconds `model` gives an op of `kind` with `terms`, or a negative number when the
/// model cannot price that kind (no coefficients for it nor a fallback).
double fitted_seconds(const traces::FittedCostModel& model, ir::OpKind kind, const CostTerms& terms);

/// traces::apply_profile for every kind of profile: a fitted model (profile.model) prices
/// each compute op of `plan` from its terms, whatever the layout the probes had (a
/// serving PREFILL/DECODE — a forward pass — with the forward's coefficients); other
/// profiles go to traces::apply_profile. Unless `ops_only`, the profile's platform
/// (links, shared capacity) becomes the plan's.
traces::ProfileApplied apply_profile(const traces::Profile& profile, ir::Plan& plan, bool ops_only = false);

}  // namespace tdpipe::planner
