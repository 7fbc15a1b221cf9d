// run.hpp — train a lowered plan on GPUs: every stage in one process on one GPU
// (loopback transport), or one process per GPU under mpirun/srun (NCCL). Same
// model, data and outputs as cpu::run_cpu. Plain C++: no CUDA types here.
#pragma once

#include <optional>

#include <cstdint>
#include <string>
#include <string_view>

#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/exec/faults.hpp"
#include "tdpipe/exec/cuda/launch_env.hpp"
#include "tdpipe/ir/plan.hpp"

namespace tdpipe::exec::cuda {

enum class TransportKind { Loopback, Nccl };
/// "loopback" | "nccl"; throws tdpipe::Error naming both for anything else.
TransportKind transport_from_string(std::string_view name);
std::string_view to_string(TransportKind kind);

struct CudaRunOptions {
  cpu::TrainOptions train;
  TransportKind transport = TransportKind::Loopback;
  /// No op started or ended for this long while a rank waits → the run fails naming them.
  double watchdog_seconds = 120;
  int trace_step = -1;  ///< step whose timeline is returned (−1: the last)
  int device = -1;      ///< loopback: GPU index (−1: device 0; NCCL runs use the local rank)
  bool keep_step_traces = false;  ///< also keep every step's timeline (calibration)
  /// Continue from this state (cpu::CpuRunOptions::start's contract: another partition's,
  /// e.g. after re-balancing; steps, data and Adam go on from state.steps_done). Loopback
  /// only: an NCCL process holds only its own ranks, so it neither takes nor returns one.
  std::optional<cpu::TrainState> start;
  /// Injected faults, checkpoints, restart and resume, as the CPU backend's
  /// (exec/faults.hpp, recovery.hpp): kill, hang, slow and ckpt-fail (drop and corrupt
  /// are the CPU fabric's; NCCL's transports retransmit below the executor). Loopback:
  /// the ranks' threads are rebuilt in-process; NCCL: every process aborts its
  /// communicators, creates them again and loads the checkpoint they agree on.
  FaultOptions faults;
};

struct CudaRunResult {
  /// loss_per_step and iteration_seconds are global. weights / grads hold the ranks
  /// of replica 0 that this process ran (all of them for loopback). trace: the whole
  /// run on the root process (gathered over MPI for NCCL runs; without MPI, each
  /// process holds only its own rank's events).
  cpu::RunResult run;
  double weights_l2 = 0;  ///< √Σw² over the whole model (every process), after the last step
  int world_rank = 0;
  int world_size = 1;
  bool root = true;  ///< this process prints and writes the outputs
  std::string device_name;
  /// TrainOptions::cuda_graphs: compute ops captured into a graph and replayed, summed
  /// over this process's ranks (the last world's, after a recovery); 0 without graphs.
  std::int64_t graph_captures = 0, graph_replays = 0;
};

/// Trains `plan` (lowered) for options.train.steps steps on GPUs. Throws tdpipe::Error
/// with a clear message when there is no GPU, too few GPUs/processes for the plan,
/// too little memory, a CUDA/NCCL failure (call and file:line), a failing rank, or
/// the watchdog's report of blocked ranks.
CudaRunResult run_cuda(const ir::Plan& plan, const CudaRunOptions& options);

/// One process's part of an NCCL run (options.transport is not read) whose rank and
/// world are given instead of read from the launcher's environment: for a launcher
/// that starts the ranks itself. The NCCL id comes over MPI when this build has it and
/// `launch.launcher` is "openmpi", "slurm" or "pmi", else from NCCL_COMM_ID. Throws as
/// run_cuda.
CudaRunResult run_cuda_rank(const ir::Plan& plan, const CudaRunOptions& options, const LaunchEnv& launch);

struct GpuInfo {
  int count = 0;        ///< visible CUDA devices (0: none, or no driver)
  std::string name;     ///< device 0
  std::int64_t total_bytes = 0;
  int cc_major = 0, cc_minor = 0;
  std::string why_none;  ///< the CUDA error when count == 0
};
/// What this machine offers; never throws.
GpuInfo query_gpus();
/// True when this build can exchange the NCCL id over MPI.
bool built_with_mpi();

}  // namespace tdpipe::exec::cuda
