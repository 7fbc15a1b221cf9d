// bench_cuda_layer.cpp — times one decoder block's F, B (input gradient) and W
// (weight gradient) of the CUDA backend's GPT at a given shape, with CUDA events;
// prints JSON (scripts/gpu-layer-vs-torch.py compares it with PyTorch eager).
//   bench_cuda_layer [--hidden 1536] [--heads 12] [--ffn 6144] [--seq 2048] [--micro-batch 1]
//                    [--warmup 5] [--iters 20]
#include "bench_help.hpp"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "tdpipe/exec/cuda/calibrate.hpp"

int main(int argc, char** argv) {
  if (tdpipe::bench::help_requested(argc, argv)) return 0;
  tdpipe::exec::cuda::LayerShape s;
  int warmup = 5, iters = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (k == "--hidden") s.hidden = v;
    else if (k == "--heads") s.heads = v;
    else if (k == "--ffn") s.ffn = v;
    else if (k == "--seq") s.seq = v;
    else if (k == "--micro-batch") s.micro_batch = v;
    else if (k == "--warmup") warmup = v;
    else if (k == "--iters") iters = v;
    else {
      std::fprintf(stderr, "bench_cuda_layer: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    const auto t = tdpipe::exec::cuda::time_layer(s, warmup, iters);
    const double tokens = double(s.micro_batch) * s.seq;
    // Dense GEMM FLOPs of the block (attention's score/value GEMMs counted causal-full).
    const double gemm = 2 * tokens * (4.0 * s.hidden * s.hidden + 2.0 * s.hidden * s.ffn) +
                        4 * double(s.micro_batch) * s.seq * s.seq * s.hidden;
    nlohmann::json j = {{"device", t.device},
                        {"shape", {{"hidden", s.hidden}, {"heads", s.heads}, {"ffn", s.ffn}, {"seq", s.seq},
                                   {"micro_batch", s.micro_batch}}},
                        {"samples", t.samples},
                        {"f_ms", t.f_seconds * 1e3},
                        {"b_ms", t.b_seconds * 1e3},
                        {"w_ms", t.w_seconds * 1e3},
                        {"f_tflops", gemm / t.f_seconds / 1e12}};
    std::cout << j.dump(2) << "\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_layer: %s\n", e.what());
    return 1;
  }
  return 0;
}
