// launch_common.hpp — what every launcher (CPU threads, CUDA loopback, CUDA NCCL)
// does the same way around the interpreter: check the plan, watch for a stalled run,
// build the model and corpus, and assemble the measured trace and its metadata.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/exec/interpreter.hpp"
#include "tdpipe/exec/run_control.hpp"
#include "tdpipe/ir/plan.hpp"
#include "tdpipe/traces/trace.hpp"

namespace tdpipe::exec {

/// Throws tdpipe::Error unless `plan` is lowered, has ranks and one stage_of row per rank.
void check_runnable(const ir::Plan& plan);

/// A plan with a sharded optimizer (REDUCE_SCATTER buckets): its buckets per (rank,
/// chunk), at [rank · chunks + chunk]; empty when the plan has none. After such a run
/// each replica holds reduced gradients and Adam moments only in its own segments
/// (owned_ranges), and a launcher assembles replica 0's report from their owners.
std::vector<int> sharded_buckets(const ir::Plan& plan);

/// Fails the run when nothing started or ended for `timeout_seconds` while a thread
/// waits. `extend_report` may add lines to the blocked-thread report before the run
/// fails (a transport's unmatched transfers); `after_fail` runs once it has failed
/// (to abort a transport whose waits do not poll RunControl).
class Watchdog {
 public:
  Watchdog(RunControl& control, double timeout_seconds, std::function<void(std::string&)> extend_report = {},
           std::function<void()> after_fail = {});
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  void loop();
  RunControl& control_;
  double timeout_;
  std::function<void(std::string&)> extend_report_;
  std::function<void()> after_fail_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

/// Runs `on_expiry` (on its own thread) unless destroyed within `seconds`: for a call
/// that cannot be interrupted or polled — ncclCommInitRank waits for every process of
/// the world, forever if one died before joining — the guard can only end the process.
class TimeLimit {
 public:
  TimeLimit(double seconds, std::function<void()> on_expiry);
  ~TimeLimit();
  TimeLimit(const TimeLimit&) = delete;
  TimeLimit& operator=(const TimeLimit&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  bool cancelled_ = false;
  std::thread thread_;
};

/// Shifts `events` so that the earliest starts at 0 (no-op when empty).
void rebase_to_zero(std::vector<traces::TraceEvent>& events);
/// One step's events of every rank, moved out of `outs` in rank order and (`rebase`)
/// rebased to 0.
std::vector<traces::TraceEvent> step_events(std::vector<RankStepResult>& outs, bool rebase = true);

/// A run's trace before events: origin ("cpu", "cuda"), the plan's schedule and scenario, ranks.
traces::Trace run_trace_header(const std::string& origin, const ir::Plan& plan, int ranks);

/// The step whose trace is kept: `trace_step`, or the last when negative. Throws
/// tdpipe::Error when it names a step the run does not have.
int resolve_trace_step(int trace_step, int steps);

namespace cpu {

/// The model a plan trains: its scenario's, cut into the plan's stage_layers,
/// initialised from options.init_seed.
GptConfig model_config(const ir::Plan& plan, const TrainOptions& options);
/// The training text: options.corpus_path, or the bundled corpus when empty.
Corpus training_corpus(const TrainOptions& options);

/// Records a finished step in `result`: the ranks' summed loss, its time, and its
/// timeline (a `origin` trace of `ranks` ranks) when it is the traced step or every
/// step's timeline is kept.
void record_step(RunResult& result, std::vector<RankStepResult>& outs, std::int64_t step_ns, bool traced,
                 bool keep_every_trace, const std::string& origin, const ir::Plan& plan, int ranks,
                 bool rebase = true);

/// Metadata every backend records: steps, trace_step, pipeline/data/microbatches/
/// chunks/slices, the traced step's iteration time, the final loss and the model.
void add_run_metadata(traces::Trace& trace, const ir::Plan& plan, const GptConfig& config,
                      const RunResult& result, int steps, int trace_step);

}  // namespace cpu
}  // namespace tdpipe::exec
