// cpu_run.cpp — the thread launcher (ranks × replicas, a watchdog) and the
// single-device reference training run.
#include "tdpipe/exec/cpu/run.hpp"

#include <algorithm>
#include <malloc.h>
#include <cmath>
#include <thread>
#include <vector>

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

#include "tdpipe/exec/checkpoint.hpp"
#include "tdpipe/exec/faults.hpp"
#include "tdpipe/exec/interpreter.hpp"
#include "tdpipe/exec/launch_common.hpp"
#include "tdpipe/exec/recovery.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec::cpu {
namespace {

/// Bytes the CPU backend holds for `plan` (all ranks and replicas in this process), in
/// its fp64 model: weights, gradients and Adam's two moments (4 values per parameter;
/// 1-bit Adam's error feedback adds 1 + 1/d),
/// and each rank's peak in-flight activations (F adds one micro-batch's slice of its
/// chunk, B/BW frees it) at ~10 hidden-wide and 1.5 ffn-wide tensors per token and
/// layer plus the heads·seq² attention scores.
double cpu_memory_bytes(const GptConfig& c, const ir::Plan& plan) {
  const double d = std::max(1, plan.data);
  const bool onebit = plan.scenario.parallel.onebit() && d > 1;
  const double per_param = (4 + (onebit ? 1 + 1 / d : 0)) * sizeof(double);
  const double tokens = double(c.micro_batch) * c.seq;
  const double per_layer_act =
      sizeof(double) * (tokens * (10.0 * c.hidden + 1.5 * c.ffn) + double(c.micro_batch) * c.heads * c.seq * c.seq);
  double total = 0;
  for (int r = 0; r < plan.num_ranks(); ++r) {
    double params = 0, max_blocks = 0;
    for (int stage : plan.stage_of.at(static_cast<std::size_t>(r))) {
      auto [a, b] = stage_layers(c, stage, plan.virtual_stages());
      max_blocks = std::max(max_blocks, double(b - a));
      params += double(stage_parameter_count(c, stage, plan.virtual_stages()));
    }
    const int peak = ir::peak_inflight(plan.ranks[static_cast<std::size_t>(r)]);
    total += params * per_param + peak * max_blocks * per_layer_act / std::max(1, plan.slices);
  }
  return total * std::max(1, plan.data);
}

}  // namespace

double available_memory_bytes() {
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    long long kib = -1;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "MemAvailable: %lld kB", &kib) == 1) break;
    std::fclose(f);
    if (kib > 0) return double(kib) * 1024.0;
  }
  return double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGE_SIZE));
}

namespace {

/// Refuses, before allocating, a model the machine cannot hold (instead of bad_alloc).
void check_cpu_memory(const GptConfig& config, const ir::Plan& plan) {
  const double need = cpu_memory_bytes(config, plan);
  const double have = available_memory_bytes();
  if (need <= 0.9 * have) return;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  throw Error(fmt::format(
      "the CPU backend would need about {:.2f} GiB for {} ({} layers, hidden {}, {} ranks x {} replicas; fp64 "
      "weights, gradients and Adam state, peak activations) but this machine has {:.2f} GiB available: run a "
      "smaller model on the CPU (e.g. scenarios/tiny-gpt-cpu.yaml) and this one with --backend cuda or in "
      "tdpipe sim",
      need / kGiB, plan.scenario.name, config.layers, config.hidden, plan.num_ranks(), std::max(1, plan.data),
      have / kGiB));
}

}  // namespace

std::vector<int> allowed_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cores;
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cores.push_back(c);
  return cores;
}

// Pinning is a placement hint: where it fails, the thread stays where the kernel puts it.
void pin_to_core(int w, const std::vector<int>& cores) {
  if (cores.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cores[static_cast<std::size_t>(w) % cores.size()], &set);
  (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

std::vector<std::vector<int>> rank_groups(int ranks, int threads) {
  if (ranks < 1 || threads < 1 || threads > ranks)
    throw Error(fmt::format("{} threads for {} ranks: expected 1 to {} threads", threads, ranks, std::max(1, ranks)));
  std::vector<std::vector<int>> groups(static_cast<std::size_t>(threads));
  for (int g = 0, w = 0; g < threads; ++g)
    for (int k = 0; k < ranks / threads + (g < ranks % threads); ++k) groups[static_cast<std::size_t>(g)].push_back(w++);
  return groups;
}

namespace {
// Why each rank of this run needs a thread of its own (empty: ranks may share one).
std::string own_thread_reason(const ir::Plan& plan, const CpuRunOptions& options) {
  if (options.runtime != Runtime::cooperative) return "the threaded runtime gives each stream a thread";
  if (plan.scenario.model.dtype == "fp16") return "fp16 training agrees on overflow flags at OPT, a wait for every rank";
  for (const FaultSpec& f : options.faults.inject)
    if (holds_thread(f.kind)) return fmt::format("an injected {} fault holds its rank's thread", to_string(f.kind));
  for (double s : options.train.rank_speed)
    if (s != 1) return "--rank-speed stretches a rank's ops by sleeping its thread";
  return "";
}
}  // namespace

int rank_thread_count(const ir::Plan& plan, const CpuRunOptions& options) {
  const int ranks = plan.num_ranks() * std::max(1, plan.data);
  const std::string reason = own_thread_reason(plan, options);
  if (options.rank_threads != 0) {
    if (options.rank_threads < 0 || options.rank_threads > ranks)
      throw Error(fmt::format("rank threads = {}: the run has {} ranks (p × d); expected 1 to {} (or 0: automatic)",
                              options.rank_threads, ranks, ranks));
    if (options.rank_threads < ranks && !reason.empty())
      throw Error(fmt::format("rank threads = {} < {} ranks: {}; each rank needs a thread of its own",
                              options.rank_threads, ranks, reason));
    return options.rank_threads;
  }
  const int cores = std::max<int>(1, static_cast<int>(allowed_cores().size()));
  return ranks <= cores || !reason.empty() ? ranks : cores;
}

void check_injection(const TrainOptions::OverflowInjection& inject, const ir::Plan& plan, int first, int steps) {
  if (inject.step < 0) return;
  if (plan.scenario.model.dtype != "fp16")
    throw Error("an injected overflow needs fp16 training (model.dtype: fp16): without loss scaling an inf "
                "gradient has no one to catch it");
  const int slices = std::max(1, plan.slices), p = plan.num_ranks(), d = std::max(1, plan.data);
  if (inject.slice < 0 || inject.slice >= slices)
    throw Error(fmt::format("injected overflow in slice {}: the plan has {} slices", inject.slice, slices));
  if (inject.step < first || inject.step >= first + steps)
    throw Error(fmt::format("injected overflow at step {}: this run takes steps {} to {}", inject.step, first,
                            first + steps - 1));
  if (inject.rank < 0 || inject.rank >= p * d)
    throw Error(fmt::format("injected overflow on rank {}: the run has world ranks 0 to {} (replica · {} + rank)",
                            inject.rank, p * d - 1, p));
}

double weights_l2(const ParamMap& params) {
  double s = 0;
  for (const auto& [name, v] : params)
    for (double x : v) s += x * x;
  return std::sqrt(s);
}

namespace {

// One incarnation of a run's ranks: what a restart throws away and builds again.
struct World {
  World(const GptConfig& config, const ir::Plan& plan, const Corpus& corpus, const CpuRunOptions& options,
        FaultInjector& faults)
      : plan(&plan), fabric(control, &faults, options.faults.retry_timeout, options.faults.max_retries) {
    const int p = plan.num_ranks(), d = std::max(1, plan.data);
    for (int k = 0; k < d; ++k)
      for (int r = 0; r < p; ++r) {
        computes.push_back(std::make_unique<CpuCompute>(config, plan, r, k, corpus, options.train));
        transports.push_back(std::make_unique<CpuTransport>(fabric, k, r, p, d));
      }
  }
  const ir::Plan* plan;
  RunControl control;
  CpuFabric fabric;
  std::vector<std::unique_ptr<CpuCompute>> computes;
  std::vector<std::unique_ptr<CpuTransport>> transports;
  CpuClock* clock = nullptr;
  std::vector<int> pin_cores;  ///< thread g on pin_cores[g mod size]; empty: unpinned
  std::vector<std::vector<int>> groups;  ///< the world ranks each thread runs (rank_groups)
  Runtime runtime = Runtime::cooperative;
  std::int64_t wire_before = 0;

  // recovery.hpp's World.
  std::unique_ptr<Watchdog> watchdog(double seconds) { return std::make_unique<Watchdog>(control, seconds); }
  std::int64_t now_ns() { return clock->now_ns(ir::Stream::Compute); }
  std::int64_t run_step(int step, FaultInjector& injector, Heartbeats* heartbeats, std::vector<RankStepResult>& outs,
                        RunResult& result);
  void step_done(RunResult& result) { result.dp_wire_bytes.push_back(fabric.bytes_moved(CpuFabric::kDP) - wire_before); }
};

std::string kind_text(const RetryRecord& r) {
  return fmt::format("retry {} to rank {} ({}, attempt {})", r.label, r.to, r.why, r.attempt + 1);
}

}  // namespace

std::int64_t World::run_step(int step, FaultInjector& injector, Heartbeats* heartbeats,
                             std::vector<RankStepResult>& outs, RunResult& result) {
  const int p = plan->num_ranks();
  fabric.begin_step(step);
  const std::int64_t start = now_ns();
  wire_before = fabric.bytes_moved(CpuFabric::kDP);
  std::vector<std::thread> threads;
  for (int g = 0; g < static_cast<int>(groups.size()); ++g)
    threads.emplace_back([&, g] {
      std::vector<RankSlot> slots;
      for (int w : groups[static_cast<std::size_t>(g)])
        slots.push_back({w % p, w,
                         Backend{computes[static_cast<std::size_t>(w)].get(), transports[static_cast<std::size_t>(w)].get(),
                                 clock, &injector, heartbeats, runtime}});
      if (!pin_cores.empty()) pin_to_core(g, pin_cores);
      try {
        auto results = run_rank_steps(*plan, slots, step, control);
        for (std::size_t k = 0; k < slots.size(); ++k)
          outs[static_cast<std::size_t>(slots[k].trace_rank)] = std::move(results[k]);
      } catch (const Aborted&) {
      }
    });
  for (auto& t : threads) t.join();
  for (const RetryRecord& r : fabric.take_retries()) {
    const double waited = std::chrono::duration<double>(r.resent - r.failed).count();
    result.retries += 1;
    result.retry_seconds += waited;
    result.faults.push_back({"retry", r.step, r.from,
                             fmt::format("{} to rank {}: {} ({} bytes), sent again after {:.0f} ms (attempt {})", r.label,
                                         r.to, r.why, r.bytes, 1e3 * waited, r.attempt + 1)});
    if (!control.failed() && static_cast<std::size_t>(r.from) < outs.size()) {
      traces::TraceEvent e;
      e.rank = r.from;
      e.stream = static_cast<int>(r.comm == CpuFabric::kP2P ? ir::Stream::P2P : ir::Stream::DP);
      e.name = kind_text(r);
      e.peer = r.to;
      e.bytes = r.bytes;
      e.start_ns = clock->ns_of(r.failed);
      e.dur_ns = clock->ns_of(r.resent) - e.start_ns;
      outs[static_cast<std::size_t>(r.from)].events.push_back(std::move(e));
    }
  }
  return start;
}

void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's ceiling for it on 64-bit
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

RunResult run_cpu(const ir::Plan& plan, const CpuRunOptions& options) {
  check_runnable(plan);
  const int p = plan.num_ranks();
  const int d = std::max(1, plan.data);
  const GptConfig config = model_config(plan, options.train);
  check_cpu_memory(config, plan);
  const Corpus corpus = training_corpus(options.train);
  const FaultOptions& fo = options.faults;
  const RecoveryStart rs = prepare_recovery(plan, config, options.train, options.start, fo, options.watchdog_seconds,
                                            corpus);
  const int first = rs.first, steps = rs.end - rs.first;
  check_injection(options.train.inject_overflow, plan, first, steps);
  FaultInjector injector(fo.inject);

  CpuClock clock(std::chrono::steady_clock::now());
  const int threads = rank_thread_count(plan, options);
  // Builds the ranks and loads the state of a checkpoint, else the start.
  auto build = [&](const std::optional<CheckpointManifest>& from) {
    auto w = std::make_unique<World>(config, plan, corpus, options, injector);
    w->clock = &clock;
    std::vector<int> cores = allowed_cores();
    w->groups = rank_groups(p * d, threads);
    // A core per thread: a thread per rank, or ranks sharing one thread per core (not a
    // few shared threads on many cores, whose ranks' stream threads would inherit a mask).
    const int n = static_cast<int>(w->groups.size()), have = static_cast<int>(cores.size());
    const bool own_cores = n <= have && (n == p * d || n == have);
    if (options.pinning == CpuRunOptions::Pinning::on ||
        (options.pinning == CpuRunOptions::Pinning::automatic && own_cores))
      w->pin_cores = std::move(cores);
    w->runtime = options.runtime;
    load_world_state(w->computes, fo.checkpoint_dir, from, options.start);
    return w;
  };
  std::unique_ptr<World> world = build(rs.resumed);

  RunResult result;
  const int trace_step = resolve_trace_step(options.trace_step, steps);
  result.trace = run_trace_header("cpu", plan, p * d);
  LossScaleState traced_scale;  // fp16: the scaler after the trace step
  run_recovering(plan, rs, {fo, options.watchdog_seconds, trace_step, options.keep_step_traces, "cpu"}, injector,
                 build, world, result, traced_scale);
  auto& computes = world->computes;

  // A sharded optimizer (REDUCE_SCATTER buckets): each replica holds the reduced
  // gradients and the Adam moments of its own segments only; replica 0, which the result
  // reports, takes the others' from them (the parameters were all-gathered already).
  const std::vector<int> buckets = sharded_buckets(plan);
  if (!buckets.empty())
    for (int r = 0; r < p; ++r)
      for (int k = 1; k < d; ++k) {
        auto& c0 = *computes[static_cast<std::size_t>(r)];
        auto& ck = *computes[static_cast<std::size_t>(k * p + r)];
        const OptimizerShard owner{k, d, {}};
        for (int ch = 0; ch < c0.chunks(); ++ch) {
          GptStage& to = c0.chunk_stage(ch);
          GptStage& from = ck.chunk_stage(ch);
          const int n = buckets[static_cast<std::size_t>(r * c0.chunks() + ch)];
          for (const auto& [b, e] : owned_ranges(static_cast<std::int64_t>(to.grads().size()), n, owner)) {
            std::copy(from.grads().begin() + b, from.grads().begin() + e, to.grads().begin() + b);
            for (int which : {1, 2})
              std::copy(from.moments(which).begin() + b, from.moments(which).begin() + e,
                        to.moments(which).begin() + b);
          }
        }
      }
  for (int r = 0; r < p; ++r) {
    auto& c = *computes[static_cast<std::size_t>(r)];
    for (int ch = 0; ch < c.chunks(); ++ch) {
      result.weights.merge(c.chunk_stage(ch).named_params());
      result.grads.merge(c.chunk_stage(ch).named_grads());
      result.state.m1.merge(c.chunk_stage(ch).named_moments(1));
      result.state.m2.merge(c.chunk_stage(ch).named_moments(2));
    }
  }
  result.state.params = result.weights;
  result.state.steps_done = first + steps;
  if (const LossScaler* scaler = computes.front()->loss_scaler()) {
    result.state.loss_scale = scaler->state();
    if (trace_step >= 0)  // (a run of 0 steps traces none)
      detail::add_loss_scale_metadata(result.trace, result.loss_scale.at(static_cast<std::size_t>(trace_step)), traced_scale);
  }
  for (const auto& c : computes) result.param_state_peak_bytes.push_back(c->param_state_peak_bytes());
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
  md["ranks"] = std::to_string(p * d);
  md["rank_threads"] = std::to_string(threads);  // threads running the ranks' compute and p2p streams
  md["restarts"] = std::to_string(result.restarts);
  md["retries"] = std::to_string(result.retries);
  md["retry_seconds"] = fmt::format("{:.6f}", result.retry_seconds);
  if (result.checkpoints_written > 0) md["checkpoints_written"] = std::to_string(result.checkpoints_written);
  md["hardware_concurrency"] = std::to_string(std::thread::hardware_concurrency());
  if (trace_step >= 0) md["dp_wire_bytes"] = std::to_string(result.dp_wire_bytes.at(static_cast<std::size_t>(trace_step)));
  const auto& par = plan.scenario.parallel;
  md["optimizer"] = !par.onebit() ? par.optimizer
                    : first + trace_step < par.onebit_warmup_steps ? "onebit-adam (warm-up: Adam)"
                                                                  : "onebit-adam (compressed)";
  return result;
}

RunResult run_reference(const ir::Scenario& scenario, int data, int microbatches,
                        const TrainOptions& options) {
  GptConfig config = GptConfig::from_scenario(scenario);  // one stage: every layer
  config.seed = options.init_seed;
  const Corpus corpus = training_corpus(options);
  if (corpus.vocab() > config.vocab)
    throw Error(fmt::format("model.vocab = {} is smaller than the corpus's {} characters",
                            config.vocab, corpus.vocab()));
  GptStage model(config, 0, 1);
  const double scale = 1.0 / (static_cast<double>(data) * microbatches * config.micro_batch * config.seq);
  std::optional<LossScaler> scaler;  // fp16: one slice (full sequences)
  if (scenario.model.dtype == "fp16") scaler.emplace(LossScaleConfig::from_scenario(scenario.parallel), 1);
  RunResult result;
  for (int step = 0; step < options.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    if (scaler) model.set_fp16(scaler->scales());
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
    const int t = step + 1 - (scaler ? scaler->state().skipped : 0);
    const bool skip = scaler && scaler->update(model.overflowed());
    if (scaler) result.loss_scale.push_back(scaler->last_step());
    if (!skip) model.adam(options.adam, t);
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
