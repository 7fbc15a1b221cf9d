// faults.hpp — faults injected into a run so that recovery can be tested, and how a
// run notices them: a fault spec (`kill:rank=1,step=3,op=F5`), the injector the ranks
// and the transport consult, heartbeats that find a rank that stopped, and the record
// of what happened and what it cost.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tdpipe/exec/run_control.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/plan.hpp"

namespace tdpipe::exec {

/// One injected fault. Ranks are world ranks (replica · p + pipeline rank); steps count
/// from the first step ever (a resumed run's steps go on from its checkpoint).
struct FaultSpec {
  enum class Kind { Kill, Hang, Drop, Corrupt, Slow, CheckpointFail };
  Kind kind = Kind::Kill;
  int rank = 0;
  int step = 0;     ///< kill, hang, drop, corrupt: the step; slow: from this step on; ckpt-fail: steps done
  std::string op;   ///< kill, hang: the op ("F5" matches F5, F5.c1:s0, …); empty: the step's first op
  int peer = -1;    ///< drop, corrupt: the receiving world rank
  int message = 1;  ///< drop, corrupt: the n-th message from rank to peer in the step (1-based)
  int times = 1;    ///< drop, corrupt: deliveries in a row it spoils; kill, hang: runs of the step it fires in
  double factor = 1;  ///< slow: every compute op takes factor × its time
  std::string text;   ///< as written, for messages
};

const char* to_string(FaultSpec::Kind kind);

/// Does a fault of this kind hold its rank's thread (kill and hang stop it, slow sleeps
/// it)? Such a rank cannot share its thread with other ranks (exec::run_rank_steps).
inline bool holds_thread(FaultSpec::Kind kind) {
  return kind == FaultSpec::Kind::Kill || kind == FaultSpec::Kind::Hang || kind == FaultSpec::Kind::Slow;
}

/// Parses "KIND:key=value,…" (kinds kill, hang, drop, corrupt, slow, ckpt-fail). Throws
/// tdpipe::Error naming the spec, the key and what was expected.
FaultSpec parse_fault_spec(std::string_view text);

/// Throws tdpipe::Error naming the spec when it cannot fire in a run of `plan` taking
/// steps [first, end): a rank, peer or step outside the run, an op the rank does not have.
void check_fault_spec(const FaultSpec& spec, const ir::Plan& plan, int first, int end);

/// A fault that stops a rank or a transfer. The launcher restarts the run from its last
/// complete checkpoint on it (RunControl::fail(..., recoverable)); other errors end the run.
struct RankFault : Error {
  using Error::Error;
};

/// The faults of one run, shared by every thread; each fires as often as its spec says,
/// counted over the whole run (restarts included), so a restarted step runs clean.
class FaultInjector {
 public:
  explicit FaultInjector(std::vector<FaultSpec> specs = {});
  bool empty() const { return specs_.empty(); }
  const std::vector<FaultSpec>& specs() const { return specs_; }

  /// Op `op_text` of world rank `rank` is about to start in step `step`: the kill or hang
  /// that fires there (its spec), else null.
  const FaultSpec* at_op(int rank, int step, std::string_view op_text);
  /// The `attempt`-th delivery (1-based) of the `message`-th message from `from` to `to`
  /// in step `step`: the drop or corrupt that spoils it, else null.
  const FaultSpec* at_delivery(int from, int to, int step, int message, int attempt);
  /// The slowdown of world rank `rank` in step `step` (1: none).
  double slow_factor(int rank, int step);
  /// Whether world rank `rank`'s file of the checkpoint of `steps_done` dies half-way.
  const FaultSpec* at_checkpoint(int steps_done, int rank);
  /// A new run of the steps began (a restart): a kill or hang fires at most once per run.
  void begin_attempt();
  /// The specs that never fired, as written.
  std::vector<std::string> unfired() const;

 private:
  std::vector<FaultSpec> specs_;
  mutable std::mutex mu_;
  std::vector<int> fired_;  ///< per spec; guarded by mu_
  std::vector<int> fired_attempt_;  ///< per spec: the attempt it last fired in (−1: none)
  int attempt_ = 0;
};

/// What went wrong in a run and what it cost.
struct FaultRecord {
  std::string kind;    ///< "kill", "hang", "drop", "corrupt", "slow", "ckpt-fail", "escalated", …
  int step = -1;       ///< the step it hit
  int rank = -1;       ///< world rank
  std::string detail;  ///< what was seen, as the run reported it
  /// Recovery: the step the run went back to (the last complete checkpoint, or the run's
  /// start), −1 when it did not restart (a retried transfer, a failed checkpoint).
  int restart_from = -1;
  double detect_seconds = 0;   ///< from the fault to its detection (heartbeats: their timeout)
  double partial_seconds = 0;  ///< of the step that failed, the time spent before it was stopped
  double restart_seconds = 0;  ///< stopping the ranks, rebuilding them, loading the checkpoint
  double redo_seconds = 0;     ///< re-running the steps between the checkpoint and the failure
  int redone_steps = 0;
  double lost_seconds() const { return partial_seconds + restart_seconds + redo_seconds; }
};

/// Heartbeats of a run's world ranks: each rank's beat thread marks it alive every
/// `period` seconds while the rank is up; a monitor fails the run (recoverably) when one
/// has not beaten for `timeout` seconds, naming it. stop() is what a dead or frozen
/// rank's process does: its beats end.
class Heartbeats {
 public:
  Heartbeats(RunControl& control, int ranks, double period, double timeout);
  ~Heartbeats();
  Heartbeats(const Heartbeats&) = delete;
  Heartbeats& operator=(const Heartbeats&) = delete;
  /// World rank `rank` stops beating (it died or froze).
  void stop(int rank);
  /// Seconds from the first stop() to the monitor's detection (0 if none).
  double detection_seconds() const { return detect_ns_.load() / 1e9; }
  /// The rank the monitor found silent (−1: none).
  int silent_rank() const { return silent_.load(); }

 private:
  using Clock = std::chrono::steady_clock;
  void beat_loop(int rank);
  void monitor_loop();
  RunControl& control_;
  double period_, timeout_;
  std::vector<std::atomic<std::int64_t>> last_beat_ns_;  ///< since origin_
  std::vector<std::atomic<bool>> stopped_;
  std::atomic<std::int64_t> stopped_at_ns_{-1};
  std::atomic<std::int64_t> detect_ns_{0};
  std::atomic<int> silent_{-1};
  std::atomic<bool> quit_{false};
  Clock::time_point origin_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
};

/// Fault handling of a run: what to inject, how to detect and retry, where to checkpoint.
struct FaultOptions {
  std::vector<FaultSpec> inject;
  double heartbeat_period = 0.1;   ///< seconds between a rank's heartbeats
  double heartbeat_timeout = 1.0;  ///< seconds of silence before a rank is declared lost
  /// A lost message is noticed (its acknowledgement missing) after retry_timeout · 2^(k−1)
  /// for its k-th retry; a corrupt one is retried after the same backoff.
  double retry_timeout = 0.02;
  int max_retries = 3;             ///< retries of one transfer before it escalates to a rank fault
  int max_restarts = 3;            ///< restarts from a checkpoint before the run gives up
  std::string checkpoint_dir;      ///< "" : no checkpoints (a restart goes back to the run's start)
  int checkpoint_every = 0;        ///< steps between checkpoints (0: none)
  int checkpoint_keep = 2;         ///< complete checkpoints kept (older ones removed)
  bool resume = false;             ///< continue from checkpoint_dir's last complete checkpoint
};

/// CRC-32 (zlib's) of `n` bytes: the checksum of messages and checkpoint files.
std::uint32_t crc32_of(const void* data, std::size_t n);

/// Throws tdpipe::Error naming the option when `options` are out of range.
void check_fault_options(const FaultOptions& options);

}  // namespace tdpipe::exec
