// simulate.hpp — the SimGrid engine's entry point: a lowered plan in, a predicted
// timeline (origin "simgrid") and its metrics out.
//
// Semantics match ir::replay (the analytic engine's): each (rank, stream) runs its ops
// in plan order; an op also waits for its `deps`, a compute op for the RECVs carrying
// its inputs, a SEND for the op producing its payload, a collective for its bucket's
// gradients (explicit deps, else the rank's last backward op), OPT for the rank's
// collectives; comm ops sharing a `batch` are posted together. Unlike replay, SEND/RECV
// are SimGrid communications over modelled links and collectives are their algorithms'
// flows, so transfers share bandwidth.
//
// Each call runs SimGrid in a forked child process (SimGrid 3.32 cannot start a second
// engine in one process), so simulate() may be called any number of times.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tdpipe/ir/plan.hpp"
#include "tdpipe/sim/faults.hpp"
#include "tdpipe/sim/platform.hpp"
#include "tdpipe/traces/metrics.hpp"
#include "tdpipe/traces/trace.hpp"

namespace tdpipe::sim {

/// How much of the cluster is simulated.
enum class Fidelity {
  /// Reductions that keep fidelity: one actor set per pipeline rank stands for its
  /// TP group (t GPUs, each moving bytes/t over its own NIC) and for all d DP
  /// replicas (symmetry): a collective's ring step is one flow through the rank's own
  /// NIC and fabric links instead of d (collapse_ring_steps: all steps as one flow).
  /// Collective op.bytes are per GPU (its gradient shard).
  Reduced,
  /// Baseline: every GPU has its actors, every p2p message is t flows, every ring
  /// step is one flow per GPU over the full platform.
  Plain,
};

enum class CollectiveAlgorithm { Auto, Ring, Tree };

struct SimOptions {
  Fidelity fidelity = Fidelity::Reduced;
  /// Auto: the cheaper of ring and (double binary) tree by the α-β estimate, as NCCL's
  /// tuner picks; Plain fidelity simulates ring step flows, tree always collapsed.
  CollectiveAlgorithm collective = CollectiveAlgorithm::Auto;
  bool collapse_ring_steps = true;   ///< Reduced: one flow for all ring steps
  bool overlap_dp = true;            ///< false: collectives wait for the rank's last backward
  /// SEND bytes are what each TP GPU sends (planner's cost model already divides the
  /// activation by t, Megatron's scatter-gather); true divides op.bytes by t here.
  bool p2p_split_across_tp = false;
  FabricOptions fabric;              ///< fabric knobs beyond the scenario
  std::optional<PlatformSpec> platform;  ///< overrides platform_for(plan.scenario)
  /// Op duration override (e.g. from a calibration profile); nullopt keeps est_seconds.
  std::function<std::optional<double>(const ir::Op& op, int rank)> op_seconds;
  /// Called with the fraction of ops done, at most every 1%.
  std::function<void(double fraction)> progress;
  int top_links = 16;                ///< links reported, by peak utilisation
  /// Slow GPUs and degraded NICs (faults.hpp); fail faults are ignored here (they are
  /// failure_timeline's). Checked against the layout: bad ones throw tdpipe::Error.
  std::vector<SimFault> faults;
};

struct LinkUsage {
  std::string name;
  double bytes_per_second = 0;
  double peak_utilisation = 0;  ///< max instantaneous load / capacity
  double mean_utilisation = 0;  ///< over the iteration
};

struct SimResult {
  /// The pipeline of replica trace_replica, TP rank trace_tp: the one whose last op
  /// ends last (with faults, the one that sets the iteration); replica 0, TP rank 0
  /// when all end alike.
  traces::Trace trace;
  traces::Metrics metrics;      ///< iteration, bubble, compute / exposed / hidden comm
  double iteration_seconds = 0;  ///< (tokens/s, MFU, memory verdict: report::make_report)
  std::vector<double> peak_activation_bytes;  ///< per rank, from ops' mem_bytes
  /// Per rank: time data was moving (a SEND/RECV from the later post to completion, a
  /// collective from start to end) — unlike the trace's comm events, waiting for a
  /// peer to post is not counted. Exposed: the part when no compute op ran.
  std::vector<std::int64_t> transfer_ns, exposed_transfer_ns;
  std::vector<LinkUsage> links; ///< most loaded links first
  std::int64_t simulated_gpus = 0, actors = 0, flows = 0;
  std::string collective;       ///< algorithm used for DP collectives ("ring" / "tree" / "")
  int trace_replica = 0, trace_tp = 0;
  /// Reduced fidelity: the replicas simulated (without faults {0}: it stands for all).
  std::vector<int> simulated_replicas;
  double engine_wall_seconds = 0;     ///< platform build + simulation, in the SimGrid process
  double engine_cpu_seconds = 0;      ///< CPU time of the SimGrid process (user + system)
  std::int64_t engine_peak_rss_bytes = 0;  ///< peak RSS of the SimGrid process
};

/// Simulates one iteration of a lowered plan (plan.lowered) on plan.scenario's
/// cluster. Throws tdpipe::Error for an unlowered plan, a plan needing more GPUs than
/// the cluster has, an impossible fabric, or a deadlocking order (naming blocked ops).
SimResult simulate(const ir::Plan& lowered, const SimOptions& options = {});

/// Closed-form α-β time of one isolated collective of `bytes` over `n` ranks with
/// per-step latency `alpha` and per-rank bandwidth `beta_bytes_per_second`.
double ring_allreduce_seconds(double bytes, int n, double alpha, double beta_bytes_per_second);
double tree_allreduce_seconds(double bytes, int n, double alpha, double beta_bytes_per_second);

}  // namespace tdpipe::sim
