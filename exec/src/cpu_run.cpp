// cpu_run.cpp — the thread launcher (ranks × replicas, a watchdog) and the
// single-device reference training run.
#include "tdpipe/exec/cpu/run.hpp"

#include <algorithm>
#include <cmath>
#include <thread>

#include <pthread.h>
#include <sched.h>

#include <fmt/format.h>

#include "tdpipe/exec/interpreter.hpp"
#include "tdpipe/exec/launch_common.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec::cpu {
namespace {

// The stream threads a rank starts inherit this mask.
void pin_to_core(int w) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(static_cast<unsigned>(w) % cores, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

}  // namespace

double weights_l2(const ParamMap& params) {
  double s = 0;
  for (const auto& [name, v] : params)
    for (double x : v) s += x * x;
  return std::sqrt(s);
}

RunResult run_cpu(const ir::Plan& plan, const CpuRunOptions& options) {
  check_runnable(plan);
  const int p = plan.num_ranks();
  const int d = std::max(1, plan.data);
  const GptConfig config = model_config(plan.scenario, options.train);
  const Corpus corpus = training_corpus(options.train);

  RunControl control;
  CpuFabric fabric(control);
  const auto origin = std::chrono::steady_clock::now();
  CpuClock clock(origin);
  std::vector<std::unique_ptr<CpuCompute>> computes;
  std::vector<std::unique_ptr<CpuTransport>> transports;
  for (int k = 0; k < d; ++k)
    for (int r = 0; r < p; ++r) {
      computes.push_back(std::make_unique<CpuCompute>(config, plan, r, k, corpus, options.train));
      transports.push_back(std::make_unique<CpuTransport>(fabric, k, r, p, d));
    }

  RunResult result;
  const int steps = options.train.steps;
  const int trace_step = resolve_trace_step(options.trace_step, steps);
  result.trace = run_trace_header("cpu", plan, p * d);
  {
    Watchdog watchdog(control, options.watchdog_seconds);
    for (int step = 0; step < steps; ++step) {
      std::vector<RankStepResult> outs(static_cast<std::size_t>(p * d));
      const std::int64_t step_start = clock.now_ns(ir::Stream::Compute);
      std::vector<std::thread> threads;
      for (int w = 0; w < p * d; ++w)
        threads.emplace_back([&, w] {
          Backend backend{computes[static_cast<std::size_t>(w)].get(),
                          transports[static_cast<std::size_t>(w)].get(), &clock};
          if (options.pin_threads) pin_to_core(w);
          try {
            outs[static_cast<std::size_t>(w)] = run_rank_step(plan, w % p, w, step, backend, control);
          } catch (const Aborted&) {
          }
        });
      for (auto& t : threads) t.join();
      if (control.failed()) throw Error(control.failure());
      const std::int64_t step_end = clock.now_ns(ir::Stream::Compute);
      record_step(result, outs, step_end - step_start, step == trace_step, options.keep_step_traces, "cpu",
                  plan, p * d);
    }
  }

  for (int r = 0; r < p; ++r) {
    auto& c = *computes[static_cast<std::size_t>(r)];
    for (int ch = 0; ch < c.chunks(); ++ch) {
      result.weights.merge(c.chunk_stage(ch).named_params());
      result.grads.merge(c.chunk_stage(ch).named_grads());
    }
  }
  for (int k = 1; k < d; ++k)
    for (int r = 0; r < p; ++r) {
      auto& c0 = *computes[static_cast<std::size_t>(r)];
      auto& ck = *computes[static_cast<std::size_t>(k * p + r)];
      for (int ch = 0; ch < c0.chunks(); ++ch) {
        const auto& a = c0.chunk_stage(ch).params();
        const auto& b = ck.chunk_stage(ch).params();
        for (std::size_t i = 0; i < a.size(); ++i)
          result.replica_divergence = std::max(result.replica_divergence, std::abs(a[i] - b[i]));
      }
    }

  add_run_metadata(result.trace, plan, config, result, steps, trace_step);
  auto& md = result.trace.metadata;
  md["backend"] = "cpu";
  md["threads"] = std::to_string(p * d);
  md["hardware_concurrency"] = std::to_string(std::thread::hardware_concurrency());
  return result;
}

RunResult run_reference(const ir::Scenario& scenario, int data, int microbatches,
                        const TrainOptions& options) {
  const GptConfig config = model_config(scenario, options);
  const Corpus corpus = training_corpus(options);
  if (corpus.vocab() > config.vocab)
    throw Error(fmt::format("model.vocab = {} is smaller than the corpus's {} characters",
                            config.vocab, corpus.vocab()));
  GptStage model(config, 0, 1);
  const double scale = 1.0 / (static_cast<double>(data) * microbatches * config.micro_batch * config.seq);
  RunResult result;
  for (int step = 0; step < options.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    model.begin_step();
    double loss = 0;
    for (int k = 0; k < data; ++k)
      for (int mb = 0; mb < microbatches; ++mb) {
        const int id = k * microbatches + mb;
        MicroBatch batch = load_micro_batch(corpus, options.data_seed, step, k, microbatches, mb,
                                            config.micro_batch, config.seq);
        model.forward(id, 0, 0, config.seq, Mat(), &batch.tokens, &batch.targets, scale, &loss);
        model.backward_input(id, 0, Mat());
        model.backward_weight(id, 0);
      }
    result.grads = model.named_grads();
    model.adam(options.adam, step + 1);
    result.loss_per_step.push_back(loss);
    result.iteration_seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  result.weights = model.named_params();
  result.trace.origin = "cpu";
  result.trace.scenario = scenario.name;
  result.trace.schedule = "reference";
  result.trace.ranks = 1;
  return result;
}

}  // namespace tdpipe::exec::cpu
