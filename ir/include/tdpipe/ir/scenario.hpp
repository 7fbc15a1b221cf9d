// scenario.hpp — what to train, on what, how: the input of every tdpipe command.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tdpipe/ir/serving.hpp"

namespace tdpipe::ir {

/// A GPU model. Presets: a100-80g, a100-40g, h100-80g, h200 (gpu_preset()).
struct GpuSpec {
  std::string name;
  double peak_flops = 0;              ///< dense bf16/fp16 FLOP/s
  double hbm_bytes = 0;               ///< memory size
  double hbm_bytes_per_second = 0;    ///< memory bandwidth
  double nvlink_bytes_per_second = 0; ///< per GPU, each direction
  friend bool operator==(const GpuSpec&, const GpuSpec&) = default;
};

struct ModelConfig {
  std::string name;
  int layers = 0;
  int hidden = 0;
  int ffn = 0;      ///< MLP inner size (4·hidden for GPT)
  int heads = 0;
  int seq = 0;      ///< sequence length in tokens
  int vocab = 0;
  std::string dtype = "bf16";  ///< bf16 | fp16 | fp32
  /// Key/value heads: grouped-query attention (Llama-2 70B: 8 for 64 heads), 1 = multi-query;
  /// 0 = heads (multi-head attention). Must divide heads, and tensor must divide it.
  int kv_heads = 0;
  std::string mlp = "gelu";         ///< gelu (up, down) | swiglu (gate, up, down: three hidden×ffn matrices)
  std::string attention = "flash";  ///< flash (no seq×seq activations kept) | standard (Megatron's softmax path)
  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;

  /// K/V heads in use: kv_heads, or heads when kv_heads is 0.
  int kv_heads_or_heads() const { return kv_heads > 0 ? kv_heads : heads; }
};

/// A set of identical nodes. A homogeneous cluster has one group.
struct NodeGroup {
  GpuSpec gpu;
  int nodes = 0;
  friend bool operator==(const NodeGroup&, const NodeGroup&) = default;
};

struct ClusterConfig {
  std::vector<NodeGroup> groups;  ///< in rank order
  int gpus_per_node = 8;
  double nvlink_bytes_per_second = 0;  ///< per GPU each way; 0 = from the GPU preset
  double ib_bytes_per_second_per_nic = 0;
  int nics_per_node = 8;
  std::string topology = "fat-tree";  ///< fat-tree | rail-optimized
  double nvlink_latency_seconds = 0;
  double ib_latency_seconds = 0;
  /// Host ↔ GPU copy bandwidth per GPU, each way (PCIe), for parameter offload; 0 = the
  /// GPU's usual host link (host_link_bytes_per_second).
  double host_bytes_per_second = 0;
  /// > 0: every rank runs on one shared device that runs this many compute ops at full
  /// speed at once and shares itself evenly beyond that (the CPU backend's cores; one
  /// GPU's loopback: 1). Set from a calibration profile (traces::apply_profile), not
  /// from scenario files; 0: each rank its own GPU.
  double shared_capacity = 0;
  /// The software stack's speed on this cluster relative to tdpipe's cost model: every
  /// compute kernel (GEMMs, attention, element-wise and optimizer passes) takes the cost
  /// model's time divided by it; communication keeps its own model. 1: the model's
  /// documented efficiencies; fitted to one observed run by `tdpipe calibrate --from-run`.
  double compute_efficiency = 1;
  friend bool operator==(const ClusterConfig&, const ClusterConfig&) = default;

  int nodes() const;
  int gpus() const { return nodes() * gpus_per_node; }
};

/// Host ↔ GPU bytes/s each way for a GPU of `gpu` in `cluster`: the cluster's
/// host_bytes_per_second, else the link such a GPU's host usually has, as achieved
/// (ZeRO-Offload, Ren et al. 2021: PCIe Gen4 x16 ≈ 32 GB/s theoretical, ≈ 25 GB/s
/// achieved — A100 SXM hosts; Gen5 twice that — H100/H200 hosts; "cpu": a memcpy,
/// 10 GB/s).
double host_link_bytes_per_second(const ClusterConfig& cluster, const GpuSpec& gpu);

enum class Recompute { None, Selective, Full };

struct ParallelConfig {
  int tensor = 1;
  int pipeline = 1;
  int data = 1;
  int chunks = 1;        ///< v, model chunks per pipeline rank
  int micro_batch = 1;   ///< sequences per micro-batch
  int global_batch = 1;  ///< sequences per iteration
  Recompute recompute = Recompute::None;
  bool sequence_parallel = false;
  int slices = 1;        ///< TD-Pipe temporal slices per micro-batch
  /// `slices: auto`: the planner picks S and the cut points by TeraPipe's dynamic
  /// programme (planner::solve_slices_auto); `slices` is then 1 until planned.
  bool slices_auto = false;
  /// Layers of each virtual stage (p·chunks entries, each ≥ 1, summing to model.layers);
  /// empty: an even split, which needs layers divisible by p·chunks.
  std::vector<int> layers_per_stage;
  /// `layers_per_stage: auto`: a min-max contiguous partition by the cost model
  /// (planner::partition_layers), embedding on the first stage, LM head + loss on the last.
  bool layers_per_stage_auto = false;
  /// Activation memory the `auto` scheduler may use per rank: "1f1b" (p micro-batches,
  /// 1F1B's peak), "2x1f1b", "max" (HBM less weights, gradients and optimizer state) or
  /// a number of GiB.
  std::string memory_budget = "max";
  /// Megatron's --overlap-grad-reduce: a bucket's data-parallel reduction starts as soon as
  /// its gradients are final (its chunk's last W/BW), on the dp stream beside compute;
  /// false: every reduction waits for the rank's last backward op.
  bool overlap_grad_reduce = true;
  /// Megatron's --tp-comm-overlap (Transformer Engine's userbuffers): each sequence-parallel
  /// all-gather / reduce-scatter of a layer runs in t chunks pipelined with the GEMM that
  /// consumes or produces it, so only its first chunk and what outlasts the GEMM stay
  /// exposed (planner/src/cost_model.cpp). Needs sequence_parallel when tensor > 1.
  bool tp_comm_overlap = false;
  /// Megatron's --overlap-p2p-communication: pipeline sends and receives run beside
  /// compute; false: a rank's compute waits for the sends posted before it (a send ends
  /// when the peer has received), as Megatron's does without the flag
  /// (ir::LoweringOptions::overlap_p2p). Both engines and
  /// the executors charge it through the lowered plan's dependencies.
  bool overlap_p2p = true;
  /// Gradient bytes per data-parallel bucket, in MiB (Megatron's 40 MB default).
  double bucket_mb = 40;
  /// Megatron's --use-distributed-optimizer (ZeRO-1): gradients are reduce-scattered, each
  /// replica steps the optimizer on its 1/d shard (optimizer state ÷ d), and the updated
  /// parameters are all-gathered.
  bool distributed_optimizer = false;
  /// "adam", or "onebit-adam": 1-bit Adam (Tang et al. 2021) — Adam for the first
  /// onebit_warmup_steps steps, then the variance is frozen and the data-parallel
  /// all-reduce carries the momentum as sign bits plus one scale per segment, with error
  /// feedback on both sides (COMPRESSED_ALLREDUCE buckets). Not with distributed_optimizer.
  std::string optimizer = "adam";
  int onebit_warmup_steps = 100;  ///< uncompressed Adam steps before compression starts
  bool onebit() const { return optimizer == "onebit-adam"; }
  /// "none", or "layers": time-shared parameter loading (ZeRO-Offload-like, per layer
  /// block). The decoder layers' 16-bit weights and their optimizer state (fp32 master,
  /// Adam moments) live in host memory; every F, B and BW streams the weights of its
  /// chunk's layers in, one block ahead of use (LOAD ops on the copy stream, a window of
  /// two blocks on the device), and OPT streams each block's state in and out (LOAD,
  /// OFFLOAD). Gradients, the embedding and the head stay on the device.
  std::string param_offload = "none";
  bool offload() const { return param_offload == "layers"; }
  /// Loss scaling of fp16 training (model.dtype: fp16; Micikevicius et al. 2018, PyTorch's
  /// GradScaler, Megatron's --loss-scale family), per temporal slice (TD-Pipe's TDScaler):
  /// each slice's backward runs with its own scale, a step in which any slice overflowed
  /// is skipped on every rank and that slice's scale is halved (not below
  /// min_loss_scale); a slice's scale doubles after loss_scale_window steps in a row
  /// without its overflow. loss_scale > 0: that static scale instead (overflowing steps are
  /// still skipped); 0: dynamic, from initial_loss_scale.
  double loss_scale = 0;
  double initial_loss_scale = 65536;
  int loss_scale_window = 1000;
  double min_loss_scale = 1;
  friend bool operator==(const ParallelConfig&, const ParallelConfig&) = default;

  /// Micro-batches per pipeline per iteration: global_batch / (micro_batch · data).
  int microbatches() const { return global_batch / (micro_batch * data); }
};

/// The abstract form: explore schedules without a model. Times in seconds
/// (the YAML gives microseconds).
struct Synthetic {
  int stages = 0;        ///< p
  int microbatches = 0;  ///< m
  int chunks = 1;        ///< v
  double f_seconds = 0, b_seconds = 0, w_seconds = 0;  ///< per op, per chunk
  double p2p_latency_seconds = 0;  ///< added on every dependency that crosses ranks
  double activation_bytes = 0;     ///< bytes one F keeps alive (for memory reports)
  friend bool operator==(const Synthetic&, const Synthetic&) = default;
};

struct Scenario {
  std::string name;         ///< file stem, or given
  std::string source_file;  ///< where it was read from ("" if built in code)
  std::optional<Synthetic> synthetic;  ///< set: abstract form; model/cluster unused
  ModelConfig model;
  ClusterConfig cluster;
  ParallelConfig parallel;
  std::string schedule = "1f1b";  ///< default schedule
  /// Set: an LLM serving scenario (`serving:`); `tdpipe serve` plans its requests with
  /// parallel.pipeline × parallel.tensor GPUs (ir/serving.hpp).
  std::optional<ServingConfig> serving;
  friend bool operator==(const Scenario&, const Scenario&) = default;

  /// Pipeline stages p (synthetic.stages or parallel.pipeline).
  int stages() const;
  /// Micro-batches m per pipeline per iteration.
  int microbatches() const;
  /// Model chunks v per rank.
  int chunks() const;
};

}  // namespace tdpipe::ir
