// gpu_presets.cpp — built-in GPU models a scenario names with `gpu:`.
//
// Figures are vendor datasheet numbers (see ../shared/REFERENCES.md): peak dense
// bf16/fp16 tensor-core FLOP/s, HBM size as the device reports it (nvidia-smi MiB),
// HBM bandwidth, and NVLink bandwidth per GPU in each direction (half the
// bidirectional figure NVIDIA quotes). The `cpu` preset is a placeholder for tiny
// scenarios run by the CPU executor: its numbers are order-of-magnitude guesses for
// one worker thread that calibration (measured op times) replaces.
#include <array>

#include <fmt/format.h>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/scenario_io.hpp"

namespace tdpipe::ir {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

const std::array<GpuSpec, 6>& presets() {
  static const std::array<GpuSpec, 6> kPresets = {{
      // A100 SXM 80GB: 312 TFLOP/s bf16, HBM2e 2,039 GB/s, NVLink3 600 GB/s bidirectional.
      {"a100-80g", 312e12, 81920 * kMiB, 2039e9, 300e9},
      // A100 SXM 40GB: same compute and NVLink, HBM2 1,555 GB/s.
      {"a100-40g", 312e12, 40960 * kMiB, 1555e9, 300e9},
      // H100 SXM 80GB: ~989 TFLOP/s dense bf16, HBM3 3.35 TB/s, NVLink4 900 GB/s bidirectional.
      {"h100-80g", 989e12, 81559 * kMiB, 3350e9, 450e9},
      // H200 SXM: H100 compute with 141 GB HBM3e at ~4.8 TB/s.
      {"h200", 989e12, 143771 * kMiB, 4800e9, 450e9},
      // L20 (PCIe, the TD-Pipe paper's serving GPU): 119.5 TFLOP/s dense bf16, 48 GB GDDR6
      // (46,068 MiB as the L40 of the same board reports with ECC), 864 GB/s. No NVLink: its
      // GPU-to-GPU link is PCIe Gen4 x16, 32 GB/s theoretical, ≈ 25 GB/s achieved each way
      // (ZeRO-Offload's figure, REFERENCES.md), which this field then holds.
      {"l20", 119.5e12, 46068 * kMiB, 864e9, 25e9},
      // Placeholder for the CPU executor (one worker thread ≈ one "GPU"): replaced by calibration.
      {"cpu", 100e9, 16384 * kMiB, 20e9, 5e9},
  }};
  return kPresets;
}

}  // namespace

GpuSpec gpu_preset(std::string_view name) {
  for (const auto& spec : presets())
    if (spec.name == name) return spec;
  throw Error(fmt::format("unknown GPU '{}'; expected one of: {}", name,
                          fmt::join(gpu_preset_names(), ", ")));
}

std::vector<std::string> gpu_preset_names() {
  std::vector<std::string> names;
  for (const auto& spec : presets()) names.push_back(spec.name);
  return names;
}

}  // namespace tdpipe::ir
