// calibrate.hpp — what the simulator needs to predict GPU runs (`tdpipe calibrate
// --backend cuda`): per-op durations measured inside a loopback run of the plan, and
// the loopback transport's latency and bandwidth; plus the timing of one
// transformer layer's F, B and W at a given shape (the PyTorch comparison).
#pragma once

#include <string>

#include "tdpipe/exec/cpu/backend.hpp"
#include "tdpipe/exec/cpu/calibrate.hpp"
#include "tdpipe/ir/plan.hpp"
#include "tdpipe/traces/profile.hpp"

namespace tdpipe::exec::cuda {

struct CudaCalibrateOptions {
  int warmup_steps = 2;  ///< run before measuring (cuBLAS heuristics, the memory pool)
  int steps = 5;         ///< measured steps; each op's median is over all its samples
  cpu::TrainOptions train;
  int transport_repeats = 200;
  int device = -1;
  cpu::SharingChoice sharing;  ///< default: capacity 1 (each stage's kernels fill the GPU)
};

/// Runs `plan` on one GPU over the loopback transport (warm-up, then measured steps)
/// and the transport micro-benchmarks; returns the profile of this GPU.
traces::Profile calibrate(const ir::Plan& plan, const CudaCalibrateOptions& options);

struct LayerShape {
  int hidden = 1536;
  int heads = 12;
  int ffn = 6144;
  int seq = 2048;
  int micro_batch = 1;
};
struct LayerTiming {
  double f_seconds = 0, b_seconds = 0, w_seconds = 0;  ///< medians
  int samples = 0;
  std::string device;
};
/// Times F, B (input gradient) and W (weight gradient) of one decoder block of the
/// executor's GPT at `shape` on GPU `device` with CUDA events; medians over `iters`.
LayerTiming time_layer(const LayerShape& shape, int warmup, int iters, int device = 0);

}  // namespace tdpipe::exec::cuda
