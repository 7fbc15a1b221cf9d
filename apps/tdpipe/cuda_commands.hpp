// cuda_commands.hpp — the CUDA halves of `tdpipe exec` and `tdpipe calibrate`
// (cmd_exec_cuda.cpp), called by cmd_exec.cpp / cmd_calibrate.cpp for --backend cuda
// when the build has the CUDA backend (TDPIPE_HAVE_CUDA).
#pragma once

#include <cstdint>
#include <string>

#include "tdpipe/exec/cpu/calibrate.hpp"
#include "tdpipe/exec/faults.hpp"

namespace tdpipe::apps {

struct CudaExecRequest {
  std::string scenario, schedule, transport = "loopback", trace_out, corpus;
  std::string trace_format = "chrome";  ///< --trace-format
  std::string rank_speed;  ///< --rank-speed text
  std::string wire = "auto";  ///< --wire
  bool cuda_graphs = false;   ///< --cuda-graphs on
  int slices = 0, steps = 20, device = -1;
  int balance_every = 0;   ///< --balance-every (loopback)
  std::int64_t max_ops = 0;
  double lr = 3e-3, watchdog = 120, balance_alpha = 0.3;
  std::uint64_t seed = 7;
  bool json = false, check = false;
  exec::FaultOptions faults;  ///< --inject, checkpoints, resume
  exec::cpu::TrainOptions::OverflowInjection inject_overflow;  ///< --inject-overflow (fp16)
};
/// Trains on GPUs and prints what the CPU backend prints (root process only).
void run_exec_cuda(const CudaExecRequest& request);

struct CudaCalibrateRequest {
  std::string scenario, schedule, output, corpus;
  int slices = 0, steps = 5, warmup = 2, device = -1;
  std::int64_t max_ops = 0;
  exec::cpu::SharingChoice sharing;
};
/// Measures this GPU's op costs (loopback run) and writes the profile.
void run_calibrate_cuda(const CudaCalibrateRequest& request);
/// The same measurement of one plan (a probe of `tdpipe calibrate`), as a profile.
traces::Profile calibrate_cuda_plan(const ir::Plan& plan, const CudaCalibrateRequest& request);

}  // namespace tdpipe::apps
