// cpu_calibrate.cpp — per-op medians from measured CPU runs, transport
// micro-benchmarks, and the platform description, as a traces::Profile.
#include "tdpipe/exec/cpu/calibrate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <thread>

#include <fmt/format.h>

#include "tdpipe/exec/interpreter.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/traces/handoff.hpp"
#include "tdpipe/traces/metrics.hpp"
#include "tdpipe/traces/sharing.hpp"

namespace tdpipe::exec::cpu {

using traces::median;
namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  return "unknown CPU";
}

// Seconds per one-way SEND/RECV of `bytes` between two threads (ping-pong / 2).
double p2p_seconds(std::int64_t bytes, int repeats) {
  RunControl control;
  CpuFabric fabric(control);
  const std::int64_t elems = std::max<std::int64_t>(1, bytes / 8);
  auto side = [&](int self, int peer, bool sends_first) {
    Buffer out = host_buffer(elems), in = host_buffer(elems);
    for (int i = 0; i < repeats + 1; ++i)
      for (int half = 0; half < 2; ++half) {
        P2POp op;
        const bool send = (half == 0) == sends_first;
        op.kind = send ? ir::OpKind::SEND : ir::OpKind::RECV;
        op.peer = peer;
        op.key = TensorKey{ir::OpKind::F, 0, i, 0};
        op.buffer = send ? out : in;
        op.label = "calibration ping-pong";
        fabric.post(CpuFabric::kP2P, self, std::span<P2POp>(&op, 1));
      }
  };
  std::thread b([&] { side(1, 0, false); });
  const auto t0 = std::chrono::steady_clock::now();
  side(0, 1, true);
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  b.join();
  return total / (2.0 * (repeats + 1));
}

// Seconds per 2-member ring all-reduce of `bytes`.
double allreduce_seconds(std::int64_t bytes, int repeats) {
  RunControl control;
  CpuFabric fabric(control);
  const std::int64_t elems = std::max<std::int64_t>(2, bytes / 8);
  auto member = [&](int replica) {
    CpuTransport t(fabric, replica, 0, 1, 2);
    Buffer buf = host_buffer(elems);
    for (int i = 0; i < repeats; ++i) t.all_reduce(buf, i);
  };
  std::thread b([&] { member(1); });
  const auto t0 = std::chrono::steady_clock::now();
  member(0);
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  b.join();
  return total / repeats;
}

}  // namespace

namespace {
using WorkSamples = std::map<std::tuple<int, int, int>, std::vector<double>>;  // (kind, stage, slice) → s

// Each compute op's work under processor sharing of `capacity`, grouped by the ops
// that do the same work.
WorkSamples work_samples(const ir::Plan& plan, const std::vector<traces::Trace>& measured, double capacity) {
  const int p = plan.num_ranks();
  WorkSamples samples;
  for (const auto& t : measured) {
    const std::vector<double> rate = traces::shared_rates(t, capacity);
    for (std::size_t i = 0; i < t.events.size(); ++i) {
      const traces::TraceEvent& e = t.events[i];
      if (!e.kind || !ir::is_compute(*e.kind)) continue;
      const int r = e.rank % p;
      const int stage = *e.kind == ir::OpKind::OPT ? stage_of(plan, r, 0) : stage_of(plan, r, e.chunk);
      samples[{static_cast<int>(*e.kind), stage, *e.kind == ir::OpKind::OPT ? -1 : e.slice}].push_back(
          static_cast<double>(e.dur_ns) * 1e-9 * rate[i]);
    }
  }
  return samples;
}

// Σ over groups of the squared deviations of ln(work) from the group's mean.
double log_spread(const WorkSamples& samples) {
  double total = 0;
  for (const auto& [key, v] : samples) {
    double mean = 0;
    for (double w : v) mean += std::log(std::max(w, 1e-12));
    mean /= static_cast<double>(v.size());
    for (double w : v) total += std::pow(std::log(std::max(w, 1e-12)) - mean, 2);
  }
  return total;
}
}  // namespace

CapacityFit fit_shared_capacity(const ir::Plan& plan, const std::vector<traces::Trace>& measured,
                                double max_capacity, double fallback) {
  CapacityFit fit;
  fit.capacity = fallback;
  fit.spread_at_fallback = log_spread(work_samples(plan, measured, fallback));
  double best = std::numeric_limits<double>::infinity(), worst = 0;
  for (double c = 1.0; c <= std::max(1.0, max_capacity) + 1e-9; c += 0.05) {
    const double spread = log_spread(work_samples(plan, measured, c));
    worst = std::max(worst, spread);
    if (spread < best - 1e-12) {
      best = spread;
      fit.capacity = c;
    }
  }
  fit.spread = best;
  // Where no op ever overlaps another the capacity changes nothing: keep the fallback.
  fit.informative = std::isfinite(best) && worst > best * 1.01 + 1e-12;
  if (!fit.informative) {
    fit.capacity = fallback;
    fit.spread = fit.spread_at_fallback;
  }
  return fit;
}

double apply_sharing_choice(const SharingChoice& choice, double backend_default, const ir::Plan& plan,
                            const std::vector<traces::Trace>& measured, traces::Profile& profile) {
  const int ranks = plan.num_ranks() * std::max(1, plan.data);
  const CapacityFit fit = fit_shared_capacity(plan, measured, ranks, backend_default);
  const double used = choice.fit ? fit.capacity : choice.capacity > 0 ? choice.capacity : backend_default;
  profile.metadata["fitted_shared_capacity"] =
      fit.informative ? fmt::format("{:.2f} (ln-work spread {:.3g}; {:.3g} at {:.3g})", fit.capacity, fit.spread,
                                    fit.spread_at_fallback, backend_default)
                      : std::string("no information (no op overlapped another)");
  profile.metadata["shared_capacity"] =
      fmt::format("{:.3g} ({})", used, choice.fit ? "fitted" : choice.capacity > 0 ? "given" : "backend default");
  return used;
}

std::vector<traces::ProfileOp> profile_ops(const ir::Plan& plan, const std::vector<traces::Trace>& measured,
                                          double shared_capacity) {
  const WorkSamples samples = work_samples(plan, measured, shared_capacity);
  std::vector<traces::ProfileOp> ops;
  for (const auto& [key, v] : samples) {
    traces::ProfileOp op;
    op.kind = static_cast<ir::OpKind>(std::get<0>(key));
    op.virtual_stage = std::get<1>(key);
    op.slice = std::get<2>(key);
    const auto [a, b] = ir::layer_range(plan.stage_layers, plan.scenario.model.layers, op.virtual_stage, plan.virtual_stages());
    op.layers = b - a;
    // The mean, not the median: an iteration is a sum of op times, whose expectation is
    // the sum of their means; on a shared machine preemption skews durations right, and
    // medians predicted every schedule too fast.
    op.seconds = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
    op.samples = static_cast<int>(v.size());
    ops.push_back(op);
  }
  return ops;
}

double median_trace_iteration_seconds(const std::vector<traces::Trace>& traces) {
  std::vector<double> spans;
  for (const auto& t : traces) spans.push_back(static_cast<double>(traces::compute_metrics(t).iteration_ns) * 1e-9);
  return median(std::move(spans));
}

// The fastest of a few rounds: on a shared machine preemption only ever adds time,
// and a single slow small-message round must not hide the bandwidth term.
template <class Measure>
double best_of(int rounds, Measure measure) {
  double best = measure();
  for (int i = 1; i < rounds; ++i) best = std::min(best, measure());
  return best;
}

TransportMeasurement measure_transport(int repeats) {
  constexpr int kRounds = 5;
  TransportMeasurement m;
  const std::int64_t small = 8, large = 4 << 20;
  const int large_repeats = std::max(4, repeats / 20);
  const double t_small = best_of(kRounds, [&] { return p2p_seconds(small, repeats); });
  const double t_large = best_of(kRounds, [&] { return p2p_seconds(large, large_repeats); });
  m.p2p.latency_seconds = t_small;
  m.p2p.bytes_per_second = t_large > t_small ? static_cast<double>(large - small) / (t_large - t_small) : 0;
  const double a_small = best_of(kRounds, [&] { return allreduce_seconds(16, repeats); });
  const double a_large = best_of(kRounds, [&] { return allreduce_seconds(large, large_repeats); });
  m.collective.latency_seconds = a_small;
  // nccl-tests' bus bandwidth: algbw · 2(n − 1)/n, which is algbw for n = 2.
  m.collective.bytes_per_second =
      a_large > a_small ? static_cast<double>(large - 16) / (a_large - a_small) : 0;
  return m;
}

traces::Profile calibrate(const std::vector<ir::Plan>& plans, const CalibrateOptions& options) {
  if (plans.empty()) throw Error("calibrate: no plan to measure");
  traces::Profile prof = calibrate(plans.front(), options);
  for (std::size_t i = 1; i < plans.size(); ++i) {
    const traces::Profile more = calibrate(plans[i], options);
    for (const auto& op : more.ops) {
      const bool known = std::any_of(prof.ops.begin(), prof.ops.end(), [&](const traces::ProfileOp& o) {
        return o.kind == op.kind && o.virtual_stage == op.virtual_stage && o.slice == op.slice;
      });
      if (!known) prof.ops.push_back(op);
    }
    prof.metadata["schedule"] += "+" + plans[i].schedule;
  }
  return prof;
}

traces::Profile calibrate(const ir::Plan& plan, const CalibrateOptions& options) {
  CpuRunOptions run;
  run.train = options.train;
  run.train.steps = options.warmup_steps + options.steps;
  run.keep_step_traces = true;
  // A thread per rank, whatever the cores: the profile's model is rank threads sharing
  // the machine's cores (processor sharing), not ranks taking turns on a thread.
  run.rank_threads = plan.num_ranks() * std::max(1, plan.data);
  const RunResult r = run_cpu(plan, run);
  const std::vector<traces::Trace> measured(r.step_traces.begin() + options.warmup_steps, r.step_traces.end());

  traces::Profile prof;
  prof.scenario = plan.scenario.name;
  prof.stages = plan.stages;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Rank threads share this machine's cores (by default as many as it has): op times
  // become work alone on a core.
  prof.platform.shared_capacity = apply_sharing_choice(options.sharing, cores, plan, measured, prof);
  prof.ops = profile_ops(plan, measured, prof.platform.shared_capacity);
  const TransportMeasurement tm = measure_transport(options.transport_repeats);
  prof.p2p = tm.p2p;
  prof.collective = tm.collective;
  // The ping-pong spins on two warm threads; inside the schedule a hand-off also wakes
  // the p2p and compute threads on both sides: fit the latency from the run itself.
  traces::fit_profile_p2p_latency(prof, plan, measured);
  const int ranks = plan.num_ranks() * std::max(1, plan.data);
  prof.platform.backend = "cpu";
  prof.platform.device = cpu_model();
  prof.platform.cores = cores;
  prof.platform.ranks = ranks;
  prof.platform.threads_per_rank = 1;
  prof.platform.description = fmt::format(
      "{} rank threads (one compute thread each, plus p2p/dp stream threads that mostly wait) "
      "sharing {} cores; op times are each op's work alone on a core, deduced from the running schedule "
      "by processor sharing of the cores among the compute ops running at once",
      ranks, cores);
  std::vector<double> iters(r.iteration_seconds.begin() + options.warmup_steps, r.iteration_seconds.end());
  prof.metadata["schedule"] = plan.schedule;
  prof.metadata["chunks"] = std::to_string(plan.chunks);
  prof.metadata["slices"] = std::to_string(plan.slices);
  if (!plan.slice_tokens.empty()) prof.metadata["slice_tokens"] = fmt::format("{}", fmt::join(plan.slice_tokens, ","));
  prof.metadata["data"] = std::to_string(plan.data);
  prof.metadata["measured_steps"] = std::to_string(options.steps);
  prof.metadata["median_iteration_seconds"] = fmt::format("{:.9g}", median(iters));
  prof.metadata["median_trace_iteration_seconds"] = fmt::format("{:.9g}", median_trace_iteration_seconds(measured));
  prof.metadata["dtype"] = "f64";
  return prof;
}

}  // namespace tdpipe::exec::cpu
