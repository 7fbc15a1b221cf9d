// cpu_run.cpp — the thread launcher (ranks × replicas, a watchdog) and the
// single-device reference training run.
#include "tdpipe/exec/cpu/run.hpp"

#include <algorithm>
#include <cmath>
#include <thread>

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

#include "tdpipe/exec/checkpoint.hpp"
#include "tdpipe/exec/faults.hpp"
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

/// Memory this process may still take: MemAvailable, else the physical memory.
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

// The fp16 loss scaler of one step, as trace metadata.
void add_loss_scale_metadata(traces::Trace& trace, const LossScaleStep& step, const LossScaleState& after) {
  auto& md = trace.metadata;
  md["precision"] = "fp16 (emulated: fp64 arithmetic, activations and gradients stored through binary16)";
  md["loss_scale"] = scales_text(step.scales);
  std::string flags;
  for (auto f : step.overflow) flags += fmt::format("{}{}", flags.empty() ? "" : ",", int(f));
  md["loss_scale_overflow"] = flags;
  md["loss_scale_skipped"] = step.skipped ? "true" : "false";
  md["loss_scale_next"] = scales_text(after.scales);
  md["skipped_steps"] = std::to_string(after.skipped);
}

}  // namespace

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
      : fabric(control, &faults, options.faults.retry_timeout, options.faults.max_retries) {
    const int p = plan.num_ranks(), d = std::max(1, plan.data);
    for (int k = 0; k < d; ++k)
      for (int r = 0; r < p; ++r) {
        computes.push_back(std::make_unique<CpuCompute>(config, plan, r, k, corpus, options.train));
        transports.push_back(std::make_unique<CpuTransport>(fabric, k, r, p, d));
      }
  }
  RunControl control;
  CpuFabric fabric;
  std::vector<std::unique_ptr<CpuCompute>> computes;
  std::vector<std::unique_ptr<CpuTransport>> transports;
};

// What a checkpoint must share with the run that continues from it.
std::map<std::string, std::string> run_fingerprint(const ir::Plan& plan, const GptConfig& c, const TrainOptions& t,
                                                   const Corpus& corpus) {
  std::string layout;
  for (std::size_t r = 0; r < plan.stage_of.size(); ++r)
    for (int stage : plan.stage_of[r]) {
      const auto [a, b] = stage_layers(c, stage, plan.virtual_stages());
      layout += fmt::format("{}r{}:s{}[{},{})", layout.empty() ? "" : " ", r, stage, a, b);
    }
  const auto& ids = corpus.ids();
  const auto corpus_crc = crc32_of(ids.data(), ids.size() * sizeof(int));
  const auto& par = plan.scenario.parallel;
  return {{"scenario", plan.scenario.name},
          {"schedule", plan.schedule},
          {"layout", fmt::format("p={} d={} m={} v={} S={}", plan.num_ranks(), std::max(1, plan.data),
                                 plan.microbatches, plan.chunks, plan.slices)},
          {"stages", layout},
          {"model", fmt::format("layers={} hidden={} heads={} ffn={} seq={} vocab={} b={} dtype={}", c.layers, c.hidden,
                                c.heads, c.ffn, c.seq, c.vocab, c.micro_batch, plan.scenario.model.dtype)},
          {"optimizer", fmt::format("{} lr={} beta1={} beta2={} eps={} warmup={} distributed={} bucket_mb={}",
                                    par.optimizer, t.adam.lr, t.adam.beta1, t.adam.beta2, t.adam.eps,
                                    par.onebit_warmup_steps, par.distributed_optimizer, par.bucket_mb)},
          {"loss_scale", fmt::format("{} initial={} window={} min={}", par.loss_scale, par.initial_loss_scale,
                                     par.loss_scale_window, par.min_loss_scale)},
          {"seeds", fmt::format("data={} init={}", t.data_seed, t.init_seed)},
          {"corpus", fmt::format("{} tokens, CRC-32 {:08x}", ids.size(), corpus_crc)}};
}

// Per world rank: seconds its compute stream was busy in this step.
void add_compute_seconds(std::vector<double>& into, const std::vector<RankStepResult>& outs) {
  into.resize(outs.size(), 0.0);
  for (std::size_t w = 0; w < outs.size(); ++w)
    for (const auto& e : outs[w].events)
      if (e.stream == static_cast<int>(ir::Stream::Compute)) into[w] += static_cast<double>(e.dur_ns) * 1e-9;
}

// A step stopped by a recoverable fault: the launcher restarts from a checkpoint.
struct StepLost {
  FaultRecord record;
};

std::string kind_text(const RetryRecord& r) {
  return fmt::format("retry {} to rank {} ({}, attempt {})", r.label, r.to, r.why, r.attempt + 1);
}

}  // namespace

RunResult run_cpu(const ir::Plan& plan, const CpuRunOptions& options) {
  check_runnable(plan);
  const int p = plan.num_ranks();
  const int d = std::max(1, plan.data);
  const GptConfig config = model_config(plan, options.train);
  check_cpu_memory(config, plan);
  const Corpus corpus = training_corpus(options.train);
  const FaultOptions& fo = options.faults;
  check_fault_options(fo);
  const std::string& dir = fo.checkpoint_dir;
  const auto fingerprint = run_fingerprint(plan, config, options.train, corpus);

  // Where the run starts: a checkpoint (resume), a given state, or a fresh model.
  std::optional<CheckpointManifest> resumed;
  if (fo.resume) {
    if (options.start) throw Error("resume from a checkpoint and a start state: give one of them");
    std::vector<std::string> skipped;
    resumed = latest_checkpoint(dir, fingerprint, &skipped);
    if (!resumed) {
      std::string why;
      for (const auto& s : skipped) why += "\n  " + s;
      throw Error(fmt::format("resume: {} holds no complete checkpoint{}", dir, why.empty() ? "" : ":" + why));
    }
  } else if (!dir.empty() && has_checkpoints(dir)) {
    throw Error(fmt::format("checkpoint folder {} holds another run's checkpoints (step-* folders): resume that run "
                            "(--resume {}) or give an empty folder", dir, dir));
  }
  const int first = resumed ? resumed->steps_done : options.start ? options.start->steps_done : 0;
  // A resumed run goes on to the step count of the run that wrote the checkpoint.
  const int end = resumed ? options.train.steps : first + options.train.steps;
  if (resumed && end < first)
    throw Error(fmt::format("resume: the checkpoint in {} is at step {}, past the {} steps asked for", dir, first,
                            end));
  const int steps = end - first;
  check_injection(options.train.inject_overflow, plan, first, steps);
  for (const FaultSpec& f : fo.inject) {
    check_fault_spec(f, plan, first, end);
    if (f.kind == FaultSpec::Kind::CheckpointFail && (fo.checkpoint_every <= 0 || f.step % fo.checkpoint_every != 0))
      throw Error(fmt::format("--inject \"{}\": no checkpoint is written after {} steps (checkpoints every {} steps)",
                              f.text, f.step, fo.checkpoint_every));
  }
  FaultInjector injector(fo.inject);
  const bool stops_ranks = std::any_of(fo.inject.begin(), fo.inject.end(), [](const FaultSpec& f) {
    return f.kind == FaultSpec::Kind::Kill || f.kind == FaultSpec::Kind::Hang;
  });
  if (stops_ranks && fo.heartbeat_timeout >= options.watchdog_seconds)
    throw Error(fmt::format("heartbeat timeout {} s is not below the watchdog's {} s: a lost rank would end the run "
                            "as a stall instead of being restarted", fo.heartbeat_timeout, options.watchdog_seconds));
  if (const double backoffs = fo.retry_timeout * (std::ldexp(1.0, fo.max_retries) - 1);  // (the last failure escalates at once)
      backoffs >= options.watchdog_seconds)
    throw Error(fmt::format("retry timeout {} s: {} retries wait {:.1f} s in all, not below the watchdog's {} s",
                            fo.retry_timeout, fo.max_retries, backoffs, options.watchdog_seconds));

  const auto origin = std::chrono::steady_clock::now();
  CpuClock clock(origin);
  auto ns_of = [&](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t - origin).count();
  };
  // Builds the ranks and loads the state of step `at`: a checkpoint, else the start.
  auto build = [&](const std::optional<CheckpointManifest>& from) {
    auto w = std::make_unique<World>(config, plan, corpus, options, injector);
    if (from) {
      for (int r = 0; r < p * d; ++r)
        w->computes[static_cast<std::size_t>(r)]->restore(read_rank_checkpoint(dir, *from, r));
    } else {
      load_start_state(options.start, w->computes);
      if (options.start && !options.start->loss_scale.scales.empty())
        for (auto& c : w->computes) c->set_loss_scale_state(options.start->loss_scale);
    }
    return w;
  };
  std::unique_ptr<World> world = build(resumed);

  RunResult result;
  result.first_step = first;
  if (resumed) {
    result.earlier_loss_per_step = resumed->loss_per_step;
    result.earlier_iteration_seconds = resumed->iteration_seconds;
  }
  // Steps [first_step_of_history, first) as the checkpoints record them, then this run's.
  const int history_first = resumed ? first - static_cast<int>(resumed->loss_per_step.size()) : first;
  auto manifest_of = [&](int steps_done) {
    CheckpointManifest m;
    m.steps_done = steps_done;
    m.run = fingerprint;
    m.loss_per_step = result.earlier_loss_per_step;
    m.iteration_seconds = result.earlier_iteration_seconds;
    m.loss_per_step.insert(m.loss_per_step.end(), result.loss_per_step.begin(), result.loss_per_step.end());
    m.iteration_seconds.insert(m.iteration_seconds.end(), result.iteration_seconds.begin(),
                               result.iteration_seconds.end());
    m.first_step = history_first;
    return m;
  };
  const int trace_step = resolve_trace_step(options.trace_step, steps);
  result.trace = run_trace_header("cpu", plan, p * d);
  LossScaleState traced_scale;  // fp16: the scaler after the trace step
  int next = first;             // the step to run next
  int redo_until = first;       // steps before it are being run again after a restart
  int redoing = -1;             // the fault whose steps are being run again (result.faults)
  while (true) {
    injector.begin_attempt();
    std::int64_t step_start = 0;
    try {
      Watchdog watchdog(world->control, options.watchdog_seconds);
      // In one process a rank's beats stop only when an injected kill or hang stops it (a
      // real stall is the watchdog's), so they run only then: no false alarm elsewhere.
      std::optional<Heartbeats> heartbeats;
      if (stops_ranks) heartbeats.emplace(world->control, p * d, fo.heartbeat_period, fo.heartbeat_timeout);
      for (; next < end; ++next) {
        const int step = next - first;  // of this run
        std::vector<RankStepResult> outs(static_cast<std::size_t>(p * d));
        world->fabric.begin_step(next);
        step_start = clock.now_ns(ir::Stream::Compute);
        const std::int64_t wire_before = world->fabric.bytes_moved(CpuFabric::kDP);
        std::vector<std::thread> threads;
        for (int w = 0; w < p * d; ++w)
          threads.emplace_back([&, w] {
            Backend backend{world->computes[static_cast<std::size_t>(w)].get(),
                            world->transports[static_cast<std::size_t>(w)].get(), &clock, &injector,
                            heartbeats ? &*heartbeats : nullptr};
            if (options.pin_threads) pin_to_core(w);
            try {
              outs[static_cast<std::size_t>(w)] = run_rank_step(plan, w % p, w, next, backend, world->control);
            } catch (const Aborted&) {
            }
          });
        for (auto& t : threads) t.join();
        for (const RetryRecord& r : world->fabric.take_retries()) {
          result.retries += 1;
          result.retry_seconds += std::chrono::duration<double>(r.resent - r.failed).count();
          FaultRecord rec{"retry", r.step, r.from,
                          fmt::format("{} to rank {}: {} ({} bytes), sent again after {:.0f} ms (attempt {})", r.label,
                                      r.to, r.why, r.bytes, 1e3 * std::chrono::duration<double>(r.resent - r.failed).count(),
                                      r.attempt + 1)};
          result.faults.push_back(std::move(rec));
          if (!world->control.failed() && static_cast<std::size_t>(r.from) < outs.size()) {
            traces::TraceEvent e;
            e.rank = r.from;
            e.stream = static_cast<int>(r.comm == CpuFabric::kP2P ? ir::Stream::P2P : ir::Stream::DP);
            e.name = kind_text(r);
            e.peer = r.to;
            e.bytes = r.bytes;
            e.start_ns = ns_of(r.failed);
            e.dur_ns = ns_of(r.resent) - e.start_ns;
            outs[static_cast<std::size_t>(r.from)].events.push_back(std::move(e));
          }
        }
        if (world->control.failed()) {
          if (!world->control.recoverable()) throw Error(world->control.failure());
          FaultRecord rec;
          rec.step = next;
          rec.rank = heartbeats ? heartbeats->silent_rank() : -1;
          rec.kind = rec.rank >= 0 ? "rank lost" : "transfer failed";
          rec.detail = world->control.failure();
          rec.detect_seconds = heartbeats ? heartbeats->detection_seconds() : 0;
          rec.partial_seconds = static_cast<double>(clock.now_ns(ir::Stream::Compute) - step_start) * 1e-9;
          throw StepLost{std::move(rec)};
        }
        const std::int64_t step_end = clock.now_ns(ir::Stream::Compute);
        result.dp_wire_bytes.push_back(world->fabric.bytes_moved(CpuFabric::kDP) - wire_before);
        add_compute_seconds(result.rank_compute_seconds, outs);
        record_step(result, outs, step_end - step_start, step == trace_step, options.keep_step_traces, "cpu", plan,
                    p * d);
        if (redoing >= 0 && next < redo_until)
          result.faults[static_cast<std::size_t>(redoing)].redo_seconds += result.iteration_seconds.back();
        if (const LossScaler* scaler = world->computes.front()->loss_scaler()) {
          for (const auto& c : world->computes)
            if (!(c->loss_scaler()->last_step() == scaler->last_step()) || !(c->loss_scaler()->state() == scaler->state()))
              throw Error(fmt::format("step {}: the ranks' loss scalers disagree (internal error: every rank must "
                                      "step its scaler once, on the same agreed overflow flags)", next));
          result.loss_scale.push_back(scaler->last_step());
          if (step == trace_step) traced_scale = scaler->state();
          if (options.keep_step_traces)
            add_loss_scale_metadata(result.step_traces.back(), scaler->last_step(), scaler->state());
        }
        const int done = next + 1;
        if (fo.checkpoint_every > 0 && done % fo.checkpoint_every == 0) {
          std::vector<RankCheckpoint> ranks;
          int fail_rank = -1;
          for (int w = 0; w < p * d; ++w) {
            ranks.push_back(world->computes[static_cast<std::size_t>(w)]->checkpoint());
            if (fail_rank < 0 && injector.at_checkpoint(done, w)) fail_rank = w;
          }
          try {
            const CheckpointWrite written = write_checkpoint(dir, manifest_of(done), ranks, fail_rank);
            ++result.checkpoints_written;
            result.checkpoint_bytes += written.bytes;
            result.checkpoint_seconds += written.seconds;
            prune_checkpoints(dir, fo.checkpoint_keep);
          } catch (const Error& e) {  // training goes on; the last complete checkpoint stays the one to restart from
            FaultRecord rec{"ckpt-fail", next, fail_rank, e.what()};
            const auto last = latest_checkpoint(dir, fingerprint);
            rec.detail += last ? fmt::format("; the last complete checkpoint is the one after step {}",
                                             last->steps_done - 1)
                               : std::string("; there is no complete checkpoint yet");
            result.faults.push_back(std::move(rec));
          }
        }
      }
      break;
    } catch (StepLost& lost) {
      FaultRecord& rec = lost.record;
      // The ranks are stopped (every thread joined). Isolate the lost one: build the ranks
      // again and go back to the last complete checkpoint, or to the run's start.
      if (result.restarts >= fo.max_restarts) {
        std::string history;
        for (const auto& f : result.faults)
          if (f.restart_from >= 0) history += fmt::format("\n  step {}: {}", f.step, f.detail);
        throw Error(fmt::format("{}\ngave up after {} restart{} (--max-restarts {}){}", rec.detail, result.restarts,
                                result.restarts == 1 ? "" : "s", fo.max_restarts,
                                history.empty() ? "" : "; earlier faults:" + history));
      }
      const auto t0 = std::chrono::steady_clock::now();
      std::optional<CheckpointManifest> from = dir.empty() ? std::nullopt : latest_checkpoint(dir, fingerprint);
      if (from && from->steps_done < first) from.reset();
      if (!from && resumed) from = resumed;
      world.reset();
      world = build(from);
      const int back = from ? from->steps_done : first;
      rec.restart_from = back;
      rec.restart_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      rec.redone_steps = next - back;
      // This run's record of the steps it will take again.
      const auto keep = static_cast<std::size_t>(back - first);
      result.loss_per_step.resize(keep);
      result.iteration_seconds.resize(keep);
      result.dp_wire_bytes.resize(keep);
      if (result.loss_scale.size() > keep) result.loss_scale.resize(keep);
      if (result.step_traces.size() > keep) result.step_traces.resize(keep);
      redo_until = std::max(redo_until, next);
      next = back;
      ++result.restarts;
      result.faults.push_back(std::move(rec));
      redoing = static_cast<int>(result.faults.size()) - 1;
    }
  }
  result.unfired_faults = injector.unfired();
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
      add_loss_scale_metadata(result.trace, result.loss_scale.at(static_cast<std::size_t>(trace_step)), traced_scale);
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
  md["threads"] = std::to_string(p * d);
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
