// handoff.hpp — the pipeline hand-off latency a run really has, fitted from its own
// measured traces: what the simulator must charge per SEND/RECV so that a producer
// op → consumer op hand-off on another rank takes as long as it did.
#pragma once

#include <optional>
#include <vector>

#include "tdpipe/ir/plan.hpp"
#include "tdpipe/traces/profile.hpp"
#include "tdpipe/traces/trace.hpp"

namespace tdpipe::traces {

struct HandoffFit {
  double latency_seconds = 0;  ///< mean over the samples
  int samples = 0;
};

/// Fits the p2p latency λ of `plan`'s runs from their step traces (one trace per
/// step, events named by ir::op_to_text as the executors write them). Each sample is
/// a consumer compute op X whose input came by RECV R, paired (NCCL's rule: the k-th
/// SEND from q to r meets the k-th RECV on r from q) with SEND S on rank q, whose
/// producer is P. Where nothing else held X back — R posted, S's stream free and X's
/// stream free by the time P ended — the engines (ir::replay, SimGrid) start X at
/// P.end + λ + bytes/bandwidth, so X.start − P.end − bytes/bandwidth is one sample of
/// λ: waking the sending thread or stream, the rendezvous, the copy's fixed cost and
/// waking the consumer, all in one figure. The fit is their mean, not their median:
/// an iteration is a sum of hand-offs, and on a busy CPU the rare wake-up that waits
/// milliseconds for a core weighs in that sum (measured: median ~40 µs, mean 0.25–2
/// ms with six threads on two cores). nullopt with fewer than `min_samples`.
std::optional<HandoffFit> fit_handoff_latency(const ir::Plan& plan, const std::vector<Trace>& steps,
                                              double bytes_per_second, int min_samples = 3);

/// What calibration does with it: profile.p2p.latency_seconds becomes the fit (with
/// the profile's bandwidth); the micro-benchmark's latency is kept in metadata
/// "p2p_latency_microbenchmark_seconds", the sample count in "p2p_latency_samples".
/// Too few clean hand-offs (e.g. p = 1): the profile stays as it is.
void fit_profile_p2p_latency(Profile& profile, const ir::Plan& plan, const std::vector<Trace>& steps);

}  // namespace tdpipe::traces
