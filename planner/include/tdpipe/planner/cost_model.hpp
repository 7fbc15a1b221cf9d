// cost_model.hpp — FLOPs, bytes, memory and time of a scenario's ops
// (Megatron formulas, tensor-parallel split, recompute, attention per slice).
//
// Conventions (all per tensor-parallel rank, one micro-batch of b sequences, one
// temporal slice of `tokens` tokens after a prefix of `prefix` tokens; a whole
// sequence is tokens = seq, prefix = 0):
//  - GEMMs with weights (QKV, projection, MLP up/down): forward
//    2·b·len·(2h² + 2h·kv + n·h·ffn)/t FLOPs, kv = kv_heads·h/heads (the width of K and of
//    V; = h without GQA), n = 2 for GeLU, 3 for SwiGLU (gate, up, down) — GPT: 4h² + 2h·ffn;
//    input gradient B the same; weight gradient W the same.
//  - Attention core (QKᵀ and attention·V, no weights): forward 4·b·len·(prefix+len)·h/t
//    model FLOPs, whatever kv_heads and the kernel. Each slice counts its full len ×
//    (prefix+len) score block, as Megatron does for the whole sequence (no causal halving),
//    so S = 1 gives Megatron's 4·b·s²·h. Its backward (four products) is 2× forward and
//    belongs to B only. Time: standard attention runs the block as batched GEMMs plus an
//    element-wise softmax; flash attention (model.attention, the default) runs the causal
//    half, len·(prefix + len/2), at Efficiencies::flash_attention of peak, its backward
//    2.5× that (it recomputes QKᵀ; the recompute is in the time, not in the FLOPs).
//  - Recompute: full — B pays one more whole forward (its FLOPs, memory traffic and TP
//    collectives); selective — B pays the attention core again (standard attention only:
//    flash keeps no seq×seq activations to drop).
//  - Embedding on virtual stage 0 (memory-bound gather; gradient in W); final LayerNorm,
//    LM head (2·b·len·h·V/t forward) and cross-entropy on the last virtual stage.
//  - Memory-bound element-wise work (LayerNorm, bias+GeLU, softmax, dropout, residual)
//    costs bytes / (HBM bandwidth × kHbmEfficiency); backward 2× forward.
//  - Tensor-parallel collectives are folded into the op that issues them (not separate
//    IR ops): without sequence parallelism 2 all-reduces of b·len·h elements in F and 2
//    in B; with it 2 all-gathers + 2 reduce-scatters in F, the same in B, plus the
//    2 all-gathers W redoes to rebuild its GEMM inputs (Megatron does not keep them).
//    Ring algorithm over NVLink when t ≤ gpus_per_node, else over InfiniBand.
//  - Time = Σ FLOPs / (peak × gemm_efficiency) + element-wise time + collective time.
//  - mem_bytes: F adds the slice's activation bytes (Korthikanti et al. 2022, per
//    recompute mode, generalised to kv_heads and SwiGLU; no seq×seq terms with flash
//    attention — see layer_activation_bytes in cost_model.cpp); BW frees all of it; split B frees all but the GEMM inputs W still
//    needs, W frees those. Over a micro-batch the sum is exactly zero.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tdpipe/ir/lowering.hpp"
#include "tdpipe/ir/plan.hpp"
#include "tdpipe/ir/scenario.hpp"

namespace tdpipe::planner {

/// Per-op costs of one model chunk for one micro-batch slice.
struct OpCost {
  double flops = 0;
  double seconds = 0;
};

struct MemoryEstimate {
  double weights_bytes = 0, grads_bytes = 0, optimizer_bytes = 0;
  double activation_bytes = 0;  ///< peak, for the schedule's in-flight count
  double total_bytes() const { return weights_bytes + grads_bytes + optimizer_bytes + activation_bytes; }
};

/// The one set of efficiency constants of the default cost model (documented in
/// cost_model.cpp; checked against Korthikanti et al. 2022 Table 5 in the tests).
struct Efficiencies {
  double gemm_max = 0.79;            ///< large-GEMM fraction of peak (cuBLAS on A100 reaches ~0.8)
  double gemm_half_seconds = 64e-6;  ///< a GEMM that would take this long at peak runs at half of gemm_max
  double hbm = 0.90;                 ///< achieved fraction of HBM bandwidth for streaming kernels
  double nvlink = 0.65;              ///< NCCL ring bus bandwidth / NVLink per-direction bandwidth
  double network = 0.90;             ///< same for InfiniBand
  double optimizer_bytes_per_param = 36;  ///< HBM traffic of one mixed-precision Adam step per parameter
  double onebit_bytes_per_element = 48;   ///< HBM traffic of 1-bit Adam's kernels per gradient element …
  double onebit_server_bytes = 16;        ///< … plus this much ÷ d (the owner's average and re-compression)
  double flash_attention = 0.60;     ///< fused attention kernel's fraction of peak (FlashAttention-2 on A100: 50–73 %)
};
/// The defaults above.
const Efficiencies& default_efficiencies();

/// GEMM efficiency (fraction of peak) for a GEMM of m×k·k×n; documented default curve.
/// Uses the A100 80GB figures; see the overload for another GPU.
double gemm_efficiency(double m, double n, double k);
/// Same on `gpu`, for `batch` independent GEMMs issued as one batched call, with
/// `elem_bytes`-byte operands: min(saturation in size, HBM roofline).
double gemm_efficiency(double m, double n, double k, const ir::GpuSpec& gpu, double batch = 1,
                       double elem_bytes = 2);

/// FLOPs and time of one transformer layer for one micro-batch slice on one TP rank
/// of `gpu`; b includes recompute, w the SP all-gather redo (see the banner).
struct LayerCost {
  OpCost f, b, w;
};
LayerCost layer_cost(const ir::Scenario& scenario, const ir::GpuSpec& gpu, int tokens, int prefix);

/// Cost of a compute op (F, B, W or BW) of one model chunk holding `layers` transformer
/// layers at virtual stage `virtual_stage` (embedding on stage 0, LM head on the last of
/// `virtual_stages`), for a slice of `tokens` tokens after `prefix`.
OpCost chunk_cost(const ir::Scenario& scenario, const ir::GpuSpec& gpu, ir::OpKind kind,
                  int virtual_stage, int virtual_stages, int layers, int tokens, int prefix);

/// The work of a compute op (F, B, W or BW) of a chunk, part by part, as seconds at the
/// GPU's peak rates — FLOPs / peak_flops, bytes / HBM bandwidth — before any efficiency;
/// TP collectives as the cost model prices them. These are what `tdpipe calibrate` fits
/// a speed to (planner/cost_fit.hpp): a part's coefficient is 1 / its achieved fraction
/// of peak on the measured machine, where chunk_cost assumes the documented efficiencies.
struct CostParts {
  double gemm = 0;         ///< the layers' weight GEMMs: FLOPs / peak
  double attention = 0;    ///< attention core: executed FLOPs / peak + softmax bytes / HBM (standard attention)
  double elementwise = 0;  ///< the layers' other memory-bound work (LayerNorms, GeLU, residuals, dropout): bytes / HBM
  double comm = 0;         ///< tensor-parallel collectives folded into the op (seconds, as chunk_cost)
  double embedding = 0;    ///< embedding gather / scatter-add (virtual stage 0): bytes / HBM
  double head = 0;         ///< final LayerNorm, LM head and loss (last virtual stage): FLOPs / peak + bytes / HBM
  CostParts& operator+=(const CostParts& o) {
    gemm += o.gemm, attention += o.attention, elementwise += o.elementwise, comm += o.comm;
    embedding += o.embedding, head += o.head;
    return *this;
  }
  CostParts& operator*=(double k) {
    gemm *= k, attention *= k, elementwise *= k, comm *= k, embedding *= k, head *= k;
    return *this;
  }
};
/// The parts of the op chunk_cost prices (same layers, slice, recompute and ends).
CostParts chunk_cost_parts(const ir::Scenario& scenario, const ir::GpuSpec& gpu, ir::OpKind kind,
                           int virtual_stage, int virtual_stages, int layers, int tokens, int prefix);

/// F, B and W of a stage's ends alone: the embedding on the first stage, the LM head and
/// loss on the last (both on a one-stage pipeline), and without sequence parallelism
/// Megatron's scatter/gather of pipeline tensors on the others. chunk_cost of a stage
/// of n layers = n · layer_cost + this, exactly (its own sum).
LayerCost stage_ends_cost(const ir::Scenario& scenario, const ir::GpuSpec& gpu, bool first, bool last, int tokens,
                          int prefix);

/// A key naming everything layer and end costs on `gpu` read from `scenario` (the model,
/// the tensor-parallel shape, recompute, the fabric): equal keys, equal costs. For memos
/// of per-shape results across layouts (slice cuts, slice cost grids).
std::string cost_shape_key(const ir::Scenario& scenario, const ir::GpuSpec& gpu);

/// Time of a ring collective of `bytes` (the full buffer) over `ranks` ranks on the
/// tensor-parallel fabric (NVLink when the group fits in a node, else InfiniBand).
/// kind: ALLREDUCE, REDUCE_SCATTER or ALL_GATHER.
double tp_collective_seconds(const ir::Scenario& scenario, const ir::GpuSpec& gpu, ir::OpKind kind,
                             double bytes, int ranks);

/// Model FLOPs of one training iteration, Megatron's definition (Narayanan et al. 2021,
/// eq. 3: 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) for ffn = 4h), generalised to any ffn
/// size: 3 (forward + backward) × tokens × (per layer 8h² for QKV and projection,
/// 4h·ffn for the MLP, 4·s·h for attention scores and values — without causal halving,
/// as Megatron counts them — plus 2h·V for the LM head). Recomputation is not counted:
/// it is work the hardware does, not the model's. 0 for synthetic scenarios.
double model_flops_per_iteration(const ir::Scenario& scenario);

/// The one MFU tdpipe reports, for every engine and every measured run: model FLOPs of
/// an iteration / (iteration seconds × GPUs used (t·p·d) × the mean peak FLOP/s of the
/// cluster's GPUs). 0 for synthetic scenarios or a non-positive iteration.
double mfu(const ir::Scenario& scenario, double iteration_seconds);

/// global_batch · seq / iteration seconds; 0 for synthetic scenarios.
double tokens_per_second(const ir::Scenario& scenario, double iteration_seconds);

/// The GPU that bounds pipeline rank `rank`: slowest peak (then smallest HBM) among the
/// GPUs of all its tensor ranks and replicas. Placement: tensor ranks inside a node,
/// pipeline ranks next, replicas last (as gpu_memory_bytes in schedule_report.hpp).
ir::GpuSpec gpu_of_rank(const ir::Scenario& scenario, int rank);

/// Parameters one TP rank holds for a chunk of `layers` layers at `virtual_stage`
/// (embedding on virtual stage 0, final LayerNorm and the tied LM head on the last).
double params_of_chunk(const ir::Scenario& scenario, int virtual_stage, int virtual_stages, int layers);

/// Activation bytes one F of `layers` layers keeps for a slice (Korthikanti et al.).
double activation_bytes(const ir::Scenario& scenario, int virtual_stage, int virtual_stages,
                        int layers, int tokens, int prefix);

/// Optimizer step time of a rank holding `params` parameters (mixed-precision Adam,
/// HBM-bound).
double optimizer_seconds(const ir::Scenario& scenario, const ir::GpuSpec& gpu, double params);

/// Device time of 1-bit Adam's local kernels for one bucket of `elements` gradients
/// (momentum update, worker and server compression with error feedback, decompression;
/// HBM-bound: Efficiencies::onebit_bytes_per_element + onebit_server_bytes / d), the
/// COMPRESSED_ALLREDUCE's est_seconds.
double onebit_compress_seconds(const ir::Scenario& scenario, const ir::GpuSpec& gpu, double elements);

/// Tokens per slice so that each slice costs the same given its prefix (Seq1F1B);
/// S = 1 gives {seq}.
std::vector<int> solve_slices(const ir::Scenario& scenario, int slices);
/// The solver behind solve_slices for any cost(tokens, prefix) increasing in both:
/// integer lengths ≥ 1 summing to `seq`, each slice's cost as equal as rounding allows.
std::vector<int> solve_slices_by(int seq, int slices,
                                 const std::function<double(double tokens, double prefix)>& cost);

/// The cut points of TeraPipe's grid: ⌊seq·u/G⌋ for u = 0 … G, G = min(seq, max_units)
/// (unit lengths differ by at most one token).
std::vector<int> slice_grid(int seq, int max_units);

/// TeraPipe's dynamic programme (Li et al., ICML 2021, §3.3) for the number and
/// lengths of slices: cut points on a grid of min(seq, max_units) units; for each
/// candidate bound on the longest slice time tⱼ = compute + transfer, the cuts of least
/// Σ computeᵢ with every tⱼ ≤ bound; the answer minimises the pipeline's
/// m·Σ computeᵢ + (p−1)·max tⱼ (m micro-batches fill the pipeline once). Returns the
/// slice lengths (≥ 1, summing to seq; one slice when slicing does not pay).
std::vector<int> solve_slices_terapipe(int seq, int stages, int microbatches, int max_units,
                                       const std::function<double(double tokens, double prefix)>& compute,
                                       const std::function<double(double tokens)>& transfer);

/// Min-max contiguous partition of `layers` layers over stages whose cost with n layers
/// is n·per_layer[k] + fixed[k] (dynamic programme, exact). Among partitions with the
/// least bottleneck: the least Σ cost² (most even), then the lexicographically first
/// (earlier stages lighter). Each stage gets at least one layer.
std::vector<int> partition_by(int layers, const std::vector<double>& per_layer, const std::vector<double>& fixed);

/// Layers per virtual stage for a plan with `stage_of` (rank → chunks' virtual stages):
/// parallel.layers_per_stage as given (p·v entries), `auto` (partition_by with each
/// stage's full-sequence F+B+W per layer on its rank's GPU, plus the embedding on the
/// first stage and the LM head + loss on the last), else an even split (layers must
/// divide by the virtual stages). Throws tdpipe::Error naming the field otherwise.
std::vector<int> partition_layers(const ir::Scenario& scenario, const std::vector<std::vector<int>>& stage_of,
                                  int virtual_stages);

/// Fills flops / est_seconds / mem_bytes of every compute op of a compute-only plan
/// (synthetic scenarios: the given per-chunk F/B/W times × synthetic.chunks / plan.chunks,
/// ÷S per slice; BW = B + W;
/// mem_bytes from synthetic.activation_bytes) and, for model scenarios, sets
/// plan.slice_tokens (S > 1, solve_slices, unless already S entries) and
/// plan.stage_layers (partition_layers, unless already set), which the costs then use.
void apply_costs(ir::Plan& plan, const ir::Scenario& scenario);

/// What lowering needs: p2p bytes = b·len·h·elem_bytes / t (Megatron's scatter/gather
/// of pipeline tensors across the TP ranks, and sequence parallelism, both send 1/t per
/// rank); gradient bytes of a chunk = its parameters (÷t) × elem_bytes. Synthetic
/// scenarios: 0 bytes (latency only) and no DP reduction. parallel.optimizer
/// onebit-adam: COMPRESSED_ALLREDUCE buckets (compress_element_bytes = elem_bytes).
ir::LoweringOptions lowering_options(const ir::Plan& plan, const ir::Scenario& scenario);

/// Parameter offload (parallel.param_offload: layers): layer blocks on the device at once,
/// the one in use and the next one prefetched (double buffering).
inline constexpr int kOffloadWindow = 2;
/// Fixed cost of one host ↔ device copy (a cudaMemcpyAsync of pinned memory: its launch
/// and the DMA engine's start, ~10 µs).
inline constexpr double kHostCopyLatencySeconds = 10e-6;
/// Seconds to copy `bytes` between host and device memory of `gpu` (PCIe, one way):
/// kHostCopyLatencySeconds + bytes / ir::host_link_bytes_per_second.
double host_copy_seconds(const ir::Scenario& scenario, const ir::GpuSpec& gpu, double bytes);

/// Weights, gradients and optimizer state per parameter (activation_bytes 0), as
/// memory_per_rank counts them: 2 + 2 + 12/d in bf16/fp16 (fp32 master weights and Adam
/// moments), 4 + 4 + 8/d in fp32, with d = parallel.data under
/// parallel.distributed_optimizer (ZeRO-1) and 1 otherwise; 1-bit Adam with d > 1 adds
/// its fp32 error-feedback buffers, 4 (worker) + 4/d (server's segment) bytes.
MemoryEstimate static_bytes_per_param(const ir::Scenario& scenario);

/// Weights, gradients and optimizer state (activation_bytes 0) of a rank holding
/// `params` parameters, `layers` of whose decoder layers: params × static_bytes_per_param,
/// or with parallel.param_offload: layers the layers' weights and optimizer state for
/// kOffloadWindow layers only (gradients whole). memory_per_rank's count, and the search's.
MemoryEstimate static_memory(const ir::Scenario& scenario, double params, int layers);

/// Activation bytes the `auto` scheduler lets a rank keep under parallel.memory_budget:
/// "1f1b" min(p, m) micro-batches of `per_microbatch_bytes`, "2x1f1b" twice that, a number
/// of GiB, or "max" `device_free_bytes` (HBM less weights, gradients and optimizer state).
/// auto_costs schedules with it; the search bounds with it.
double auto_budget_bytes(const ir::Scenario& scenario, int p, int m, double per_microbatch_bytes,
                         double device_free_bytes);

/// Peak memory per pipeline rank for a plan with costs (weights, grads, Adam
/// states, peak activations from the plan's in-flight count).
/// Bytes per parameter: weights 2, gradients 2, Adam fp32 master + 2 moments 12 (16 in
/// all, Korthikanti et al.; fp32 models: 4 + 4 + 8); the optimizer's part ÷ d with
/// parallel.distributed_optimizer (ZeRO-1; static_bytes_per_param). With
/// parallel.param_offload: layers, the decoder layers' weights and optimizer state count
/// only kOffloadWindow layers (the blocks being streamed); gradients count whole.
std::vector<MemoryEstimate> memory_per_rank(const ir::Plan& plan, const ir::Scenario& scenario);

/// nullopt when every rank fits its GPU's HBM; else "does not fit: needs X GiB of Y GiB
/// on rank r" for the rank with the largest need/capacity ratio.
std::optional<std::string> check_fits(const std::vector<MemoryEstimate>& memory,
                                      const ir::Scenario& scenario);

}  // namespace tdpipe::planner
