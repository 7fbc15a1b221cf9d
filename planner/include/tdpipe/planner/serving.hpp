// serving.hpp — serving planners: a workload of requests → a lowered serving plan.
//
// The plan is static: with known prompt and output lengths (ignore-EOS, as serving
// benchmarks run) every decision a serving engine's scheduler makes — which requests a
// batch admits, decodes or preempts, when the TD-Pipe controller switches phase — is
// computable ahead of time from the cost model and the KV accounting, so the planners
// run the schedulers here and emit their batches as ops; the engines and executors only
// follow the plan (the modules' one-way flow). Every rank runs every batch in one order;
// P = pipeline ranks batches are in flight: a request's next batch comes at least P
// batches after its previous one (its token returns from the last stage first).
//
//  - pp (vLLM's pipeline parallelism with continuous batching): each batch decodes the
//    requests whose token came back, then admits waiting prompts while the batch's token
//    budget (max_batch_tokens) and free KV blocks (less a 1 % watermark) allow; when a
//    decode needs a block and none is free, the latest-admitted request of the batch is
//    preempted (its blocks freed, recomputed later as a prefill of its prompt and the
//    tokens it generated);
//  - tp: the same scheduler on one tensor-parallel group of all the GPUs (P = 1);
//  - tdpipe (Zhang et al., ICPP 2025): prefill windows admit prompts greedily while the
//    projected peak KV use of every admitted request (their known lengths, in lockstep
//    decode) stays under kv_fraction of the blocks; decode windows rebuild each batch from
//    one pool of the requests whose token returned, ⌊N/P⌋ (+1 for the first N mod P of a
//    round) each (work stealing); every P decode batches, with requests waiting and
//    N/P ≤ 3/4 of max_batch_requests, the controller switches to prefill when decode
//    intensity falls below prefill intensity net of the switch's bubble (switch_decision).
#pragma once

#include <string>
#include <vector>

#include "tdpipe/ir/plan.hpp"
#include "tdpipe/ir/serving.hpp"

namespace tdpipe::planner {

/// A lowered serving plan (schedule "serve-<planner>") for `requests` on the scenario's
/// GPUs (serving_layout), costs and KV bytes on every op. Throws tdpipe::Error for an
/// unknown planner, a request longer than the model's context (model.seq) or whose KV
/// cache alone exceeds the GPUs', a layout that does not fit.
ir::Plan plan_serving(const ir::Scenario& scenario, const std::string& planner,
                      const std::vector<ir::Request>& requests);

/// The inputs of the TD-Pipe controller's decode → prefill decision (REFERENCES.md: the
/// repo's core/scheduler.py), all times of one stage.
struct SwitchInputs {
  int stages = 1;                        ///< P
  double decode_batch = 0;               ///< b = N / P, the decode batch now
  double decode_seconds = 0;             ///< T(b)
  double full_batch = 256;               ///< max_batch_requests
  double full_seconds = 0;               ///< T(full_batch)
  std::vector<double> prefill_seconds;   ///< per admissible prefill batch, one stage's time
  double decode_after_seconds = 0;       ///< T(b') of the decode batch after the window
};

struct SwitchDecision {
  double decode_intensity = 0;   ///< (b / T(b)) / (full / T(full))
  double prefill_intensity = 0;  ///< (prefill_time − bubble) / prefill_time
  double prefill_time = 0;       ///< Σ t_pf + (P − 1)·max t_pf
  double bubble = 0;             ///< (P − 1)·max(0, max t_pf − T(b'))
  bool to_prefill = false;       ///< decode_intensity < prefill_intensity
};

/// The switch rule on given inputs (no prefill batch admissible: stay in decode).
SwitchDecision switch_decision(const SwitchInputs& in);

}  // namespace tdpipe::planner
