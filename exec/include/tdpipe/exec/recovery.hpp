// recovery.hpp — the step loop every launcher shares (CPU threads, CUDA loopback, one
// NCCL process): steps with injected faults (exec/faults.hpp), a checkpoint after every N-th
// step, and after a lost rank or transfer a restart of every rank from the newest
// complete checkpoint (or the run's start), at most max_restarts times; a run can also
// resume from a checkpoint after its process died.
//
// A backend's World is one incarnation of the ranks, what a restart throws away and
// builds again. It has
//   RunControl control;
//   std::vector<std::unique_ptr<C>> computes;  // world-rank order; C has checkpoint(),
//                                              // restore(const RankCheckpoint&), loss_scaler()
//   std::unique_ptr<Watchdog> watchdog(double seconds);
//   // Runs step `step` on every rank (threads joined, device work done) and returns
//   // when it started, in ns of the run's clock; a failure is left in `control`.
//   std::int64_t run_step(int step, FaultInjector&, Heartbeats*, std::vector<RankStepResult>&, RunResult&);
//   std::int64_t now_ns();
//   void step_done(RunResult&);  // a step finished: the backend's own per-step records
// and may have
//   void write_checkpoint(dir, manifest, states, fail_rank, step, RunResult&);  // its own
//                              // ranks' part of a checkpoint (one process of many)
//   int lost_rank();           // the rank a recoverable failure lost, when it knows
// build(from) may change `from` (processes agreeing on the checkpoint to load).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tdpipe/exec/checkpoint.hpp"
#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/exec/faults.hpp"
#include "tdpipe/exec/launch_common.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec::cpu {

/// Where a run with faults, checkpoints or resume starts, checked up front.
struct RecoveryStart {
  std::optional<CheckpointManifest> resumed;  ///< --resume: the checkpoint it goes on from
  int first = 0;                              ///< the first step this run takes
  int end = 0;                                ///< it takes steps [first, end)
  std::map<std::string, std::string> fingerprint;  ///< what a checkpoint must match
  bool stops_ranks = false;                   ///< a kill or hang is injected: heartbeats run
};

/// Checks the fault options and specs against the plan, finds the checkpoint to resume
/// from, refuses a folder holding another run's checkpoints; throws tdpipe::Error.
RecoveryStart prepare_recovery(const ir::Plan& plan, const GptConfig& config, const TrainOptions& train,
                               const std::optional<TrainState>& start, const FaultOptions& faults,
                               double watchdog_seconds, const Corpus& corpus);

/// Loads the ranks' state: checkpoint `from` of `dir`, else `start` (else the fresh model).
template <class Computes>
void load_world_state(Computes& computes, const std::string& dir, const std::optional<CheckpointManifest>& from,
                      const std::optional<TrainState>& start) {
  if (from) {
    for (auto& c : computes) c->restore(read_rank_checkpoint(dir, *from, c->world_rank()));
    return;
  }
  load_start_state(start, computes);
  if constexpr (requires { computes.front()->set_loss_scale_state(start->loss_scale); })
    if (start && !start->loss_scale.scales.empty())
      for (auto& c : computes) c->set_loss_scale_state(start->loss_scale);
}

struct RecoveryOptions {
  FaultOptions faults;
  double watchdog_seconds = 30;
  int trace_step = 0;        ///< of this run's steps (resolved)
  bool keep_step_traces = false;
  std::string origin;        ///< "cpu" | "cuda"
  /// Heartbeats between the world's ranks (one process: threads). Off in a run of one
  /// process per rank: an injected kill or hang then fails its process at once, and
  /// its peers learn of it through the transport (NCCL: the aborted communicator).
  bool heartbeats = true;
  int trace_ranks = 0;       ///< ranks of the run's traces (0: the world's computes)
  /// Each step's events start at 0 (false: kept on the clock's origin, for a launcher
  /// that aligns several processes' events itself).
  bool rebase_step_events = true;
};

namespace detail {
// A step stopped by a recoverable fault: the loop restarts from a checkpoint.
struct StepLost {
  FaultRecord record;
};
void write_step_checkpoint(const std::string& dir, CheckpointManifest manifest, std::vector<RankCheckpoint> ranks,
                           int fail_rank, int step, const FaultOptions& fo,
                           const std::map<std::string, std::string>& fingerprint, RunResult& result);
[[noreturn]] void give_up(const FaultRecord& lost, const RunResult& result, int max_restarts);
/// The fp16 loss scaler of one step, as trace metadata.
void add_loss_scale_metadata(traces::Trace& trace, const LossScaleStep& step, const LossScaleState& after);
}  // namespace detail

/// Runs steps [rs.first, rs.end) on `world`, rebuilding it with build(checkpoint or
/// nullopt) after each recoverable fault; fills the steps, faults, restarts and
/// checkpoints of `result`. `traced_scale` gets the loss scaler after the traced step.
template <class World, class Build>
void run_recovering(const ir::Plan& plan, const RecoveryStart& rs, const RecoveryOptions& ro,
                    FaultInjector& injector, Build build, std::unique_ptr<World>& world, RunResult& result,
                    LossScaleState& traced_scale) {
  const FaultOptions& fo = ro.faults;
  const std::string& dir = fo.checkpoint_dir;
  const int first = rs.first, end = rs.end;
  const int ranks = static_cast<int>(world->computes.size());
  const int trace_ranks = ro.trace_ranks > 0 ? ro.trace_ranks : ranks;
  result.first_step = first;
  if (rs.resumed) {
    result.earlier_loss_per_step = rs.resumed->loss_per_step;
    result.earlier_iteration_seconds = rs.resumed->iteration_seconds;
  }
  // Steps [first_step_of_history, first) as the checkpoints record them, then this run's.
  const int history_first = rs.resumed ? first - static_cast<int>(rs.resumed->loss_per_step.size()) : first;
  auto manifest_of = [&](int steps_done) {
    CheckpointManifest m;
    m.steps_done = steps_done;
    m.run = rs.fingerprint;
    m.loss_per_step = result.earlier_loss_per_step;
    m.iteration_seconds = result.earlier_iteration_seconds;
    m.loss_per_step.insert(m.loss_per_step.end(), result.loss_per_step.begin(), result.loss_per_step.end());
    m.iteration_seconds.insert(m.iteration_seconds.end(), result.iteration_seconds.begin(),
                               result.iteration_seconds.end());
    m.first_step = history_first;
    return m;
  };
  int next = first;        // the step to run next
  int redo_until = first;  // steps before it are being run again after a restart
  int redoing = -1;        // the fault whose steps are being run again (result.faults)
  while (true) {
    injector.begin_attempt();
    std::int64_t step_start = 0;
    try {
      const std::unique_ptr<Watchdog> watchdog = world->watchdog(ro.watchdog_seconds);
      // In one process a rank's beats stop only when an injected kill or hang stops it (a
      // real stall is the watchdog's), so they run only then: no false alarm elsewhere.
      std::optional<Heartbeats> heartbeats;
      if (rs.stops_ranks && ro.heartbeats) heartbeats.emplace(world->control, ranks, fo.heartbeat_period, fo.heartbeat_timeout);
      for (; next < end; ++next) {
        const int step = next - first;  // of this run
        std::vector<RankStepResult> outs(static_cast<std::size_t>(ranks));
        step_start = world->run_step(next, injector, heartbeats ? &*heartbeats : nullptr, outs, result);
        if (world->control.failed()) {
          if (!world->control.recoverable()) throw Error(world->control.failure());
          FaultRecord rec;
          rec.step = next;
          rec.rank = heartbeats ? heartbeats->silent_rank() : -1;
          if constexpr (requires { world->lost_rank(); })  // (a process that knows its own fault)
            if (rec.rank < 0) rec.rank = world->lost_rank();
          rec.kind = rec.rank >= 0 ? "rank lost" : "transfer failed";
          rec.detail = world->control.failure();
          rec.detect_seconds = heartbeats ? heartbeats->detection_seconds() : 0;
          rec.partial_seconds = static_cast<double>(world->now_ns() - step_start) * 1e-9;
          throw detail::StepLost{std::move(rec)};
        }
        const std::int64_t step_end = world->now_ns();
        world->step_done(result);
        std::vector<double> busy(outs.size(), 0.0);  // per world rank: its compute stream's seconds
        for (std::size_t w = 0; w < outs.size(); ++w)
          for (const auto& e : outs[w].events)
            if (e.stream == static_cast<int>(ir::Stream::Compute)) busy[w] += static_cast<double>(e.dur_ns) * 1e-9;
        result.rank_compute_seconds.resize(outs.size(), 0.0);
        for (std::size_t w = 0; w < outs.size(); ++w) result.rank_compute_seconds[w] += busy[w];
        record_step(result, outs, step_end - step_start, step == ro.trace_step, ro.keep_step_traces, ro.origin, plan,
                    trace_ranks, ro.rebase_step_events);
        if (redoing >= 0 && next < redo_until)
          result.faults[static_cast<std::size_t>(redoing)].redo_seconds += result.iteration_seconds.back();
        if (const LossScaler* scaler = world->computes.front()->loss_scaler()) {
          for (const auto& c : world->computes)
            if (!(c->loss_scaler()->last_step() == scaler->last_step()) || !(c->loss_scaler()->state() == scaler->state()))
              throw Error(fmt::format("step {}: the ranks' loss scalers disagree (internal error: every rank must "
                                      "step its scaler once, on the same agreed overflow flags)", next));
          result.loss_scale.push_back(scaler->last_step());
          if (step == ro.trace_step) traced_scale = scaler->state();
          if (ro.keep_step_traces)
            detail::add_loss_scale_metadata(result.step_traces.back(), scaler->last_step(), scaler->state());
        }
        const int done = next + 1;
        if (fo.checkpoint_every > 0 && done % fo.checkpoint_every == 0) {
          std::vector<RankCheckpoint> states;
          int fail_rank = -1;
          for (auto& c : world->computes) {
            states.push_back(c->checkpoint());
            if (fail_rank < 0 && injector.at_checkpoint(done, states.back().world_rank)) fail_rank = states.back().world_rank;
          }
          if constexpr (requires { world->write_checkpoint(dir, manifest_of(done), states, fail_rank, next, result); })
            world->write_checkpoint(dir, manifest_of(done), states, fail_rank, next, result);  // its own processes'
          else
            detail::write_step_checkpoint(dir, manifest_of(done), std::move(states), fail_rank, next, fo,
                                          rs.fingerprint, result);
          if (world->control.failed()) {  // (a multi-process checkpoint's barrier lost a peer)
            if (!world->control.recoverable()) throw Error(world->control.failure());
            FaultRecord rec;
            rec.step = next;
            rec.kind = "transfer failed";
            rec.detail = world->control.failure();
            throw detail::StepLost{std::move(rec)};
          }
        }
      }
      break;
    } catch (detail::StepLost& lost) {
      FaultRecord& rec = lost.record;
      // The ranks are stopped (every thread joined). Isolate the lost one: build the ranks
      // again and go back to the last complete checkpoint, or to the run's start.
      if (result.restarts >= fo.max_restarts) detail::give_up(rec, result, fo.max_restarts);
      const auto t0 = std::chrono::steady_clock::now();
      std::optional<CheckpointManifest> from = dir.empty() ? std::nullopt : latest_checkpoint(dir, rs.fingerprint);
      if (from && from->steps_done < first) from.reset();
      if (!from && rs.resumed) from = rs.resumed;
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
      if (result.dp_wire_bytes.size() > keep) result.dp_wire_bytes.resize(keep);
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
}

}  // namespace tdpipe::exec::cpu
