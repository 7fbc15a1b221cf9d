// run_control.hpp — shared state of one run across rank/stream threads: the first
// failure (which stops everyone), a progress counter and what each thread is
// waiting on, so a watchdog can name every blocked rank, its op and its peer.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "tdpipe/ir/op.hpp"

namespace tdpipe::exec {

/// Thrown inside a thread whose run was aborted by another thread's failure.
struct Aborted {};

class RunControl {
 public:
  /// Records the first failure, wakes every waiter. Later failures are ignored.
  /// `recoverable`: a lost rank or transfer (exec/faults.hpp), after which a launcher may
  /// restart the run from a checkpoint; otherwise an error in the plan or the program.
  void fail(const std::string& message, bool recoverable = false);
  bool failed() const { return failed_.load(); }
  /// Whether the first failure was recoverable.
  bool recoverable() const { return recoverable_.load(); }
  /// The first failure's message ("" if none).
  std::string failure() const;

  /// Counts progress (an op started or ended); the watchdog fires when it stalls.
  void progress() { progress_.fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t progress_count() const { return progress_.load(std::memory_order_relaxed); }

  /// What thread (rank, stream) is blocked on now, e.g. "SEND(F0>r1) waiting for
  /// rank 1"; "" when it is not blocked.
  void set_waiting(int rank, ir::Stream stream, std::string what);
  /// The same, described only if a report asks (waits are many, reports rare); `what`
  /// must read only what does not change while it is set, and is called under a lock of
  /// this RunControl's own, never with mutex() held. Null: not blocked.
  using Describe = std::function<std::string()>;
  void set_waiting(int rank, ir::Stream stream, Describe what);
  /// One line per blocked thread: "rank R (stream): what".
  std::string waiting_report() const;

  /// Shared lock for the host-side waits of the interpreter and the in-process
  /// transport. wait() throws Aborted once the run failed.
  std::mutex& mutex() { return mu_; }
  /// Waits on the run's shared condition (woken by notify_all()).
  template <typename Pred>
  void wait(std::unique_lock<std::mutex>& lock, Pred pred) {
    wait(lock, cv_, pred);
  }
  /// Waits on a caller's own condition, so that an event wakes only the threads it
  /// concerns (a rank's streams, a transport peer) instead of every thread of the run.
  /// A failure is noticed within kAbortPollMs even if nobody notifies `cv`.
  template <typename Pred>
  void wait(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, Pred pred) {
    while (!pred()) {
      if (failed()) throw Aborted{};
      cv.wait_for(lock, std::chrono::milliseconds(kAbortPollMs));
    }
    if (failed()) throw Aborted{};
  }
  void notify_all() { cv_.notify_all(); }
  static constexpr int kAbortPollMs = 20;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> failed_{false};
  std::atomic<bool> recoverable_{false};
  std::atomic<std::uint64_t> progress_{0};
  mutable std::mutex info_mu_;
  std::string failure_;
  std::map<std::pair<int, int>, Describe> waiting_;  ///< cleared entries stay, empty
};

}  // namespace tdpipe::exec
