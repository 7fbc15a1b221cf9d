// profile.hpp — a calibration profile: op costs, transport latency and bandwidth
// measured on one platform for one scenario. `tdpipe calibrate` writes it; the
// simulator (`tdpipe sim --profile`) reads op durations from it instead of the
// cost model.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tdpipe/ir/op.hpp"
#include "tdpipe/ir/plan.hpp"

namespace tdpipe::traces {

/// Measured duration of one compute op of one model chunk.
struct ProfileOp {
  ir::OpKind kind = ir::OpKind::F;
  int virtual_stage = -1;  ///< -1: any stage
  int slice = -1;          ///< -1: any slice
  int layers = 0;          ///< transformer layers in the measured chunk (0: unknown)
  double seconds = 0;      ///< per op (mean over samples)
  int samples = 0;
  friend bool operator==(const ProfileOp&, const ProfileOp&) = default;
};

/// A link as measured: time(bytes) = latency + bytes / bandwidth.
struct TransportProfile {
  double latency_seconds = 0;
  double bytes_per_second = 0;  ///< 0: not measured
  double seconds(double bytes) const {
    return latency_seconds + (bytes_per_second > 0 ? bytes / bytes_per_second : 0);
  }
  friend bool operator==(const TransportProfile&, const TransportProfile&) = default;
};

/// Where the profile was measured.
struct Platform {
  std::string backend;      ///< cpu | cuda
  std::string device;       ///< CPU or GPU model
  std::string description;  ///< free text for humans
  int cores = 0;            ///< cores the run could use
  int ranks = 0;            ///< ranks (threads or processes) sharing those cores / devices
  int threads_per_rank = 1; ///< compute threads each rank runs
  /// > 0: all ranks ran on one device that runs this many compute ops at full speed at
  /// once (CPU: cores; one GPU's loopback: 1) — op times are then each op's work alone
  /// on the device (traces/sharing.hpp), and predictions share the device the same way.
  double shared_capacity = 0;
  friend bool operator==(const Platform&, const Platform&) = default;
};

/// The terms of a fitted cost model, as a profile names them. Per op: "op" (1: a fixed
/// cost per op), "layer" (the chunk's transformer layers: a fixed cost per layer); the
/// cost model's seconds of the op by part (planner::CostParts): "gemm", "attention",
/// "elementwise", "comm", "embedding", "head"; and for OPT "optimizer" (the cost
/// model's optimizer-step seconds). planner/cost_fit.hpp computes and fits them.
inline constexpr const char* kCostTerms[] = {"op",   "layer",     "gemm", "attention", "elementwise",
                                             "comm", "embedding", "head", "optimizer"};
inline constexpr int kCostTermCount = 9;

/// A cost model fitted by `tdpipe calibrate` from probe runs: an op of kind K takes
/// Σ coefficients[K][term] × term seconds (or counts, for "op" and "layer") — for any
/// chunking, slicing, partition or schedule, since the terms come from the op's shape.
struct FittedCostModel {
  /// kind → one coefficient per kCostTerms entry; kinds without data are absent.
  std::map<ir::OpKind, std::vector<double>> coefficients;
  /// The GPU (preset name) whose peak rates the terms were computed with: the model prices
  /// ops on that GPU only (the machine it was measured on, as the scenario named it).
  std::string gpu;
  bool empty() const { return coefficients.empty(); }
  friend bool operator==(const FittedCostModel&, const FittedCostModel&) = default;
};

struct Profile {
  std::string scenario;  ///< name of the scenario the costs belong to
  int stages = 0;        ///< p of the measured runs (0: unknown)
  Platform platform;
  std::vector<ProfileOp> ops;
  TransportProfile p2p;         ///< pipeline SEND/RECV
  TransportProfile collective;  ///< data-parallel all-reduce (bus bandwidth)
  std::map<std::string, std::string> metadata;
  /// > 0: a software stack's speed fitted to one observed run (`tdpipe calibrate
  /// --from-run`): no op times, but cluster.compute_efficiency for any scenario — any
  /// model, layout or scale — on the GPUs named in platform.device (comma-separated).
  double compute_efficiency = 0;
  /// Non-empty: op costs come from this fitted model (planner::apply_profile), not `ops`.
  FittedCostModel model;
  friend bool operator==(const Profile&, const Profile&) = default;
};

/// A stack profile (compute_efficiency > 0) sets `scenario`'s cluster.compute_efficiency,
/// before it is planned; throws tdpipe::Error if the scenario has a GPU the profile was
/// not fitted on. Other profiles leave the scenario alone (apply_profile prices the plan).
void apply_profile_to_scenario(const Profile& profile, ir::Scenario& scenario);

/// Seconds of an op of `kind` at (virtual_stage, slice): the most specific entry
/// (stage and slice, then stage, then slice, then neither); BW falls back to B + W.
/// nullopt when the profile has no such op.
std::optional<double> profile_seconds(const Profile& profile, ir::OpKind kind, int virtual_stage, int slice);

/// What apply_profile changed.
struct ProfileApplied {
  int ops_from_profile = 0;  ///< compute ops whose est_seconds now come from the profile
  int ops_kept = 0;          ///< compute ops the profile has no entry for (cost model kept)
  int ops_fallback = 0;      ///< of ops_from_profile, priced from another kind (BW from B + W, B or W at BW's speeds)
  bool links = false;        ///< the scenario's link figures were replaced
};

/// Puts a profile's measurements into `plan` (a stack profile: nothing, its efficiency is
/// the scenario's: apply_profile_to_scenario), so that every engine (analytic and
/// SimGrid) predicts with them through the fields it reads anyway: each compute op's
/// est_seconds from profile_seconds() at its virtual stage and slice (OPT: the rank's
/// first chunk's stage, where calibration files it); unless `ops_only`, the profile's
/// p2p transport (latency, bandwidth) as every link of plan.scenario — NVLink and
/// InfiniBand alike — and its shared_capacity as the cluster's, because a profile
/// describes the platform the plan will run on (one machine's threads, one GPU's loopback). `ops_only` is for predicting another
/// cluster with op times measured here. Throws tdpipe::Error when the profile was
/// measured for another scenario or pipeline depth.
ProfileApplied apply_profile(const Profile& profile, ir::Plan& plan, bool ops_only = false);

/// The platform half of apply_profile: the p2p transport as every link of
/// plan.scenario and the profile's shared capacity as the cluster's.
void apply_profile_platform(const Profile& profile, ir::Plan& plan);

nlohmann::json to_json(const Profile& profile);
/// Throws tdpipe::Error naming `source` and the field on bad input.
Profile profile_from_json(const nlohmann::json& j, const std::string& source);
void write_profile(const Profile& profile, const std::string& path);
Profile read_profile(const std::string& path);

}  // namespace tdpipe::traces
