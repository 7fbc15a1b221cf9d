// megatron_import.hpp — a scenario from the arguments of a Megatron-LM training run
// (pretrain_gpt.py): the model, batch and parallel layout users already have.
#pragma once

#include <string>
#include <vector>

#include "tdpipe/ir/scenario.hpp"

namespace tdpipe::ir {

/// What Megatron's arguments do not say: the machine. The data-parallel size is
/// world / (tensor · pipeline), as Megatron derives it from the launcher's world size.
struct MegatronCluster {
  std::string gpu = "a100-80g";  ///< a GPU preset (gpu_preset_names())
  int gpus = 0;                  ///< world size; 0: nodes · gpus_per_node
  int nodes = 0;
  int gpus_per_node = 8;
  std::string name = "megatron";  ///< the scenario's name
};

struct MegatronImport {
  std::string yaml;                ///< the scenario file (parse_scenario reads it back)
  Scenario scenario;               ///< it, read and checked
  std::vector<std::string> notes;  ///< arguments taken as given defaults, or accepted but not modelled
};

/// Reads Megatron-LM's `pretrain_gpt.py` arguments (`--flag value`, `--flag=value`, bare
/// flags): num-layers, hidden-size, ffn-hidden-size, num-attention-heads,
/// group-query-attention / num-query-groups, swiglu, seq-length, micro/global batch,
/// tensor / pipeline / context-parallel sizes, virtual pipeline (layers per virtual stage
/// or virtual stages per rank), uneven first/last stages, recompute granularity and
/// method, sequence-parallel, overlap-grad-reduce, use-distributed-optimizer, DDP bucket
/// size, bf16 / fp16, the attention kernel and the vocabulary (vocab-size, or GPT-2's
/// tokenizer; padded as Megatron pads it). Arguments that do not change the time or
/// memory of a step (data, learning rate, logging, checkpoints, …) are accepted and
/// ignored. Throws tdpipe::Error naming the argument for an unknown or unsupported one
/// (mixture of experts, context parallelism, partial recompute) or a bad value, and the
/// scenario's own checks (parse_scenario) name the field when the layout is impossible.
MegatronImport import_megatron(const std::vector<std::string>& args, const MegatronCluster& cluster);

}  // namespace tdpipe::ir
