// calibrate.hpp — measures what the simulator needs to predict CPU runs: per-op
// durations of a scenario's layers as they run inside the executor (rank threads
// sharing the cores), and the in-process transport's latency and bandwidth.
#pragma once

#include <cstdint>

#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/ir/plan.hpp"
#include "tdpipe/traces/profile.hpp"
#include "tdpipe/traces/trace.hpp"

namespace tdpipe::exec::cpu {

/// How a calibration divides a device the ranks share (traces/sharing.hpp): the
/// backend's default (capacity 0, fit false: CPU the core count, CUDA 1), a given
/// capacity, or the one the measured run fits (fit_shared_capacity).
struct SharingChoice {
  double capacity = 0;
  bool fit = false;
};

struct CalibrateOptions {
  int warmup_steps = 2;  ///< run before measuring (allocations, caches)
  int steps = 5;         ///< measured steps; each op's mean is over all its samples
  TrainOptions train;    ///< model data and optimizer (steps is overridden)
  int transport_repeats = 200;
  SharingChoice sharing;
};

/// Means of each compute op kind per (virtual stage, slice) over `traces`
/// (measured traces of `plan`), as ProfileOps with the stage's layer count. With
/// shared_capacity > 0 (all ranks on one device: traces/sharing.hpp) each sample is
/// the op's work — its duration times the share of the device it had — not its
/// duration.
std::vector<traces::ProfileOp> profile_ops(const ir::Plan& plan, const std::vector<traces::Trace>& traces,
                                          double shared_capacity = 0);

/// How much of a shared device the ranks' ops get, fitted from measured traces: ops of
/// one (kind, virtual stage, slice) do the same work, so the right capacity C explains
/// their different durations by how many ops ran beside them (traces/sharing.hpp).
/// C is searched over [1, max_capacity] in steps of 0.05 for the least spread of
/// ln(work) within those groups.
struct CapacityFit {
  double capacity = 0;            ///< the fit, or the fallback when !informative
  double spread = 0;              ///< Σ squared deviations of ln(work) at `capacity`
  double spread_at_fallback = 0;  ///< the same at the fallback capacity
  bool informative = false;       ///< false: no op overlapped another enough to tell
};
CapacityFit fit_shared_capacity(const ir::Plan& plan, const std::vector<traces::Trace>& traces,
                                double max_capacity, double fallback);

/// The capacity a calibration uses for `choice` (default: `backend_default`), and in
/// `profile.metadata` what it used ("shared_capacity") and what the run fits
/// ("fitted_shared_capacity", always: a cross-check of the default).
double apply_sharing_choice(const SharingChoice& choice, double backend_default, const ir::Plan& plan,
                            const std::vector<traces::Trace>& traces, traces::Profile& profile);

/// Median over `traces` of each step trace's span (first event start to last event
/// end): the iteration a prediction from the profile should reproduce, without the
/// per-step set-up outside the trace that the wall-clock step time also holds.
double median_trace_iteration_seconds(const std::vector<traces::Trace>& traces);

/// Latency (a 8-byte message) and bandwidth (1 MiB) of a SEND/RECV pair between two
/// rank threads over CpuFabric, and of a 2-member ring all-reduce (bus bandwidth).
struct TransportMeasurement {
  traces::TransportProfile p2p;
  traces::TransportProfile collective;
};
TransportMeasurement measure_transport(int repeats);

/// Runs `plan` on the CPU backend (warm-up, then measured steps) and the transport
/// micro-benchmarks; returns the profile with this machine's platform.
traces::Profile calibrate(const ir::Plan& plan, const CalibrateOptions& options);

/// Same over several plans of one layout (e.g. 1f1b for F/BW and zb-h1 for split
/// B/W): ops are measured in each; an op the first plans measured is kept from them.
traces::Profile calibrate(const std::vector<ir::Plan>& plans, const CalibrateOptions& options);

}  // namespace tdpipe::exec::cpu
