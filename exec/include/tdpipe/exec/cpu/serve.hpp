// serve.hpp — serving plans on the CPU backend: the tiny GPT generates every token.
//
// Each pipeline rank is a thread running the plan's ops through the interpreter
// (interpreter.hpp) over the training runs' fabric, clock and watchdog; its Compute
// (ServeCompute, serve_compute.hpp) holds the rank's decoder layers and a KV cache per
// request. PREFILL/DECODE of batch k runs the batch's items (ir::ServeItem) through the
// layers, appending their keys and values to each request's cache; the last stage samples
// greedily (argmax) and sends the tokens back to rank 0, which feeds each request's next
// token to its next batch. The weights are the training runs' initial ones
// (TrainOptions::init_seed), so greedy_reference builds the same model.
#pragma once

#include <cstdint>
#include <vector>

#include "tdpipe/ir/plan.hpp"
#include "tdpipe/traces/trace.hpp"

namespace tdpipe::exec::cpu {

struct ServeRun {
  /// Measured (origin "cpu"), one event per op. A PREFILL/DECODE event's bytes are the KV
  /// its rank held once the op ended (finished requests' caches freed): measured tokens at
  /// the plan's bytes per token (plan.serve->kv_bytes_per_token), so they compare with the
  /// op's planned bytes, which the planner rounds up to blocks and takes before it frees
  /// finished requests (measured ≤ planned).
  traces::Trace trace;
  std::vector<std::vector<int>> tokens;    ///< per request, its output tokens in order (the last stage's)
  /// per rank, most tokens its KV caches held at once (after a batch was cached, before
  /// finished requests let theirs go; a preempted request's as soon as its recompute is next)
  std::vector<std::int64_t> peak_kv_tokens;
};

/// Runs serving plan `plan` (plan.serve set, lowered) on CPU threads, once. Throws
/// tdpipe::Error for a plan without a serving table (a training plan) or without KV bytes
/// per token for each rank, a model too large
/// for the CPU backend, a request longer than the model's positions (model.seq, naming
/// it), or a rank's failure (the watchdog's report of blocked ranks included).
ServeRun run_serving(const ir::Plan& plan);

/// The prompt of request `request`: `prompt` token ids in [0, vocab), drawn from `seed`
/// and the request's index alone (every rank and the reference draw the same).
std::vector<int> prompt_tokens(std::uint64_t seed, int request, int prompt, int vocab);

/// Single-device greedy decoding of `requests` with the scenario's model, no KV cache:
/// every output token recomputes the whole sequence so far and takes the argmax of the
/// last position's logits. The reference run_serving's tokens must equal.
std::vector<std::vector<int>> greedy_reference(const ir::Scenario& scenario, const std::vector<ir::Request>& requests,
                                               std::uint64_t seed);

}  // namespace tdpipe::exec::cpu
