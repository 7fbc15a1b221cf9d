// cost_model.cpp — the default cost model: Megatron FLOP counts, a saturating GEMM
// efficiency curve with an HBM roofline, memory-bound element-wise work, ring
// collectives for tensor parallelism, Korthikanti et al. activation memory.
//
// The constants (Efficiencies) are one set for every scenario. They are physical:
//  - gemm_max 0.79: large fp16/bf16 GEMMs on A100 reach ~80% of the 312 TFLOP/s peak
//    (the one constant chosen by fitting, within that physical range).
//  - gemm_half_seconds 64 µs: a GEMM that would take 64 µs at peak (2·10¹⁰ FLOPs on an
//    A100) runs at half of gemm_max; below that, launch, tail and wave-quantisation
//    effects dominate (the same shape as Calculon's size-indexed table). Expressed in
//    seconds so that a faster GPU needs proportionally larger GEMMs to saturate.
//  - hbm 0.90: streaming kernels (fused softmax, bias-GeLU, LayerNorm) reach ~90% of HBM
//    bandwidth.
//  - nvlink 0.65: NCCL ring collectives of tens of MB inside a DGX A100 achieve ~65% of
//    the per-direction NVLink bandwidth on the critical path (~195 of 300 GB/s bus
//    bandwidth; users measure up to 232 GB/s for large all-reduces; Calculon uses 0.6–0.65).
//    Latency per ring step: the scenario's nvlink/ib latency (NCCL's 3.4 / 14 µs defaults).
//  - network 0.90: InfiniBand delivers ~90% of line rate to large messages.
//  - optimizer_bytes_per_param 36: one fused Adam step reads the fp32 gradient, master
//    weight and two moments, writes the three fp32 states and the 16-bit weight, then
//    zeroes the gradient buffer (4+4+4+4 read, 4+4+4+2 write, 4 zero, ≈2 for the norm).
//  - onebit_bytes_per_element 48 + onebit_server_bytes 16 / d: 1-bit Adam's kernels per
//    gradient element of a bucket, pass by pass as exec/cuda/kernels.cu runs them (DeepSpeed's
//    compressed_allreduce, Tang et al. 2021, makes as many passes): the momentum update
//    reads the gradient and reads/writes the fp32 momentum (12); the worker compression's
//    norm reads momentum and error (8), its packing reads them again and writes the error
//    (12, and 1/8 of sign bits); decoding into the momentum reads the frozen variance (its
//    mask) and writes the momentum (8); the owner averages the d received segments into
//    an fp32 buffer (d passes over 1/d of the elements: 8 − 4/d) and re-compresses it (20
//    over 1/d). The kernels run on the dp stream, overlapping the backward without slowing
//    it in either engine: on a GPU they share its HBM, so the hidden share is an upper
//    bound. The OPT that follows is priced as Adam's (it reads the frozen variance instead
//    of updating it: < 1 % of a step at any scale this models).
//  - flash_attention 0.60: FlashAttention-2 (Dao 2023, arXiv 2307.08691) reaches 50–73 %
//    of A100 peak, counting the causal half of the score block and its backward as 2.5×
//    forward (the counts used here); its best cases are ~73 % forward and ~63 % backward,
//    i.e. ~65 % for forward + backward (3.5 units of work in 1/0.73 + 2.5/0.63 units of
//    time). 0.60 sits a little below that for the causal kernel's ragged diagonal tiles
//    and the few heads per GPU left under tensor parallelism. Chosen from the paper's
//    stated range, not fitted to any measured iteration time; calibration can replace it.
//    Not size-dependent: the kernel spreads batch × heads × query tiles over the SMs, and
//    at the lengths tdpipe plans (thousands of tokens) that fills an A100.
// With them the model reproduces Korthikanti et al. 2022 Table 5 (22B, 175B, 530B, 1T,
// full recompute and sequence parallel + selective) within 3.2% in closed form
// ((m + (p−1)/v) micro-batch periods with exposed pipeline transfers; see
// tests/planner/test_cost_model.cpp) and within 2.7% through the analytic engine for
// the 22B and 530B scenarios (which hide pipeline transfers behind compute).
#include "tdpipe/planner/cost_model.hpp"

#include "tdpipe/ir/placement.hpp"
#include "tdpipe/ir/scenario_check.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/scenario_io.hpp"

namespace tdpipe::planner {
namespace {

using ir::OpKind;

constexpr double kA100Peak = 312e12;
constexpr double kA100Hbm = 2039e9;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double elem_bytes(const ir::Scenario& sc) { return sc.model.dtype == "fp32" ? 4.0 : 2.0; }

/// Replicas the optimizer state is sharded over: parallel.data with
/// parallel.distributed_optimizer (ZeRO-1), else 1.
int optimizer_shards(const ir::Scenario& sc) {
  return sc.parallel.distributed_optimizer && !sc.synthetic ? std::max(1, sc.parallel.data) : 1;
}

// Continuous costs of one layer (tokens and prefix may be fractional: the slice solver
// searches over them).
struct LayerCostD {
  OpCost f, b, w;
  CostParts pf, pb, pw;  // the same work at the GPU's peak rates (chunk_cost_parts)
};

struct Shape {
  double b, h, ffn, a, t, e;
  bool sp;
  double kv;    // width of K and of V: kv_heads · head size (= h for multi-head attention)
  bool swiglu;  // three hidden×ffn matrices (gate, up, down) instead of two
  bool flash;   // fused attention kernel: no seq×seq activations, recomputes scores in backward
};

Shape shape_of(const ir::Scenario& sc) {
  const auto& m = sc.model;
  if (m.hidden <= 0 || m.heads <= 0 || m.ffn <= 0 || m.layers <= 0)
    throw Error(fmt::format("{}: model: hidden, ffn, heads and layers must be positive for the "
                            "cost model (got hidden {}, ffn {}, heads {}, layers {})",
                            sc.name, m.hidden, m.ffn, m.heads, m.layers));
  const int kv_heads = m.kv_heads_or_heads();
  if (kv_heads <= 0 || m.heads % kv_heads != 0)
    throw Error(fmt::format("{}: model.kv_heads: expected a divisor of heads ({}) for the cost model, got {}",
                            sc.name, m.heads, kv_heads));
  // h·g/a rather than g·(h/a): exact in doubles, so kv = h bit for bit when g = a.
  return Shape{double(std::max(1, sc.parallel.micro_batch)), double(m.hidden), double(m.ffn),
               double(m.heads), double(std::max(1, sc.parallel.tensor)), elem_bytes(sc),
               sc.parallel.sequence_parallel, double(m.hidden) * kv_heads / m.heads,
               m.mlp == "swiglu", m.attention == "flash"};
}

// 1 / cluster.compute_efficiency: how much longer than modelled each compute kernel runs.
double stack_slowdown(const ir::Scenario& sc) { return 1 / sc.cluster.compute_efficiency; }

// Time of one GEMM (or `batch` of them) on `gpu`.
double gemm_seconds(double m, double n, double k, const ir::GpuSpec& gpu, double batch, double e) {
  const double flops = 2 * m * n * k * batch;
  if (flops <= 0) return 0;
  return flops / (gpu.peak_flops * gemm_efficiency(m, n, k, gpu, batch, e));
}

double hbm_seconds(double bytes, const ir::GpuSpec& gpu) {
  return bytes / (gpu.hbm_bytes_per_second * default_efficiencies().hbm);
}

LayerCostD layer_cost_d(const ir::Scenario& sc, const ir::GpuSpec& gpu, double len, double prefix) {
  const Shape s = shape_of(sc);
  const double T = s.b * len;      // tokens of this micro-batch slice
  const double K = prefix + len;   // keys each query of the slice attends to
  const double d = s.h / s.a;      // head size
  const double heads = s.b * s.a / s.t;  // attention heads on this TP rank
  const double e = s.e;

  // GEMMs with weights (forward shapes m×k·k×n): QKV (Q h wide, K and V kv wide each: GQA
  // shares one K/V head among heads/kv_heads query heads), output projection, MLP up (SwiGLU:
  // gate and up fused into one 2·ffn-wide GEMM, as Megatron's fc1), MLP down.
  struct G { double m, n, k; };
  const double up = s.swiglu ? 2 * s.ffn : s.ffn;
  const G gemms[] = {{T, (s.h + 2 * s.kv) / s.t, s.h}, {T, s.h, s.h / s.t},
                     {T, up / s.t, s.h}, {T, s.h, s.ffn / s.t}};
  // The software stack's speed on this cluster (cluster.compute_efficiency) scales every
  // kernel; the tensor-parallel collectives keep the network's model.
  const double slow = stack_slowdown(sc);
  double gemm_flops = 0, f_gemm = 0, b_gemm = 0, w_gemm = 0;
  double fg[4], bg[4], wg[4];  // each GEMM's forward, data-gradient and weight-gradient time
  for (int i = 0; i < 4; ++i) {
    const G& g = gemms[i];
    gemm_flops += 2 * g.m * g.n * g.k;
    f_gemm += fg[i] = slow * gemm_seconds(g.m, g.n, g.k, gpu, 1, e);  // Y = X·W
    b_gemm += bg[i] = slow * gemm_seconds(g.m, g.k, g.n, gpu, 1, e);  // dX = dY·Wᵀ
    w_gemm += wg[i] = slow * gemm_seconds(g.k, g.n, g.m, gpu, 1, e);  // dW = Xᵀ·dY
  }
  // Attention core: scores QKᵀ (len×d·d×K) and values P·V (len×K·K×d) per query head (GQA
  // changes nothing here: every query head still meets K keys). These are model FLOPs, the
  // same for both kernels: Megatron's convention counts the full block and no recompute.
  const double attn_flops = 4 * T * K * s.h / s.t;
  double f_attn, b_attn;
  if (s.flash) {
    // FlashAttention-2's causal kernel skips the score tiles above the diagonal, so it
    // runs len·(prefix + len/2) of the len×K block; its backward recomputes QKᵀ before
    // dV, dP, dQ, dK: 5 products for the forward's 2, hence 2.5× (the FLOP count
    // flash-attention's own benchmarks use). Those executed FLOPs run at flash_attention
    // of peak; the recomputed QKᵀ costs time but is not in op.flops (model FLOPs).
    const double executed = 4 * T * (prefix + 0.5 * len) * s.h / s.t;
    f_attn = executed / (gpu.peak_flops * default_efficiencies().flash_attention);
    b_attn = 2.5 * f_attn;
  } else {
    f_attn = gemm_seconds(len, K, d, gpu, heads, e) + gemm_seconds(len, d, K, gpu, heads, e);
    // Backward: dP = dO·Vᵀ, dV = Pᵀ·dO, dQ = dS·K, dK = dSᵀ·Q.
    b_attn = gemm_seconds(len, K, d, gpu, heads, e) + gemm_seconds(K, d, len, gpu, heads, e) +
             gemm_seconds(len, d, K, gpu, heads, e) + gemm_seconds(K, d, len, gpu, heads, e);
  }

  // Memory-bound element-wise work, forward, bytes per TP rank: two LayerNorms (read +
  // write), two bias-dropout-residual adds (read 2, write 1, 1-byte mask) — split by t
  // only with sequence parallelism —, bias+GeLU on the ffn activations (SwiGLU: read gate
  // and up, write their product), and scale-mask-softmax + dropout over the len×K scores
  // (read/write each, 1-byte mask), which flash attention does inside its kernel.
  const double ew_replicated = T * (10 * e * s.h + 2 * s.h) / (s.sp ? s.t : 1.0);
  const double ew_mlp = T * (s.swiglu ? 3 : 2) * e * s.ffn / s.t;
  const double ew_attn = s.flash ? 0.0 : T * K * s.a * (4 * e + 1) / s.t;
  f_attn *= slow, b_attn *= slow;
  const double f_ew = slow * hbm_seconds(ew_replicated + ew_mlp + ew_attn, gpu);
  const double attn_ew = slow * hbm_seconds(ew_attn, gpu);

  // Tensor-parallel collectives on b·len·h elements, folded into the op that waits on them.
  const double bytes = T * s.h * e;
  const int t = int(s.t);
  double f_comm = 0, b_comm = 0, w_comm = 0;
  if (t > 1) {
    if (s.sp && sc.parallel.tp_comm_overlap) {
      // Megatron's --tp-comm-overlap (Transformer Engine userbuffers): each collective is
      // cut into t chunks pipelined with the GEMM it feeds (all-gather → QKV, fc1) or
      // drains (proj, fc2 → reduce-scatter), the backward's mirror images likewise, and
      // W's re-gathers with the weight-gradient GEMMs they feed. A pipeline of two stages
      // over t chunks exposes one chunk of the shorter and all the longer has beyond the
      // other. (The copy engines move the chunks: no GEMM slowdown is charged.)
      const double ag = tp_collective_seconds(sc, gpu, OpKind::ALL_GATHER, bytes, t);
      const double rs = tp_collective_seconds(sc, gpu, OpKind::REDUCE_SCATTER, bytes, t);
      auto exposed = [t](double comm, double gemm) { return std::max(0.0, comm - gemm) + std::min(comm, gemm) / t; };
      f_comm = exposed(ag, fg[0]) + exposed(rs, fg[1]) + exposed(ag, fg[2]) + exposed(rs, fg[3]);
      b_comm = exposed(rs, bg[0]) + exposed(ag, bg[1]) + exposed(rs, bg[2]) + exposed(ag, bg[3]);
      w_comm = exposed(ag, wg[0]) + exposed(ag, wg[2]);
    } else if (s.sp) {
      const double ag = tp_collective_seconds(sc, gpu, OpKind::ALL_GATHER, bytes, t);
      const double rs = tp_collective_seconds(sc, gpu, OpKind::REDUCE_SCATTER, bytes, t);
      f_comm = 2 * ag + 2 * rs;
      b_comm = 2 * ag + 2 * rs;
      w_comm = 2 * ag;  // W re-gathers the sequence-sharded GEMM inputs it did not keep
    } else {
      const double ar = tp_collective_seconds(sc, gpu, OpKind::ALLREDUCE, bytes, t);
      f_comm = 2 * ar;
      b_comm = 2 * ar;
    }
  }

  LayerCostD c;
  c.f.flops = gemm_flops + attn_flops;
  c.f.seconds = f_gemm + f_attn + f_ew + f_comm;
  c.b.flops = gemm_flops + 2 * attn_flops;
  c.b.seconds = b_gemm + b_attn + 2 * f_ew + b_comm;
  c.w.flops = gemm_flops;
  c.w.seconds = w_gemm + w_comm;
  // The same work at peak: FLOPs / peak, bytes / HBM bandwidth (the attention core with
  // its softmax bytes, which scale with it; flash attention's executed FLOPs).
  {
    const double peak = gpu.peak_flops, hbm = gpu.hbm_bytes_per_second;
    const double f_core = (s.flash ? 4 * T * (prefix + 0.5 * len) * s.h / s.t : attn_flops) / peak;
    c.pf = {gemm_flops / peak, f_core + ew_attn / hbm, (ew_replicated + ew_mlp) / hbm, f_comm, 0, 0};
    c.pb = {gemm_flops / peak, (s.flash ? 2.5 : 2.0) * f_core + 2 * ew_attn / hbm, 2 * (ew_replicated + ew_mlp) / hbm,
            b_comm, 0, 0};
    c.pw = {gemm_flops / peak, 0, 0, w_comm, 0, 0};
    if (sc.parallel.recompute == ir::Recompute::Full) c.pb += c.pf;
    if (sc.parallel.recompute == ir::Recompute::Selective && !s.flash) c.pb.attention += f_core + ew_attn / hbm;
  }
  switch (sc.parallel.recompute) {
    case ir::Recompute::Full:
      c.b.flops += c.f.flops;
      c.b.seconds += c.f.seconds;
      break;
    case ir::Recompute::Selective:
      // Selective recompute drops the seq×seq activations, which flash attention never
      // keeps: nothing to redo (Megatron-LM checkpoints core attention only when it does
      // not use flash attention).
      if (s.flash) break;
      c.b.flops += attn_flops;
      c.b.seconds += f_attn + attn_ew;
      break;
    case ir::Recompute::None:
      break;
  }
  return c;
}

// Activation bytes of one layer for a slice, per TP rank (Korthikanti et al. 2022 §4.1,
// generalised: the s² term becomes len·(prefix+len); 2-byte figures scaled by dtype).
// Per token, in their 2-byte units: replicated across TP ranks unless SP, 10h — the two
// LayerNorm inputs 4h, the QKV and fc1 inputs 2h each, two 1-byte dropout masks 2h —; split
// by t, Q 2h, K and V 2·kv each, the projection input 2h, and the MLP's fc1 output and fc2
// input: GeLU 2·ffn + 2·ffn, SwiGLU 4·ffn (gate and up) + 2·ffn (their product). With
// ffn = 4h and kv = h that is Korthikanti's 10h + 24h/t (34h/t with SP). Standard attention
// adds the seq×seq terms; flash attention keeps only Q, K, V, its output (the projection
// input, already counted) and an fp32 log-sum-exp per row and head (4·a bytes per token,
// < 0.1 % of the rest for head size ≥ 64: left out), and regenerates its dropout mask.
double layer_activation_bytes(const ir::Scenario& sc, double len, double prefix) {
  const Shape s = shape_of(sc);
  const double T = s.b * len, K = prefix + len;
  const double scale = s.e / 2;
  const double scores = s.flash ? 0.0 : (2 * s.e + 1) * s.a * T * K / s.t;  // softmax out, its dropout and mask
  // In units of h, so that GPT shapes give Korthikanti's 24 (and 34) exactly.
  const double split = 4 + 4 * s.kv / s.h + (s.swiglu ? 6 : 4) * s.ffn / s.h;
  const double linear = s.sp ? T * s.h * (10 + split) * scale / s.t : T * s.h * (10 + split / s.t) * scale;
  switch (sc.parallel.recompute) {
    case ir::Recompute::Full: return T * s.h * s.e / (s.sp ? s.t : 1.0);  // the layer input only
    case ir::Recompute::Selective: return linear;
    case ir::Recompute::None: break;
  }
  return linear + scores;
}

// Bytes W still needs after B: the inputs of the four weight GEMMs.
double layer_w_bytes(const ir::Scenario& sc, double len) {
  const Shape s = shape_of(sc);
  const double T = s.b * len;
  return s.e * T * (2 * s.h / (s.sp ? s.t : 1.0) + s.h / s.t + s.ffn / s.t);
}

double params_per_layer(const ir::Scenario& sc) {
  const Shape s = shape_of(sc);
  // Weights split by t: Q and projection h² each, K and V h·kv each, MLP 2 (GeLU) or 3
  // (SwiGLU) h·ffn; biases of the column-parallel GEMMs (QKV, fc1) split, the others and
  // both LayerNorms replicated. GPT's biases and LayerNorms for every model (Llama has no
  // biases and RMSNorm: < 0.02 % of its parameters).
  const double mats = s.swiglu ? 3 : 2;
  return (2 * s.h * s.h + 2 * s.h * s.kv + mats * s.h * s.ffn + (s.h + 2 * s.kv) + (mats - 1) * s.ffn) / s.t +
         6 * s.h;
}

// Embedding (virtual stage 0) and final LayerNorm + LM head + loss (last stage) costs.
LayerCostD ends_cost(const ir::Scenario& sc, const ir::GpuSpec& gpu, int vs, int vstages,
                     double len, double prefix) {
  LayerCostD c;
  const Shape s = shape_of(sc);
  const double T = s.b * len;
  const double e = s.e;
  const double bytes = T * s.h * e;
  const int t = int(s.t);
  const bool last = vs == vstages - 1;
  const double slow = stack_slowdown(sc);  // compute kernels only, as in layer_cost_d
  (void)prefix;
  if (vs == 0) {
    // Gather rows of the vocab-parallel table, add positions, dropout; the partial
    // results are summed across the TP ranks (scattered with SP). Gradient: scatter-add.
    c.f.seconds += slow * hbm_seconds(T * s.h * (3 * e + 1), gpu);
    c.pf.embedding += T * s.h * (3 * e + 1) / gpu.hbm_bytes_per_second;
    if (t > 1) {
      const double comm = tp_collective_seconds(sc, gpu, s.sp ? OpKind::REDUCE_SCATTER : OpKind::ALLREDUCE, bytes, t);
      c.f.seconds += comm;
      c.pf.comm += comm;
    }
    c.w.seconds += slow * hbm_seconds(T * s.h * 3 * e, gpu);
    c.pw.embedding += T * s.h * 3 * e / gpu.hbm_bytes_per_second;
  } else if (t > 1 && !s.sp) {
    // Megatron's scatter/gather of pipeline tensors: each TP rank received 1/t, the full
    // activation is rebuilt with an NVLink all-gather.
    const double ag = tp_collective_seconds(sc, gpu, OpKind::ALL_GATHER, bytes, t);
    c.f.seconds += ag, c.pf.comm += ag;
  }
  if (!last && t > 1 && !s.sp) {
    const double ag = tp_collective_seconds(sc, gpu, OpKind::ALL_GATHER, bytes, t);
    c.b.seconds += ag, c.pb.comm += ag;
  }
  if (last) {
    const double V = sc.model.vocab;
    const double logits = T * V / s.t;
    const double head_flops = 2 * T * s.h * V / s.t;
    c.f.flops += head_flops;
    c.f.seconds += slow * (hbm_seconds(2 * e * T * s.h / (s.sp ? s.t : 1.0), gpu)  // final LayerNorm
                           + gemm_seconds(T, V / s.t, s.h, gpu, 1, e)
                           + hbm_seconds(logits * (e + 8), gpu));  // vocab-parallel softmax + loss, fp32
    c.b.flops += head_flops;
    c.b.seconds += slow * (gemm_seconds(T, s.h, V / s.t, gpu, 1, e) + hbm_seconds(logits * (4 + e), gpu) +
                           hbm_seconds(4 * e * T * s.h / (s.sp ? s.t : 1.0), gpu));
    c.w.flops += head_flops;
    c.w.seconds += slow * gemm_seconds(s.h, V / s.t, T, gpu, 1, e);
    const double peak = gpu.peak_flops, hbm = gpu.hbm_bytes_per_second;
    c.pf.head += head_flops / peak + (2 * e * T * s.h / (s.sp ? s.t : 1.0) + logits * (e + 8)) / hbm;
    c.pb.head += head_flops / peak + (logits * (4 + e) + 4 * e * T * s.h / (s.sp ? s.t : 1.0)) / hbm;
    c.pw.head += head_flops / peak;
    if (t > 1) {
      const double ag = tp_collective_seconds(sc, gpu, OpKind::ALL_GATHER, bytes, t);
      if (s.sp) {
        const double rs = tp_collective_seconds(sc, gpu, OpKind::REDUCE_SCATTER, bytes, t);
        c.f.seconds += ag, c.pf.comm += ag;
        c.b.seconds += rs, c.pb.comm += rs;
        c.w.seconds += ag, c.pw.comm += ag;
      } else {
        const double ar = tp_collective_seconds(sc, gpu, OpKind::ALLREDUCE, bytes, t);
        c.b.seconds += ar, c.pb.comm += ar;
      }
    }
  }
  return c;
}

CostParts pick_parts(const LayerCostD& c, OpKind kind) {
  switch (kind) {
    case OpKind::F: return c.pf;
    case OpKind::B: return c.pb;
    case OpKind::W: return c.pw;
    case OpKind::BW: {
      CostParts p = c.pb;
      p += c.pw;
      return p;
    }
    default: break;
  }
  throw Error(fmt::format("cost model: op kind {} is not a per-chunk compute op (expected F, B, W or BW)",
                          ir::to_string(kind)));
}

OpCost pick(const LayerCostD& c, OpKind kind) {
  switch (kind) {
    case OpKind::F: return c.f;
    case OpKind::B: return c.b;
    case OpKind::W: return c.w;
    case OpKind::BW: return {c.b.flops + c.w.flops, c.b.seconds + c.w.seconds};
    default: break;
  }
  throw Error(fmt::format("cost model: op kind {} is not a per-chunk compute op (expected F, B, W or BW)",
                          ir::to_string(kind)));
}

/// Layers of each virtual stage of `plan`: plan.stage_layers (checked against the
/// model), or — a plan without them (older files, built by hand) — the partition the
/// planner gives its scenario.
std::vector<int> chunk_layers(const ir::Plan& plan, const ir::Scenario& sc) {
  const int vstages = plan.virtual_stages();
  if (plan.stage_layers.empty()) return partition_layers(sc, plan.stage_of, vstages);
  std::vector<int> out(static_cast<std::size_t>(std::max(0, vstages)));
  for (int vs = 0; vs < vstages; ++vs) {
    const auto [a, b] = ir::layer_range(plan.stage_layers, sc.model.layers, vs, vstages);
    out[static_cast<std::size_t>(vs)] = b - a;
  }
  return out;
}

}  // namespace

const Efficiencies& default_efficiencies() {
  static const Efficiencies kDefault{};
  return kDefault;
}

double gemm_efficiency(double m, double n, double k) {
  ir::GpuSpec a100;
  a100.name = "a100-80g";
  a100.peak_flops = kA100Peak;
  a100.hbm_bytes_per_second = kA100Hbm;
  return gemm_efficiency(m, n, k, a100);
}

double gemm_efficiency(double m, double n, double k, const ir::GpuSpec& gpu, double batch,
                       double elem_bytes) {
  const Efficiencies& eff = default_efficiencies();
  const double flops = 2 * m * n * k * batch;
  if (flops <= 0 || gpu.peak_flops <= 0) return eff.gemm_max;
  // Saturating in size: half of gemm_max at gemm_half_seconds of peak work.
  const double half_flops = gpu.peak_flops * eff.gemm_half_seconds;
  const double saturating = eff.gemm_max * flops / (flops + half_flops);
  if (gpu.hbm_bytes_per_second <= 0) return saturating;
  // Roofline: the operands and the result must cross HBM at least once.
  const double bytes = elem_bytes * (m * k + k * n + m * n) * batch;
  const double roofline = flops * gpu.hbm_bytes_per_second * eff.hbm / (bytes * gpu.peak_flops);
  return std::min(saturating, roofline);
}

double tp_collective_seconds(const ir::Scenario& sc, const ir::GpuSpec& gpu, OpKind kind, double bytes,
                             int ranks) {
  if (ranks <= 1 || bytes <= 0) return 0;
  const Efficiencies& eff = default_efficiencies();
  const auto& cl = sc.cluster;
  double bw, latency;
  if (ranks <= std::max(1, cl.gpus_per_node)) {
    bw = (cl.nvlink_bytes_per_second > 0 ? cl.nvlink_bytes_per_second : gpu.nvlink_bytes_per_second) *
         eff.nvlink;
    latency = cl.nvlink_latency_seconds;
  } else {
    const double per_gpu = cl.ib_bytes_per_second_per_nic * std::max(1, cl.nics_per_node) /
                           std::max(1, cl.gpus_per_node);
    bw = std::min(per_gpu, cl.ib_bytes_per_second_per_nic) * eff.network;
    latency = cl.ib_latency_seconds;
  }
  if (bw <= 0)
    throw Error(fmt::format("{}: cluster: tensor-parallel group of {} GPUs has no bandwidth "
                            "(nvlink / ib_gbps_per_nic is 0)", sc.name, ranks));
  const double n = ranks;
  const double steps = kind == OpKind::ALLREDUCE ? 2 * (n - 1) : (n - 1);
  return steps / n * bytes / bw + steps * latency;
}

double model_flops_per_iteration(const ir::Scenario& sc) {
  if (sc.synthetic) return 0;
  const auto& m = sc.model;
  const double tokens = double(sc.parallel.global_batch) * m.seq;
  const double h = m.hidden, s = m.seq, f = m.ffn;
  const double layer_fwd = 8 * h * h + 4 * h * f + 4 * s * h;
  const double head_fwd = 2 * h * m.vocab;
  return 3 * tokens * (m.layers * layer_fwd + head_fwd);
}

double mfu(const ir::Scenario& sc, double iteration_seconds) {
  if (sc.synthetic || !(iteration_seconds > 0)) return 0;
  double peak_sum = 0;
  for (const auto& g : sc.cluster.groups) peak_sum += g.gpu.peak_flops * g.nodes * sc.cluster.gpus_per_node;
  const double mean_peak = peak_sum / std::max(1, sc.cluster.gpus());
  const double used = double(std::max(1, sc.parallel.tensor)) * std::max(1, sc.parallel.pipeline) *
                      std::max(1, sc.parallel.data);
  return mean_peak > 0 ? model_flops_per_iteration(sc) / (iteration_seconds * used * mean_peak) : 0;
}

double tokens_per_second(const ir::Scenario& sc, double iteration_seconds) {
  if (sc.synthetic || !(iteration_seconds > 0)) return 0;
  return double(sc.parallel.global_batch) * sc.model.seq / iteration_seconds;
}

ir::GpuSpec gpu_of_rank(const ir::Scenario& sc, int rank) {
  const auto& cl = sc.cluster;
  if (cl.groups.empty())
    throw Error(fmt::format("{}: cluster: no GPUs (expected at least one node group)", sc.name));
  const int t = std::max(1, sc.parallel.tensor), p = std::max(1, sc.parallel.pipeline);
  const int d = std::max(1, sc.parallel.data);
  const int per_node = std::max(1, cl.gpus_per_node);
  const ir::Placement place{t, p, d};
  std::optional<ir::GpuSpec> out;
  // One kind of GPU: every GPU of the rank is it (no walk over its t·d GPUs).
  if (cl.groups.size() == 1) out = cl.groups[0].gpu;
  for (int replica = 0; replica < d && cl.groups.size() > 1; ++replica) {
    for (int tr = 0; tr < t; ++tr) {
      long node = ir::Placement::node_of(place.gpu(replica, rank, tr), per_node);
      const ir::GpuSpec* spec = &cl.groups.back().gpu;
      for (const auto& g : cl.groups) {
        if (node < g.nodes) { spec = &g.gpu; break; }
        node -= g.nodes;
      }
      if (!out) {
        out = *spec;
        continue;
      }
      if (spec->peak_flops < out->peak_flops) out->name = spec->name;
      out->peak_flops = std::min(out->peak_flops, spec->peak_flops);
      out->hbm_bytes = std::min(out->hbm_bytes, spec->hbm_bytes);
      out->hbm_bytes_per_second = std::min(out->hbm_bytes_per_second, spec->hbm_bytes_per_second);
      out->nvlink_bytes_per_second = std::min(out->nvlink_bytes_per_second, spec->nvlink_bytes_per_second);
    }
  }
  if (out->peak_flops <= 0)
    throw Error(fmt::format("{}: cluster: GPU '{}' has no peak FLOP/s", sc.name, out->name));
  return *out;
}

LayerCost layer_cost(const ir::Scenario& sc, const ir::GpuSpec& gpu, int tokens, int prefix) {
  const LayerCostD c = layer_cost_d(sc, gpu, tokens, prefix);
  return LayerCost{c.f, c.b, c.w};
}

OpCost chunk_cost(const ir::Scenario& sc, const ir::GpuSpec& gpu, OpKind kind, int virtual_stage,
                  int virtual_stages, int layers, int tokens, int prefix) {
  const LayerCostD l = layer_cost_d(sc, gpu, tokens, prefix);
  const LayerCostD ends = ends_cost(sc, gpu, virtual_stage, virtual_stages, tokens, prefix);
  const OpCost a = pick(l, kind), b = pick(ends, kind);
  return OpCost{a.flops * layers + b.flops, a.seconds * layers + b.seconds};
}

CostParts chunk_cost_parts(const ir::Scenario& sc, const ir::GpuSpec& gpu, OpKind kind, int virtual_stage,
                           int virtual_stages, int layers, int tokens, int prefix) {
  CostParts p = pick_parts(layer_cost_d(sc, gpu, tokens, prefix), kind);
  p *= layers;
  p += pick_parts(ends_cost(sc, gpu, virtual_stage, virtual_stages, tokens, prefix), kind);
  return p;
}

LayerCost stage_ends_cost(const ir::Scenario& sc, const ir::GpuSpec& gpu, bool first, bool last, int tokens,
                          int prefix) {
  // A stage of that kind: virtual stage 0 or 1 of 1 (only), 2 (first or last) or 3 (middle).
  const LayerCostD c = ends_cost(sc, gpu, first ? 0 : 1, first && last ? 1 : first || last ? 2 : 3, tokens, prefix);
  return LayerCost{c.f, c.b, c.w};
}

std::string cost_shape_key(const ir::Scenario& sc, const ir::GpuSpec& gpu) {
  ir::Scenario shape = sc;  // what layer and end costs do not read, cleared
  shape.name.clear();
  shape.source_file.clear();
  shape.schedule.clear();
  shape.parallel.pipeline = shape.parallel.data = shape.parallel.chunks = shape.parallel.global_batch = 1;
  shape.parallel.slices = 1;
  shape.parallel.slices_auto = shape.parallel.layers_per_stage_auto = false;
  shape.parallel.layers_per_stage.clear();
  shape.parallel.memory_budget.clear();
  for (auto& g : shape.cluster.groups) g.nodes = 1;
  return fmt::format("{}|{}|{}|{}|{}|{}", ir::to_json(shape).dump(), gpu.name, gpu.peak_flops, gpu.hbm_bytes,
                     gpu.hbm_bytes_per_second, gpu.nvlink_bytes_per_second);
}

double params_of_chunk(const ir::Scenario& sc, int virtual_stage, int virtual_stages, int layers) {
  const Shape s = shape_of(sc);
  double params = layers * params_per_layer(sc);
  const double embedding = double(sc.model.vocab) * s.h / s.t;
  if (virtual_stage == 0) params += embedding + double(sc.model.seq) * s.h;
  if (virtual_stage == virtual_stages - 1) {
    params += 2 * s.h;  // final LayerNorm
    if (virtual_stage != 0) params += embedding;  // Megatron's copy of the tied word embedding
  }
  return params;
}

double activation_bytes(const ir::Scenario& sc, int virtual_stage, int virtual_stages, int layers,
                        int tokens, int prefix) {
  const Shape s = shape_of(sc);
  double bytes = layers * layer_activation_bytes(sc, tokens, prefix);
  // Last stage: the fp32 logits and the final LayerNorm's input/output kept for backward.
  if (virtual_stage == virtual_stages - 1)
    bytes += 4 * s.b * tokens * (s.h + double(sc.model.vocab)) / s.t;
  return bytes;
}

double optimizer_seconds(const ir::Scenario& sc, const ir::GpuSpec& gpu, double params) {
  return stack_slowdown(sc) * hbm_seconds(params * default_efficiencies().optimizer_bytes_per_param, gpu);
}

double host_copy_seconds(const ir::Scenario& sc, const ir::GpuSpec& gpu, double bytes) {
  return kHostCopyLatencySeconds + bytes / ir::host_link_bytes_per_second(sc.cluster, gpu);
}

double onebit_compress_seconds(const ir::Scenario& sc, const ir::GpuSpec& gpu, double elements) {
  const Efficiencies& eff = default_efficiencies();
  const double d = std::max(1, sc.parallel.data);
  return stack_slowdown(sc) * hbm_seconds(elements * (eff.onebit_bytes_per_element + eff.onebit_server_bytes / d), gpu);
}

std::vector<int> solve_slices_by(int seq, int slices,
                                 const std::function<double(double tokens, double prefix)>& cost) {
  if (slices < 1 || slices > seq)
    throw Error(fmt::format("slices: {} slices of a {}-token sequence; expected 1 ≤ slices ≤ seq",
                            slices, seq));
  if (slices == 1) return {seq};
  // Length of a slice after `prefix` whose cost is `target` (at most `rest`).
  auto length_for = [&](double target, double prefix, double rest) {
    if (cost(rest, prefix) <= target) return rest;
    double lo = 0, hi = rest;
    // Cuts are rounded to whole tokens: a millionth of a token is exact enough.
    for (int it = 0; it < 100 && hi - lo > 1e-6; ++it) {
      const double mid = 0.5 * (lo + hi);
      (cost(mid, prefix) < target ? lo : hi) = mid;
    }
    return 0.5 * (lo + hi);
  };
  // Cut S−1 slices of cost `target` greedily; returns the boundaries.
  auto cut = [&](double target) {
    std::vector<double> bounds;
    double prefix = 0;
    for (int j = 0; j + 1 < slices; ++j) {
      prefix += length_for(target, prefix, seq - prefix);
      bounds.push_back(prefix);
    }
    return bounds;
  };
  // The last slice's cost falls as the target rises: bisect to make them equal.
  double lo = 0, hi = cost(seq, 0);
  for (int it = 0; it < 100 && hi - lo > 1e-12 * hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    const auto bounds = cut(mid);
    const double last = cost(seq - bounds.back(), bounds.back());
    (last > mid ? lo : hi) = mid;
  }
  const auto bounds = cut(0.5 * (lo + hi));
  std::vector<int> out;
  int prev = 0;
  for (int j = 0; j + 1 < slices; ++j) {
    int b = int(std::lround(bounds[j]));
    b = std::clamp(b, prev + 1, seq - (slices - 1 - j));
    out.push_back(b - prev);
    prev = b;
  }
  out.push_back(seq - prev);
  return out;
}

std::vector<int> solve_slices(const ir::Scenario& sc, int slices) {
  const int seq = sc.model.seq;
  if (seq <= 0)
    throw Error(fmt::format("{}: model.seq must be positive to cut temporal slices (got {})", sc.name, seq));
  if (slices <= 1) return {seq};
  const ir::GpuSpec gpu = gpu_of_rank(sc, 0);
  // The cuts depend on the layer's cost shape only; kept across calls (a search cuts
  // many layouts of one shape).
  thread_local std::map<std::string, std::vector<int>> memo;
  const std::string key = fmt::format("{}|{}", cost_shape_key(sc, gpu), slices);
  if (auto it = memo.find(key); it != memo.end()) return it->second;
  if (memo.size() >= 1024) memo.clear();
  std::vector<int> cuts = solve_slices_by(seq, slices, [&](double tokens, double prefix) {
    if (tokens <= 0) return 0.0;
    const LayerCostD c = layer_cost_d(sc, gpu, tokens, prefix);
    return c.f.seconds + c.b.seconds + c.w.seconds;
  });
  return memo.emplace(key, std::move(cuts)).first->second;
}

std::vector<int> partition_by(int layers, const std::vector<double>& per_layer, const std::vector<double>& fixed) {
  const int V = static_cast<int>(per_layer.size());
  if (V < 1 || static_cast<int>(fixed.size()) != V || layers < V)
    throw Error(fmt::format("partition: {} layers over {} stages; expected at least one layer per stage", layers, V));
  // O(V·(L−V)²) time in two (V+1)·(L+1) tables: refuse what would not finish.
  const double work = double(V) * double(layers - V + 1) * double(layers - V + 1);
  if (work > 4e9 || double(V + 1) * double(layers + 1) > 2e7)
    throw Error(fmt::format("partition: {} layers over {} stages is beyond what the partition programme "
                            "solves in seconds; give parallel.layers_per_stage as a list", layers, V));
  for (int k = 0; k < V; ++k)
    if (!std::isfinite(per_layer[k]) || !std::isfinite(fixed[k]) || per_layer[k] < 0 || fixed[k] < 0)
      throw Error(fmt::format("partition: stage {} costs {} per layer + {}; expected finite costs ≥ 0", k,
                              per_layer[k], fixed[k]));
  auto cost = [&](int k, int n) { return n * per_layer[k] + fixed[k]; };
  // g[k][i]: the least bottleneck of stages k … V−1 holding layers i … L−1.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> g(V + 1, std::vector<double>(layers + 1, inf));
  g[V][layers] = 0;
  for (int k = V - 1; k >= 0; --k)
    for (int i = k; i <= layers - (V - k); ++i)
      for (int n = 1; i + n <= layers - (V - k - 1); ++n)
        g[k][i] = std::min(g[k][i], std::max(cost(k, n), g[k + 1][i + n]));
  // Among the partitions with that bottleneck, the most even (least Σ cost², so the
  // stages other than the bottleneck are not starved), then the lexicographically first:
  // earlier stages — which hold the most in-flight micro-batches under 1F1B — lighter.
  // Sums of the same squares in another order round differently: values within a
  // relative 1e-12 are ties, and each state records its choice (the fewest layers
  // among them), which the forward pass then follows.
  constexpr double kTie = 1e-12;
  const double best = g[0][0] * (1 + kTie);
  std::vector<std::vector<double>> h(V + 1, std::vector<double>(layers + 1, inf));
  std::vector<std::vector<int>> pick(V, std::vector<int>(layers + 1, 0));
  h[V][layers] = 0;
  for (int k = V - 1; k >= 0; --k)
    for (int i = k; i <= layers - (V - k); ++i) {
      auto value = [&](int n) {
        const double c = cost(k, n);
        return c <= best && h[k + 1][i + n] < inf ? c * c + h[k + 1][i + n] : inf;
      };
      const int last = layers - (V - k - 1) - i;  // the most layers stage k may take
      double least = inf;
      for (int n = 1; n <= last; ++n) least = std::min(least, value(n));
      if (least == inf) continue;
      for (int n = 1; n <= last; ++n)
        if (value(n) <= least * (1 + kTie)) {
          h[k][i] = least;
          pick[k][i] = n;
          break;
        }
    }
  if (h[0][0] == inf) throw Error("partition: no partition within the bottleneck (internal error)");
  std::vector<int> out;
  for (int k = 0, i = 0; k < V; ++k) {
    const int n = pick[k][i];
    out.push_back(n);
    i += n;
  }
  return out;
}

std::vector<int> partition_layers(const ir::Scenario& sc, const std::vector<std::vector<int>>& stage_of,
                                  int vstages) {
  const ir::ParallelConfig& par = sc.parallel;
  const int L = sc.model.layers;
  if (!par.layers_per_stage.empty()) {
    if (static_cast<int>(par.layers_per_stage.size()) != vstages)
      throw Error(fmt::format("{}: parallel.layers_per_stage lists {} stages but this schedule runs {} virtual "
                              "stages ({} ranks x {} chunks); give {} entries or `auto`",
                              sc.name, par.layers_per_stage.size(), vstages, stage_of.size(),
                              stage_of.empty() ? 0 : stage_of[0].size(), vstages));
    (void)ir::layer_range(par.layers_per_stage, L, 0, vstages);  // sums to the layers
    return par.layers_per_stage;
  }
  if (!par.layers_per_stage_auto) {
    if (vstages <= 0 || L % vstages != 0)
      throw Error(fmt::format("{}: model.layers ({}) must be divisible by the {} virtual stages of the plan "
                              "(or give parallel.layers_per_stage: a list or auto)",
                              sc.name, L, vstages));
    return std::vector<int>(static_cast<std::size_t>(vstages), L / vstages);
  }
  // auto: one full-sequence F + B + W per stage, on the GPU of the rank that runs it.
  std::vector<double> per_layer(static_cast<std::size_t>(vstages), 0.0), fixed(per_layer);
  for (int r = 0; r < static_cast<int>(stage_of.size()); ++r) {
    const ir::GpuSpec gpu = gpu_of_rank(sc, r);
    const LayerCostD layer = layer_cost_d(sc, gpu, sc.model.seq, 0);
    for (int vs : stage_of[r]) {
      if (vs < 0 || vs >= vstages)
        throw Error(fmt::format("partition: stage_of[{}] names virtual stage {} of {}", r, vs, vstages));
      const LayerCostD ends = ends_cost(sc, gpu, vs, vstages, sc.model.seq, 0);
      per_layer[vs] = layer.f.seconds + layer.b.seconds + layer.w.seconds;
      fixed[vs] = ends.f.seconds + ends.b.seconds + ends.w.seconds;
    }
  }
  if (L < vstages)
    throw Error(fmt::format("{}: parallel.layers_per_stage: auto needs at least one layer per virtual stage; "
                            "model.layers = {} < {}", sc.name, L, vstages));
  return partition_by(L, per_layer, fixed);
}

std::vector<int> slice_grid(int seq, int max_units) {
  const int G = std::max(1, std::min(seq, max_units));
  std::vector<int> at(static_cast<std::size_t>(G) + 1);
  for (int u = 0; u <= G; ++u) at[u] = static_cast<int>(static_cast<long long>(seq) * u / G);
  return at;
}

std::vector<int> solve_slices_terapipe(int seq, int stages, int microbatches, int max_units,
                                       const std::function<double(double tokens, double prefix)>& compute,
                                       const std::function<double(double tokens)>& transfer) {
  if (seq < 1 || stages < 1 || microbatches < 1 || max_units < 1)
    throw Error(fmt::format("slices auto: seq = {}, p = {}, m = {}, units = {}; expected all ≥ 1", seq, stages,
                            microbatches, max_units));
  // Cut points on a grid of G units, as TeraPipe does.
  const std::vector<int> at = slice_grid(seq, max_units);
  const int G = static_cast<int>(at.size()) - 1;
  const std::size_t n = static_cast<std::size_t>(G) + 1;
  std::vector<double> c(n * n, 0.0), t(n * n, 0.0);  // [a][b]: slice of units a … b−1
  std::vector<double> candidates;
  for (int a = 0; a < G; ++a)
    for (int b = a + 1; b <= G; ++b) {
      const double len = at[b] - at[a];
      c[a * n + b] = compute(len, at[a]);
      t[a * n + b] = c[a * n + b] + transfer(len);
      candidates.push_back(t[a * n + b]);
    }
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  if (stages == 1) candidates.erase(candidates.begin(), candidates.end() - 1);  // no fill: no bound
  // For each bound on the longest slice (ascending), the least total under it; the
  // pipeline takes m·Σcᵢ + (p−1)·max tⱼ. No cut costs less than the least Σcᵢ under no
  // bound, so stop once m·that + (p−1)·bound is no better than the best found.
  const double inf = std::numeric_limits<double>::infinity();
  double best = inf;
  std::vector<double> f(n);
  std::vector<int> from(n);
  std::fill(f.begin(), f.end(), inf);
  f[0] = 0;
  for (int b = 1; b <= G; ++b)
    for (int a = 0; a < b; ++a) f[b] = std::min(f[b], f[a] + c[a * n + b]);
  const double least_total = microbatches * f[G];
  // f under a bound = the shortest path from unit 0 to G over the slices with t ≤ bound.
  // Bounds ascend, so slices are only ever added: insert each in t order and relax
  // forward from where it lowered f (the same sums as one DP per bound, far fewer).
  std::vector<std::pair<int, int>> slices_by_t;
  for (int a = 0; a < G; ++a)
    for (int b = a + 1; b <= G; ++b) slices_by_t.emplace_back(a, b);
  std::stable_sort(slices_by_t.begin(), slices_by_t.end(), [&](const auto& x, const auto& y) {
    return t[x.first * n + x.second] < t[y.first * n + y.second];
  });
  std::vector<char> allowed(n * n, 0);
  std::fill(f.begin(), f.end(), inf);
  f[0] = 0;
  auto relax_from = [&](int b) {
    for (int x = b + 1; x <= G; ++x)
      for (int y = b; y < x; ++y)
        if (allowed[y * n + x] && f[y] + c[y * n + x] < f[x]) f[x] = f[y] + c[y * n + x];
  };
  std::size_t added = 0;
  double best_bound = inf;
  for (double bound : candidates) {
    if (best < inf && least_total + (stages - 1) * bound >= best) break;
    for (; added < slices_by_t.size(); ++added) {
      const auto [a, b] = slices_by_t[added];
      if (t[a * n + b] > bound) break;
      allowed[a * n + b] = 1;
      if (f[a] < inf && f[a] + c[a * n + b] < f[b]) {
        f[b] = f[a] + c[a * n + b];
        relax_from(b);
      }
    }
    if (f[G] == inf) continue;
    const double total = microbatches * f[G] + (stages - 1) * bound;
    if (total < best) best = total, best_bound = bound;
  }
  // The cuts of the best bound, by the plain DP (its tie-breaks: the first a that lowers f[b]).
  std::fill(f.begin(), f.end(), inf);
  f[0] = 0;
  for (int b = 1; b <= G; ++b)
    for (int a = 0; a < b; ++a)
      if (f[a] < inf && t[a * n + b] <= best_bound && f[a] + c[a * n + b] < f[b]) f[b] = f[a] + c[a * n + b], from[b] = a;
  std::vector<int> best_cut;
  for (int b = G; b > 0; b = from[b]) best_cut.push_back(at[b] - at[from[b]]);
  std::reverse(best_cut.begin(), best_cut.end());
  return best_cut;
}

void apply_costs(ir::Plan& plan, const ir::Scenario& sc) {
  const int S = std::max(1, plan.slices);
  if (sc.synthetic) {
    const auto& syn = *sc.synthetic;
    // Times are given per chunk of a model cut into syn.chunks chunks per rank; a
    // schedule running plan.chunks chunks keeps the rank's total work the same.
    const double k = double(std::max(1, syn.chunks)) / std::max(1, plan.chunks) / S;
    const double act = syn.activation_bytes * k;
    for (auto& ops : plan.ranks) {
      for (auto& op : ops) {
        if (!ir::is_compute(op.kind)) continue;
        op.flops = 0;
        switch (op.kind) {
          case OpKind::F: op.est_seconds = syn.f_seconds * k; op.mem_bytes = act; break;
          case OpKind::B: op.est_seconds = syn.b_seconds * k; op.mem_bytes = -act; break;
          case OpKind::W: op.est_seconds = syn.w_seconds * k; op.mem_bytes = 0; break;
          case OpKind::BW: op.est_seconds = (syn.b_seconds + syn.w_seconds) * k; op.mem_bytes = -act; break;
          default: op.est_seconds = 0; op.mem_bytes = 0; break;  // OPT
        }
      }
    }
    return;
  }
  const int vstages = plan.virtual_stages();
  if (int(plan.stage_of.size()) != plan.num_ranks())
    throw Error(fmt::format("apply_costs: plan has {} ranks but stage_of lists {} (expected one entry per rank)",
                            plan.num_ranks(), plan.stage_of.size()));
  if (plan.stage_layers.empty()) plan.stage_layers = partition_layers(sc, plan.stage_of, vstages);
  const std::vector<int> layers = chunk_layers(plan, sc);
  if (S > 1 && int(plan.slice_tokens.size()) != S) plan.slice_tokens = solve_slices(sc, S);
  std::vector<int> tokens(S, sc.model.seq), prefix(S, 0);
  if (S > 1)
    for (int j = 0, acc = 0; j < S; ++j) {
      tokens[j] = plan.slice_tokens[j];
      prefix[j] = acc;
      acc += tokens[j];
    }
  for (int r = 0; r < plan.num_ranks(); ++r) {
    const ir::GpuSpec gpu = gpu_of_rank(sc, r);
    double rank_params = 0;
    for (int c = 0; c < int(plan.stage_of.at(r).size()); ++c)
      rank_params += params_of_chunk(sc, plan.stage_of[r][c], vstages, layers.at(plan.stage_of[r][c]));
    // Costs depend on (kind, chunk, slice) only: compute each once per rank.
    const int chunks = int(plan.stage_of[r].size());
    struct Cached {
      bool set = false;
      OpCost cost;
      double mem = 0;
    };
    std::vector<Cached> cache(static_cast<std::size_t>(chunks) * S * 4);
    for (auto& op : plan.ranks[r]) {
      if (!ir::is_compute(op.kind)) continue;
      if (op.kind == OpKind::OPT) {
        op.flops = 0;
        op.est_seconds = optimizer_seconds(sc, gpu, rank_params);
        op.mem_bytes = 0;
        continue;
      }
      if (op.chunk < 0 || op.chunk >= chunks || op.slice < 0 || op.slice >= S)
        throw Error(fmt::format("apply_costs: rank {}: op {} has chunk {} / slice {} outside the plan "
                                "({} chunks, {} slices)", r, ir::to_string(op.kind), op.chunk, op.slice,
                                chunks, S));
      Cached& c = cache[(static_cast<std::size_t>(op.chunk) * S + op.slice) * 4 +
                        static_cast<std::size_t>(op.kind)];
      if (!c.set) {
        const int vs = plan.stage_of[r][op.chunk];
        const int len = tokens[op.slice], pre = prefix[op.slice];
        const int n = layers.at(vs);
        c.cost = chunk_cost(sc, gpu, op.kind, vs, vstages, n, len, pre);
        const double act = activation_bytes(sc, vs, vstages, n, len, pre);
        const double keep = std::min(act, n * layer_w_bytes(sc, len));
        switch (op.kind) {
          case OpKind::F: c.mem = act; break;
          case OpKind::B: c.mem = -(act - keep); break;
          case OpKind::W: c.mem = -keep; break;
          default: c.mem = -act; break;  // BW
        }
        c.set = true;
      }
      op.flops = c.cost.flops;
      op.est_seconds = c.cost.seconds;
      op.mem_bytes = c.mem;
    }
  }
}

ir::LoweringOptions lowering_options(const ir::Plan& plan, const ir::Scenario& sc) {
  ir::LoweringOptions opt;
  if (sc.synthetic) {
    opt.p2p_bytes = [](const ir::Op&) -> std::int64_t { return 0; };
    opt.grad_bytes = [](int, int) -> std::int64_t { return 0; };
    return opt;
  }
  const Shape s = shape_of(sc);
  const std::vector<int> slice_tokens = plan.slice_tokens;
  const int seq = sc.model.seq;
  opt.p2p_bytes = [s, slice_tokens, seq](const ir::Op& producer) -> std::int64_t {
    const int len = slice_tokens.empty() ? seq
                    : slice_tokens.at(std::clamp(producer.slice, 0, int(slice_tokens.size()) - 1));
    return std::llround(s.b * len * s.h * s.e / s.t);
  };
  const int vstages = plan.virtual_stages();
  const std::vector<int> layers = chunk_layers(plan, sc);
  const auto stage_of = plan.stage_of;
  opt.grad_bytes = [sc, stage_of, vstages, layers, e = s.e](int rank, int chunk) -> std::int64_t {
    const int vs = stage_of.at(rank).at(chunk);
    return std::llround(params_of_chunk(sc, vs, vstages, layers.at(vs)) * e);
  };
  if (sc.parallel.offload()) {
    // Time-shared parameter loading: each decoder layer is one block of 16-bit weights.
    const std::int64_t block = std::llround(params_per_layer(sc) * s.e);
    opt.offload_blocks = [stage_of, layers, block](int rank, int chunk) {
      return std::vector<std::int64_t>(static_cast<std::size_t>(layers.at(stage_of.at(rank).at(chunk))), block);
    };
    opt.copy_seconds = [sc](int rank, std::int64_t bytes) {
      return host_copy_seconds(sc, gpu_of_rank(sc, rank), static_cast<double>(bytes));
    };
    opt.offload_window = kOffloadWindow;
    // fp32 master + two fp32 moments per 16-bit weight (fp32 training: two moments per fp32 weight).
    opt.offload_state_ratio = s.e == 4 ? 2 : 6;
  }
  opt.overlap_dp = sc.parallel.overlap_grad_reduce;
  opt.overlap_p2p = sc.parallel.overlap_p2p;
  opt.bucket_bytes = std::max<std::int64_t>(1, std::llround(sc.parallel.bucket_mb * (1 << 20)));
  const int shards = optimizer_shards(sc);
  opt.shard_optimizer = shards > 1;
  if (sc.parallel.onebit() && sc.parallel.data > 1) {
    opt.compress_element_bytes = static_cast<int>(s.e);
    opt.compress_seconds = [sc](int rank, std::int64_t elements) {
      return onebit_compress_seconds(sc, gpu_of_rank(sc, rank), static_cast<double>(elements));
    };
  }
  std::vector<double> opt_seconds;
  for (int r = 0; r < int(stage_of.size()); ++r) {
    double params = 0;
    for (int vs : stage_of[r]) params += params_of_chunk(sc, vs, vstages, layers.at(vs));
    // ZeRO-1: each replica steps its 1/d shard of the parameters.
    params /= shards;
    opt_seconds.push_back(optimizer_seconds(sc, gpu_of_rank(sc, r), params));
  }
  opt.optimizer_seconds = [opt_seconds](int rank) { return opt_seconds.at(rank); };
  return opt;
}

MemoryEstimate static_bytes_per_param(const ir::Scenario& sc) {
  const bool fp32 = elem_bytes(sc) == 4;
  MemoryEstimate m;
  m.weights_bytes = fp32 ? 4 : 2;
  m.grads_bytes = fp32 ? 4 : 2;
  m.optimizer_bytes = (fp32 ? 8.0 : 12.0) / optimizer_shards(sc);
  // 1-bit Adam's error feedback: the worker's over every parameter, the server's over
  // the member's segment of each bucket.
  if (sc.parallel.onebit() && sc.parallel.data > 1 && !sc.synthetic) m.optimizer_bytes += 4.0 + 4.0 / sc.parallel.data;
  return m;
}

MemoryEstimate static_memory(const ir::Scenario& sc, double params, int layers) {
  const MemoryEstimate per = static_bytes_per_param(sc);
  MemoryEstimate m;
  m.grads_bytes = params * per.grads_bytes;
  // Parameter offload: the layers' weights and optimizer state are on the device only as
  // the window of blocks being streamed (counted for both at once: an upper bound, the
  // weights' window is empty while OPT streams the state).
  const double layer_params = layers * params_per_layer(sc);
  const double resident =
      sc.parallel.offload() ? params - layer_params + std::min(layer_params, kOffloadWindow * params_per_layer(sc))
                            : params;
  m.weights_bytes = resident * per.weights_bytes;
  m.optimizer_bytes = resident * per.optimizer_bytes;
  return m;
}

double auto_budget_bytes(const ir::Scenario& sc, int p, int m, double per_mb, double device_free_bytes) {
  const std::string& budget = sc.parallel.memory_budget;
  if (budget == "1f1b") return std::min(p, m) * per_mb;
  if (budget == "2x1f1b") return 2.0 * std::min(p, m) * per_mb;
  if (auto gib = ir::memory_budget_gib(budget)) return *gib * double(1u << 30);
  return device_free_bytes;
}

std::vector<MemoryEstimate> memory_per_rank(const ir::Plan& plan, const ir::Scenario& sc) {
  std::vector<MemoryEstimate> out(plan.num_ranks());
  const int vstages = plan.virtual_stages();
  const std::vector<int> layers = sc.synthetic ? std::vector<int>() : chunk_layers(plan, sc);
  for (int r = 0; r < plan.num_ranks(); ++r) {
    MemoryEstimate& m = out[r];
    if (!sc.synthetic) {
      double params = 0;
      int rank_layers = 0;
      for (int vs : plan.stage_of.at(r)) {
        params += params_of_chunk(sc, vs, vstages, layers.at(vs));
        rank_layers += layers.at(vs);
      }
      m = static_memory(sc, params, rank_layers);
    }
    double live = 0, peak = 0;
    for (const auto& op : plan.ranks[r]) {
      if (!ir::is_compute(op.kind)) continue;
      live += op.mem_bytes;
      peak = std::max(peak, live);
    }
    m.activation_bytes = peak;
  }
  return out;
}

std::optional<std::string> check_fits(const std::vector<MemoryEstimate>& memory, const ir::Scenario& sc) {
  if (sc.synthetic) return std::nullopt;
  double worst = 0;
  std::optional<std::string> msg;
  for (int r = 0; r < int(memory.size()); ++r) {
    const double have = gpu_of_rank(sc, r).hbm_bytes;
    const double need = memory[r].total_bytes();
    if (have <= 0 || need <= have) continue;
    if (need / have > worst) {
      worst = need / have;
      msg = fmt::format("does not fit: needs {:.1f} GiB of {:.1f} GiB on rank {}", need / kGiB,
                        have / kGiB, r);
    }
  }
  return msg;
}

}  // namespace tdpipe::planner
