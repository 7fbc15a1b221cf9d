// run.hpp — train a lowered plan on the CPU backend (a thread per rank, and per
// dp/copy stream, a watchdog), and the single-device reference run of the same model/data.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tdpipe/exec/cpu/backend.hpp"
#include "tdpipe/exec/cpu/gpt.hpp"
#include "tdpipe/exec/faults.hpp"
#include "tdpipe/exec/loss_scale.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/plan.hpp"
#include "tdpipe/traces/trace.hpp"

namespace tdpipe::exec::cpu {

/// What training carries from one run to the next: every parameter and both Adam
/// moments by name (any partition of the model holds the same names), and the steps
/// done (Adam's bias correction and the data position follow it). Not 1-bit Adam's
/// error feedback, which is cut by the plan's buckets: a run continued from a state
/// starts it from zero.
struct TrainState {
  ParamMap params, m1, m2;
  int steps_done = 0;
  /// fp16 training: the loss scaler's per-slice scales, counters and skipped steps (Adam's
  /// step count is steps_done − skipped); empty scales: none (a fresh scaler).
  LossScaleState loss_scale;
};

/// Loads `start` (when given) into every chunk of every compute of a run — the CPU or
/// the CUDA backend's, each with chunks() and chunk_stage(ch).load_state — and returns
/// the steps already done, from which the run's step numbering, data and Adam go on.
template <class Computes>
int load_start_state(const std::optional<TrainState>& start, Computes& computes) {
  if (!start) return 0;
  if (start->steps_done < 0)
    throw Error("start state: " + std::to_string(start->steps_done) + " steps done; expected ≥ 0");
  for (auto& c : computes)
    for (int ch = 0; ch < c->chunks(); ++ch) c->chunk_stage(ch).load_state(start->params, start->m1, start->m2);
  return start->steps_done;
}

struct CpuRunOptions {
  TrainOptions train;
  /// Continue from this state (another partition's, e.g. after re-balancing): step
  /// numbering, data and Adam go on from state.steps_done. Unset: a fresh model.
  std::optional<TrainState> start;
  /// A run in which no op starts or ends for this long while some thread waits fails
  /// with an error naming every blocked rank, its op and its peer.
  double watchdog_seconds = 30;
  /// Step whose timeline goes into RunResult::trace (−1: the last).
  int trace_step = -1;
  /// Pin rank w's threads to the (w mod n)-th of the n cores the process may use (its
  /// affinity mask): `automatic` pins when every rank has a core of its own (p × d ≤ n).
  /// Pinned, the kernel cannot put two busy ranks on one core while the other idles
  /// (bench_exec: the cost over the schedule's own time falls from 3–9 % to 1–4 % on 2
  /// cores). Each run pins from the first core of its mask: runs side by side on one
  /// machine want a `taskset` each, or `off`, as does a machine shared with busy work.
  enum class Pinning { automatic, on, off };
  Pinning pinning = Pinning::automatic;
  /// How each rank's streams get threads (Backend::runtime): cooperative (the default)
  /// puts its compute and p2p streams on one thread.
  Runtime runtime = Runtime::cooperative;
  /// Threads that run the ranks' compute and p2p streams (cooperative runtime), each
  /// taking a contiguous block of world ranks in turns (exec::run_rank_steps): a
  /// hand-off between ranks of one thread costs no OS thread switch. 0 (automatic): one
  /// per rank, or one per core where the ranks outnumber the cores the process may use
  /// and no rank needs a thread of its own (fp16's overflow agreement, injected faults,
  /// --rank-speed's sleeps). Pinning puts thread g on the g-th core.
  int rank_threads = 0;
  /// Also keep every step's timeline in RunResult::step_traces (calibration).
  bool keep_step_traces = false;
  /// Injected faults, heartbeats, retries, checkpoints and resume (exec/faults.hpp). With
  /// faults.resume, train.steps is the step count of the run that wrote the checkpoint:
  /// the run takes the steps from the checkpoint's to it.
  FaultOptions faults;
};

struct RunResult {
  std::vector<double> loss_per_step;      ///< mean token cross-entropy of each step
  std::vector<double> iteration_seconds;  ///< wall time of each step
  std::vector<double> span_seconds;       ///< each step's trace span: first op start to last op end
  ParamMap weights;  ///< replica 0, after the last step
  /// replica 0, the last step's gradients: reduced, but after 1-bit Adam's warm-up its
  /// own (the momentum is what the replicas reduce then)
  ParamMap grads;
  /// Per step: bytes delivered between replicas (every data-parallel collective of every
  /// rank; what the in-process wire really carried).
  std::vector<std::int64_t> dp_wire_bytes;
  /// Per world rank (replica · p + rank): the most bytes of weights and Adam state its
  /// device held at once during the run — all of them, or under parameter offload the
  /// embedding/head and the blocks being streamed (Compute::param_state_peak_bytes);
  /// empty where the backend does not measure it.
  std::vector<std::int64_t> param_state_peak_bytes;
  double replica_divergence = 0;  ///< max |w − w(replica 0)| over replicas
  /// fp16 training: per step, the per-slice loss scales it ran with, the overflow flags
  /// every rank agreed on, and whether it was skipped; empty otherwise.
  std::vector<LossScaleStep> loss_scale;
  /// The step loss_per_step[0] is (steps are numbered from the first step ever).
  int first_step = 0;
  /// A resumed run: the steps before first_step as its checkpoint recorded them.
  std::vector<double> earlier_loss_per_step, earlier_iteration_seconds;
  /// Faults seen and what each cost: retried transfers, restarts, failed checkpoints.
  std::vector<FaultRecord> faults;
  std::vector<std::string> unfired_faults;  ///< injected faults that never fired, as written
  int restarts = 0;           ///< from a checkpoint (or the run's start) after a lost rank or transfer
  int retries = 0;            ///< transfers delivered again
  double retry_seconds = 0;   ///< the senders' waits before those retries
  int checkpoints_written = 0;
  std::int64_t checkpoint_bytes = 0;
  double checkpoint_seconds = 0;
  /// Per world rank: seconds its compute stream was busy, summed over the steps (a
  /// straggler stands out).
  std::vector<double> rank_compute_seconds;
  traces::Trace trace;  ///< origin "cpu": the trace step, times from its start
  std::vector<traces::Trace> step_traces;  ///< every step's, if keep_step_traces
  TrainState state;  ///< replica 0 after the last step, to continue from
};

/// Memory this process may still take: MemAvailable, else the physical memory.
double available_memory_bytes();

/// The cores this process may run on (its affinity mask: taskset, a cgroup's cpuset).
std::vector<int> allowed_cores();

/// Pins the calling thread to the (w mod n)-th of `cores`; the threads it starts inherit
/// the mask.
void pin_to_core(int w, const std::vector<int>& cores);

/// World ranks 0 … ranks − 1 in `threads` contiguous blocks whose sizes differ by at most
/// one (the first ones larger): the ranks each thread of a run takes turns with.
std::vector<std::vector<int>> rank_groups(int ranks, int threads);

/// The threads a run of `plan` with `options` gives its ranks (CpuRunOptions::rank_threads,
/// its automatic choice resolved); throws tdpipe::Error on a count the run cannot use.
int rank_thread_count(const ir::Plan& plan, const CpuRunOptions& options);

/// Throws tdpipe::Error naming what is wrong when `inject` (step ≥ 0) cannot happen in a
/// run of `plan` taking steps [first, first + steps): training not in fp16, a slice, step
/// or world rank outside the run. run_cpu checks its own; a caller that cuts a run into
/// segments (each getting the injection only if it holds the step) checks the whole.
void check_injection(const TrainOptions::OverflowInjection& inject, const ir::Plan& plan, int first, int steps);

/// Tunes glibc's allocator for the executor, process-wide: blocks up to 32 MiB come from
/// the heap and freed memory is kept (mallopt M_MMAP_THRESHOLD, M_TRIM_THRESHOLD). The
/// CPU model allocates its activations and gradients per op; by default glibc maps each
/// block over 128 KiB afresh and unmaps it on free, so every step page-faults its memory
/// back in, and its adaptive threshold only settles after dozens of steps — the tiny
/// scenario's 1f1b step took 44 ms for its first 40 steps, 33 ms once tuned
/// (docs/BENCHMARKS.md). `tdpipe exec` and `tdpipe calibrate` call it first; a program of
/// its own that times run_cpu should too. No effect with another allocator.
void keep_freed_memory();

/// Trains `plan` (lowered) for options.train.steps steps. Throws tdpipe::Error with
/// the failing rank's message, or the watchdog's report of blocked ranks.
RunResult run_cpu(const ir::Plan& plan, const CpuRunOptions& options);

/// The same model and data on one device: all d · m micro-batches of each step,
/// full sequences, fused backward, one Adam step.
RunResult run_reference(const ir::Scenario& scenario, int data, int microbatches,
                        const TrainOptions& options);

/// √(Σ w²) over all parameters.
double weights_l2(const ParamMap& params);

}  // namespace tdpipe::exec::cpu
