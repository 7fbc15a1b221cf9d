// launch_common.cpp — the backend-independent parts of the run launchers.
#include "tdpipe/exec/launch_common.hpp"

#include <algorithm>
#include <chrono>
#include <limits>

#include <fmt/format.h>

#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec {

void check_runnable(const ir::Plan& plan) {
  if (!plan.lowered)
    throw Error(fmt::format("plan '{}' is not lowered: run ir::lower first (SEND/RECV are needed)",
                            plan.schedule));
  const int p = plan.num_ranks();
  if (p < 1) throw Error("plan has no ranks");
  if (static_cast<int>(plan.stage_of.size()) != p)
    throw Error(fmt::format("plan.stage_of has {} rows, expected one per rank ({})", plan.stage_of.size(), p));
}

std::vector<int> sharded_buckets(const ir::Plan& plan) {
  const int chunks = plan.chunks;
  std::vector<int> out(static_cast<std::size_t>(plan.num_ranks() * chunks), 0);
  bool any = false;
  for (int r = 0; r < plan.num_ranks(); ++r)
    for (const ir::Op& op : plan.ranks[static_cast<std::size_t>(r)])
      if (op.kind == ir::OpKind::REDUCE_SCATTER && op.chunk >= 0 && op.chunk < chunks) {
        ++out[static_cast<std::size_t>(r * chunks + op.chunk)];
        any = true;
      }
  if (!any) out.clear();
  return out;
}

Watchdog::Watchdog(RunControl& control, double timeout_seconds, std::function<void(std::string&)> extend_report,
                   std::function<void()> after_fail)
    : control_(control),
      timeout_(timeout_seconds),
      extend_report_(std::move(extend_report)),
      after_fail_(std::move(after_fail)),
      thread_([this] { loop(); }) {}

Watchdog::~Watchdog() {
  stop_ = true;
  thread_.join();
}

TimeLimit::TimeLimit(double seconds, std::function<void()> on_expiry)
    : thread_([this, seconds, f = std::move(on_expiry)] {
        std::unique_lock lock(mutex_);
        if (!done_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return cancelled_; })) f();
      }) {}

TimeLimit::~TimeLimit() {
  {
    std::lock_guard lock(mutex_);
    cancelled_ = true;
  }
  done_.notify_all();
  thread_.join();
}

int resolve_trace_step(int trace_step, int steps) {
  if (trace_step >= steps)
    throw Error(fmt::format("trace step {}: the run has {} step(s); expected a step in [0, {}] or -1 for the last",
                            trace_step, steps, steps - 1));
  return trace_step < 0 ? steps - 1 : trace_step;
}

void Watchdog::loop() {
  using clock = std::chrono::steady_clock;
  std::uint64_t last = control_.progress_count();
  auto since = clock::now();
  // Short timeouts (tests) are checked often enough to fire close to on time.
  const auto tick = std::chrono::milliseconds(static_cast<long>(std::clamp(timeout_ * 100.0, 1.0, 50.0)));
  while (!stop_) {
    std::this_thread::sleep_for(tick);
    const std::uint64_t now = control_.progress_count();
    if (now != last) {
      last = now;
      since = clock::now();
      continue;
    }
    if (std::chrono::duration<double>(clock::now() - since).count() < timeout_) continue;
    std::string report = control_.waiting_report();
    if (report.empty()) continue;
    if (extend_report_) extend_report_(report);
    control_.fail(fmt::format("watchdog: no op started or finished for {:.3g} s (if the run is healthy, this limit is "
                              "too low: raise it, e.g. tdpipe exec --watchdog); blocked:\n{}", timeout_, report));
    if (after_fail_) after_fail_();
    return;
  }
}

void rebase_to_zero(std::vector<traces::TraceEvent>& events) {
  std::int64_t t0 = std::numeric_limits<std::int64_t>::max();
  for (const auto& e : events) t0 = std::min(t0, e.start_ns);
  for (auto& e : events) e.start_ns -= t0;
}

std::vector<traces::TraceEvent> step_events(std::vector<RankStepResult>& outs, bool rebase) {
  std::vector<traces::TraceEvent> events;
  for (auto& o : outs)
    for (auto& e : o.events) events.push_back(std::move(e));
  if (rebase) rebase_to_zero(events);
  return events;
}

traces::Trace run_trace_header(const std::string& origin, const ir::Plan& plan, int ranks) {
  traces::Trace t;
  t.origin = origin;
  t.schedule = plan.schedule;
  t.scenario = plan.scenario.name;
  t.ranks = ranks;
  return t;
}

namespace cpu {

GptConfig model_config(const ir::Plan& plan, const TrainOptions& options) {
  GptConfig c = GptConfig::from_scenario(plan.scenario);
  c.seed = options.init_seed;
  c.partition = plan.stage_layers;
  // A plan without its partition (an older file): the scenario's list, if it gave one;
  // `auto` is the planner's choice, which the executor does not re-make.
  const auto& par = plan.scenario.parallel;
  if (c.partition.empty() && !par.layers_per_stage.empty() &&
      static_cast<int>(par.layers_per_stage.size()) == plan.virtual_stages())
    c.partition = par.layers_per_stage;
  if (c.partition.empty() && par.layers_per_stage_auto)
    throw Error(fmt::format("{}: the plan has no stage_layers and the scenario says layers_per_stage: auto; "
                            "re-plan it (tdpipe plan) so the partition is in the plan", plan.scenario.name));
  return c;
}

Corpus training_corpus(const TrainOptions& options) {
  return Corpus::load(options.corpus_path.empty() ? Corpus::default_path() : options.corpus_path);
}

void record_step(RunResult& result, std::vector<RankStepResult>& outs, std::int64_t step_ns, bool traced,
                 bool keep_every_trace, const std::string& origin, const ir::Plan& plan, int ranks, bool rebase) {
  double loss = 0;
  for (const auto& o : outs) loss += o.loss;
  result.loss_per_step.push_back(loss);
  result.iteration_seconds.push_back(static_cast<double>(step_ns) * 1e-9);
  // The trace's iteration (traces::compute_metrics): first op start to last op end.
  std::int64_t first = std::numeric_limits<std::int64_t>::max(), last = std::numeric_limits<std::int64_t>::min();
  for (const auto& o : outs)
    for (const auto& e : o.events) first = std::min(first, e.start_ns), last = std::max(last, e.end_ns());
  result.span_seconds.push_back(last > first ? static_cast<double>(last - first) * 1e-9 : 0.0);
  if (!traced && !keep_every_trace) return;
  traces::Trace t = run_trace_header(origin, plan, ranks);
  t.events = step_events(outs, rebase);
  if (keep_every_trace) result.step_traces.push_back(t);
  if (traced) result.trace.events = std::move(t.events);
}

void add_run_metadata(traces::Trace& trace, const ir::Plan& plan, const GptConfig& config,
                      const RunResult& result, int steps, int trace_step) {
  auto& md = trace.metadata;
  md["steps"] = std::to_string(steps);
  md["stage_layers"] = fmt::format("{}", fmt::join(plan.stage_layers, ","));
  md["trace_step"] = std::to_string(trace_step);
  md["pipeline"] = std::to_string(plan.num_ranks());
  md["data"] = std::to_string(std::max(1, plan.data));
  md["microbatches"] = std::to_string(plan.microbatches);
  md["chunks"] = std::to_string(plan.chunks);
  md["slices"] = std::to_string(plan.slices);
  md["iteration_seconds"] = fmt::format(
      "{:.9g}", result.iteration_seconds.empty() ? 0.0 : result.iteration_seconds[static_cast<std::size_t>(trace_step)]);
  md["loss"] = fmt::format("{:.17g}", result.loss_per_step.empty() ? 0.0 : result.loss_per_step.back());
  md["model"] = fmt::format("layers={} hidden={} heads={} ffn={} seq={} vocab={} micro_batch={}", config.layers,
                            config.hidden, config.heads, config.ffn, config.seq, config.vocab, config.micro_batch);
}

}  // namespace cpu
}  // namespace tdpipe::exec
