// cpu_serve.cpp — serving plans on CPU threads (the interpreter over ServeCompute and the
// training runs' fabric and watchdog), the prompts, and the greedy reference decoding.
#include "tdpipe/exec/cpu/serve.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "tdpipe/exec/cpu/backend.hpp"
#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/exec/cpu/serve_compute.hpp"
#include "tdpipe/exec/interpreter.hpp"
#include "tdpipe/exec/launch_common.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec::cpu {
namespace {

/// Throws tdpipe::Error unless `plan` is a lowered serving plan of one chunk per rank
/// whose compute ops are all PREFILL/DECODE, with KV bytes per token for each rank.
void check_serving_plan(const ir::Plan& plan) {
  if (!plan.serve)
    throw Error(fmt::format("plan '{}' has no serving table (plan.serve): run_serving runs serving plans (tdpipe "
                            "serve); train a training plan with tdpipe exec",
                            plan.schedule));
  check_runnable(plan);
  if (plan.serve->kv_bytes_per_token.size() != static_cast<std::size_t>(plan.num_ranks()))
    throw Error(fmt::format("serving plan '{}': plan.serve.kv_bytes_per_token has {} entries for {} ranks; the "
                            "measured trace prices each rank's KV tokens with its own (re-plan it with tdpipe serve)",
                            plan.schedule, plan.serve->kv_bytes_per_token.size(), plan.num_ranks()));
  for (int r = 0; r < plan.num_ranks(); ++r) {
    if (plan.stage_of[static_cast<std::size_t>(r)].size() != 1)
      throw Error(fmt::format("serving plan '{}': rank {} has {} model chunks; serving runs one per rank",
                              plan.schedule, r, plan.stage_of[static_cast<std::size_t>(r)].size()));
    for (const ir::Op& op : plan.ranks[static_cast<std::size_t>(r)])
      if (ir::is_compute(op.kind) && !ir::is_serving(op.kind))
        throw Error(fmt::format("serving plan '{}': rank {} has a {} op; a serving plan computes PREFILL and DECODE "
                                "only", plan.schedule, r, ir::to_string(op.kind)));
  }
}

/// Throws tdpipe::Error naming the first request whose positions (prompt + output − 1:
/// the last token is sampled, never read) do not fit the model's `seq`.
void check_lengths(const std::vector<ir::Request>& requests, int seq) {
  for (std::size_t r = 0; r < requests.size(); ++r) {
    const ir::Request& q = requests[r];
    if (q.prompt < 1 || q.output < 1)
      throw Error(fmt::format("request {}: {} prompt and {} output tokens; expected at least 1 each", r, q.prompt,
                              q.output));
    if (static_cast<long long>(q.prompt) + q.output - 1 > seq)
      throw Error(fmt::format("request {}: {} prompt + {} output tokens need {} positions, but the model has "
                              "model.seq = {}", r, q.prompt, q.output, q.prompt + q.output - 1, seq));
  }
}

/// Refuses, before allocating, a model the machine cannot hold: per rank its fp64 stage
/// (GptStage keeps weights, gradients and two Adam moments), its KV caches full to the
/// plan's capacity, and the largest batch's activations.
void check_serve_memory(const GptConfig& c, const ir::Plan& plan) {
  const ir::ServePlan& sv = *plan.serve;
  double batch_tokens = 0;
  for (const ir::ServeBatch& b : sv.batches) {
    double n = 0;
    for (const ir::ServeItem& i : b.items) n += i.tokens;
    batch_tokens = std::max(batch_tokens, n);
  }
  const int p = plan.num_ranks();
  double need = 0;
  for (int r = 0; r < p; ++r) {
    const int stage = plan.stage_of[static_cast<std::size_t>(r)].front();
    const auto [first, last] = stage_layers(c, stage, p);
    const auto k = static_cast<std::size_t>(r);
    const double capacity_tokens =
        k < sv.kv_bytes_per_token.size() && k < sv.kv_capacity_bytes.size() && sv.kv_bytes_per_token[k] > 0
            ? sv.kv_capacity_bytes[k] / sv.kv_bytes_per_token[k]
            : 0;
    need += 4.0 * sizeof(double) * double(stage_parameter_count(c, stage, p)) +
            sizeof(double) * (capacity_tokens * (last - first) * 2.0 * c.hidden +
                              batch_tokens * (10.0 * c.hidden + 2.0 * c.ffn + double(c.heads) * c.seq));
  }
  const double have = available_memory_bytes();
  if (need <= 0.9 * have) return;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  throw Error(fmt::format("serving {} on the CPU backend would need about {:.2f} GiB ({} layers, hidden {}, {} ranks; "
                          "fp64 weights, KV caches at the plan's capacity, the largest batch) but this machine has "
                          "{:.2f} GiB available: serve a smaller model on the CPU (e.g. scenarios/serve-tiny-cpu.yaml) "
                          "and predict this one (tdpipe serve --engine)",
                          plan.scenario.name, need / kGiB, c.layers, c.hidden, p, have / kGiB));
}

/// Rewrites each PREFILL/DECODE event's bytes (the interpreter copies the op's planned
/// ones) to the KV its rank held after the op: the tokens its ServeCompute recorded as the
/// op ended, at the plan's bytes per token. Call after the rank threads are joined.
void measured_kv_bytes(const ir::Plan& plan, const std::vector<std::unique_ptr<ServeCompute>>& computes,
                       std::vector<traces::TraceEvent>& events) {
  const std::vector<double>& per_token = plan.serve->kv_bytes_per_token;
  for (traces::TraceEvent& e : events) {
    if (!e.kind || !ir::is_serving(*e.kind)) continue;
    const auto r = static_cast<std::size_t>(e.rank);
    if (e.rank < 0 || r >= computes.size() || r >= per_token.size())
      throw Error(fmt::format("serving plan '{}': event {} names rank {}; the plan has {}", plan.schedule, e.name,
                              e.rank, computes.size()));
    const std::vector<std::int64_t>& after = computes[r]->kv_tokens_after();
    const std::int64_t tokens =
        e.mb >= 0 && static_cast<std::size_t>(e.mb) < after.size() ? after[static_cast<std::size_t>(e.mb)] : -1;
    if (tokens < 0)
      throw Error(fmt::format("serving plan '{}': rank {} traced {} but did not run batch {}", plan.schedule, e.rank,
                              e.name, e.mb));
    e.bytes = static_cast<std::int64_t>(std::llround(static_cast<double>(tokens) * per_token[r]));
  }
}

}  // namespace

std::vector<int> prompt_tokens(std::uint64_t seed, int request, int prompt, int vocab) {
  if (prompt < 0 || vocab < 1)
    throw Error(fmt::format("prompt of request {}: {} tokens of a vocabulary of {}; expected ≥ 0 and ≥ 1", request,
                            prompt, vocab));
  // mt19937_64's raw output is the same on every platform (a distribution's need not be).
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(request));
  std::vector<int> ids(static_cast<std::size_t>(prompt));
  for (int& id : ids) id = static_cast<int>(rng() % static_cast<std::uint64_t>(vocab));
  return ids;
}

std::vector<std::vector<int>> greedy_reference(const ir::Scenario& scenario, const std::vector<ir::Request>& requests,
                                               std::uint64_t seed) {
  GptConfig config = GptConfig::from_scenario(scenario);  // one stage: every layer
  config.seed = TrainOptions{}.init_seed;                 // the weights run_serving's ranks start from
  check_lengths(requests, config.seq);
  GptStage model(config, 0, 1);
  std::vector<std::vector<int>> out(requests.size());
  for (std::size_t r = 0; r < requests.size(); ++r) {
    std::vector<int> sequence = prompt_tokens(seed, static_cast<int>(r), requests[r].prompt, config.vocab);
    for (int k = 0; k < requests[r].output; ++k) {
      KvCache fresh;  // every token from scratch: no cache carried over
      const InferItem whole{static_cast<int>(r), 0, static_cast<int>(sequence.size()), &fresh, sequence};
      const int id = greedy_tokens(model.infer({whole}, Mat())).front();
      out[r].push_back(id);
      sequence.push_back(id);
    }
  }
  return out;
}

ServeRun run_serving(const ir::Plan& plan) {
  check_serving_plan(plan);
  const GptConfig config = model_config(plan, TrainOptions{});
  check_lengths(plan.serve->requests, config.seq);
  check_serve_memory(config, plan);
  const int p = plan.num_ranks();

  RunControl control;
  CpuFabric fabric(control);
  std::vector<std::unique_ptr<ServeCompute>> computes;
  std::vector<std::unique_ptr<CpuTransport>> transports;
  for (int r = 0; r < p; ++r) {
    computes.push_back(std::make_unique<ServeCompute>(config, plan, r));
    transports.push_back(std::make_unique<CpuTransport>(fabric, 0, r, p, 1));
  }
  const auto origin = std::chrono::steady_clock::now();
  CpuClock clock(origin);
  const CpuRunOptions options;  // the training runs' defaults: runtime, threads, watchdog
  const int threads = rank_thread_count(plan, options);
  const std::vector<std::vector<int>> groups = rank_groups(p, threads);
  std::vector<RankStepResult> outs(static_cast<std::size_t>(p));
  // A serving plan runs once: one step, step 0.
  fabric.begin_step(0);
  {
    const Watchdog watchdog(control, options.watchdog_seconds);
    std::vector<std::thread> workers;
    for (const std::vector<int>& group : groups)
      workers.emplace_back([&, group] {
        std::vector<RankSlot> slots;
        for (int r : group)
          slots.push_back({r, r, Backend{computes[static_cast<std::size_t>(r)].get(),
                                         transports[static_cast<std::size_t>(r)].get(), &clock, nullptr, nullptr,
                                         options.runtime}});
        try {
          auto results = run_rank_steps(plan, slots, 0, control);
          for (std::size_t k = 0; k < slots.size(); ++k)
            outs[static_cast<std::size_t>(slots[k].rank)] = std::move(results[k]);
        } catch (const Aborted&) {
        }
      });
    for (auto& t : workers) t.join();
  }
  if (control.failed()) throw Error(control.failure());
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - origin).count();

  ServeRun run;
  run.tokens = computes.back()->tokens();
  for (std::size_t r = 0; r < run.tokens.size(); ++r)
    if (static_cast<int>(run.tokens[r].size()) != plan.serve->requests[r].output)
      throw Error(fmt::format("serving plan '{}': request {} got {} of its {} output tokens", plan.schedule, r,
                              run.tokens[r].size(), plan.serve->requests[r].output));
  for (const auto& c : computes) run.peak_kv_tokens.push_back(c->peak_kv_tokens());
  run.trace = run_trace_header("cpu", plan, p);
  run.trace.events = step_events(outs);
  measured_kv_bytes(plan, computes, run.trace.events);
  auto& md = run.trace.metadata;
  md["backend"] = "cpu";
  md["planner"] = plan.serve->planner;
  md["pipeline"] = std::to_string(p);
  md["rank_threads"] = std::to_string(threads);
  md["wall_seconds"] = fmt::format("{:.6f}", wall);
  md["peak_kv_tokens"] = fmt::format("{}", fmt::join(run.peak_kv_tokens, ","));
  md["model"] = fmt::format("layers={} hidden={} heads={} ffn={} seq={} vocab={}", config.layers, config.hidden,
                            config.heads, config.ffn, config.seq, config.vocab);
  md["hardware_concurrency"] = std::to_string(std::thread::hardware_concurrency());
  return run;
}

}  // namespace tdpipe::exec::cpu
