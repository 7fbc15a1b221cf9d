// gpt_cuda.cpp — forward, split backward (B / W) and Adam of one GPT virtual stage
// on the GPU. Mirrors exec/src/cpu_gpt.cpp op for op; see gpt_cuda.hpp for the
// precision choices. Every kernel, GEMM and device copy of F, B and W is issued
// `if (issuing())`: while an op replays its CUDA graph its host code runs alone
// (op_graphs.hpp). Adam, LOAD and OFFLOAD never run inside a graph.
#include "gpt_cuda.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "check.hpp"
#include "device_memory.hpp"
#include "gemm.hpp"
#include "kernels.cuh"
#include "op_graphs.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec::cuda {

namespace {

using kernels::bf16;
namespace k = kernels;

struct Spec {
  std::string name;
  int rows = 0, cols = 0;
  std::int64_t offset = 0;
  int block = -1;  // the local decoder block it belongs to (-1: embedding or head)
  std::int64_t size() const { return std::int64_t(rows) * cols; }
};

// Saved by F (and filled by B) for one block of one (mb, slice). Of the attention: q, the
// output a (merged heads) and lse, each query row's log-sum-exp [b·H, T] (fp32) — with the
// KV cache all the fused backward needs to recompute the probabilities (no T × t1 matrix).
struct BlockSaved {
  DeviceMemory x, mean1, rstd1, h, q, lse, a, x2, mean2, rstd2, h2, u, g;
  DeviceMemory dz, du, dh2, dyattn, dqkv, dh;
};
struct HeadSaved {
  DeviceMemory x, mean, rstd, hf, dlogits, dhf;
};
struct SliceSaved {
  int t0 = 0, t1 = 0;
  std::vector<BlockSaved> blocks;
  HeadSaved head;
  const int* tokens = nullptr;  // stage 0: the micro-batch's device ids (owned by the compute)
  DeviceMemory dx0;             // stage 0: gradient at the embedding output
  bool backward_done = false;
  // fp16: one device int, set once this (mb, slice) read an inf/NaN another slice or
  // stage stored (and was flagged for): its own stores then overflow by contagion, which
  // is not charged to its scale (cpu_gpt.cpp's SliceState::tainted).
  DeviceMemory taint;
};
struct KvSaved {
  DeviceMemory k, v, dk, dv;  // [b·H, seq, dh]; k, v 16-bit, gradients fp32
};
// Parameter offload: one block's parameters on the device, brought by a LOAD — for an
// F/B/BW its fp32 weights (LayerNorm, biases) and their bf16 copy (GEMMs); for OPT its
// fp32 weights and both Adam moments.
struct BlockCopy {
  DeviceMemory master, wbf, m1, m2;
  std::int64_t bytes = 0;
  OwnedEvent stepped;  // OPT's copy: recorded on the compute stream after its Adam
};

using kernels::half;
// T16: the 16-bit type of GEMM inputs and stored activations (bf16, or half in fp16 training).
template <class T16>
constexpr cudaDataType kType16 = std::is_same_v<T16, half> ? CUDA_R_16F : CUDA_R_16BF;
template <class T16>
MatRef in16(const void* p, int ld, std::int64_t stride = 0) { return {p, kType16<T16>, ld, stride}; }
MatOut out_f32(void* p, int ld, std::int64_t stride = 0) { return {p, CUDA_R_32F, ld, stride}; }
template <class T16>
MatOut out16(void* p, int ld, std::int64_t stride = 0) { return {p, kType16<T16>, ld, stride}; }

}  // namespace

std::int64_t stage_state_bytes(std::int64_t parameters) {
  // master + grad + 2 Adam moments (fp32) + the bf16 copy.
  return parameters * (4 * 4 + 2);
}

struct GptStageCuda::Impl {
  cpu::GptConfig cfg;
  int stage = 0, stages = 1, first_block = 0, last_block = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  std::vector<Spec> specs;
  std::map<std::string, std::size_t> index;
  std::int64_t total = 0;
  // Gradients over every parameter; weights, moments and the bf16 copy over the resident
  // ones: all without offload, else all but the decoder blocks [bstart, bend) of the flat
  // order, whose master copy lives in host memory (home_*) and arrives by LOAD.
  DeviceMemory master, grad, m1, m2, wbf;
  std::map<std::pair<int, int>, SliceSaved> slices;  // (mb, slice)
  std::map<std::pair<int, int>, KvSaved> kv;         // (mb, block)
  bool offload = false;
  std::int64_t bstart = 0, bend = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> block_range;  // [local block] its params [first, last)
  PinnedFloats home_master, home_m1, home_m2;  // offloaded [bstart, bend), pinned host memory
  cpu::DeviceMemory* memory = nullptr;  // bytes of weights and optimizer state on the device
  std::mutex copies_mu;                 // the copy thread adds copies, the compute thread takes them
  std::vector<std::deque<BlockCopy>> loaded;  // [block] weight copies LOADed, in LOAD order
  std::vector<std::optional<BlockCopy>> state;  // [block] OPT's copy
  std::vector<std::optional<BlockCopy>> in_use;  // [block] the copy the running op reads (compute thread)
  std::function<void(int)> block_begin, block_end;
  // fp16 training (model.dtype fp16): T16 is half, the loss scaled per slice (scales, set
  // each step), and `flags` holds one device int per slice: this step's stores of the
  // slice overflowed. `inject`: the slice whose next B starts from an inf (−1: none).
  bool fp16 = false;
  std::vector<float> scales;
  DeviceMemory flags;
  int inject = -1;

  // Calls f(T16{}) with the stage's 16-bit type.
  template <class F>
  decltype(auto) with16(F&& f) {
    return fp16 ? f(half{}) : f(bf16{});
  }
  // Bytes of one value of the 16-bit type (2 on a GPU; the exact emulation keeps bf16 in 4).
  std::size_t bytes16() const { return fp16 ? sizeof(half) : sizeof(bf16); }
  float grad_scale(int slice) const {
    if (!fp16) return 1.f;
    if (slice < 0 || slice >= static_cast<int>(scales.size()))
      throw Error("CUDA GPT stage " + std::to_string(stage) + ": slice " + std::to_string(slice) +
                  " has no loss scale (set_loss_scales gave " + std::to_string(scales.size()) + ")");
    return scales[static_cast<std::size_t>(slice)];
  }
  // fp16: a store of the slice's activation or gradient (n values at p) overflowed →
  // its flag, unless the slice is tainted (cpu_gpt.cpp's store()).
  template <class T>
  void stored(const T* p, std::int64_t n, int slice, const SliceSaved& st) {
    if (fp16 && issuing()) k::flag_nonfinite(p, 1, n, n, flags.as<int>() + slice, st.taint.as<int>(), stream);
  }
  template <class T>
  void stored(const DeviceMemory& m, int slice, const SliceSaved& st) {
    stored(m.as<T>(), static_cast<std::int64_t>(m.bytes() / sizeof(T)), slice, st);
  }
  // fp16: the running op read `runs` runs of `len` values `stride` apart at p from another
  // slice or stage: an inf or NaN in them taints the slice.
  template <class T>
  void read(const T* p, int runs, std::int64_t len, std::int64_t stride, const SliceSaved& st) {
    if (fp16 && issuing()) k::flag_nonfinite(p, runs, len, stride, st.taint.as<int>(), nullptr, stream);
  }

  std::int64_t resident_index(std::int64_t offset) const { return offset < bstart ? offset : offset - (bend - bstart); }
  std::int64_t resident() const { return total - (bend - bstart); }

  bool first() const { return stage == 0; }
  bool last() const { return stage == stages - 1; }
  std::string bname(int l, const char* p) const { return "block" + std::to_string(l) + "." + p; }
  const Spec& spec(const std::string& name) const { return specs[index.at(name)]; }
  // A block's parameter under offload: in the copy its op holds (block_begin took it).
  const BlockCopy& held(const Spec& s) const {
    const auto& c = in_use[static_cast<std::size_t>(s.block)];
    if (!c)
      throw Error("CUDA GPT stage " + std::to_string(stage) + ": " + s.name +
                  " used while its block is not on the device (parameter offload: no LOAD for this use)");
    return *c;
  }
  std::int64_t in_block(const Spec& s) const { return s.offset - block_range[static_cast<std::size_t>(s.block)].first; }
  float* P(const std::string& n) const {
    const Spec& s = spec(n);
    if (offload && s.block >= 0) return held(s).master.as<float>() + in_block(s);
    return master.as<float>() + resident_index(s.offset);
  }
  float* G(const std::string& n) const { return grad.as<float>() + spec(n).offset; }
  template <class T16>
  T16* W(const std::string& n) const {
    const Spec& s = spec(n);
    if (offload && s.block >= 0) return held(s).wbf.as<T16>() + in_block(s);
    return wbf.as<T16>() + resident_index(s.offset);
  }
  // The 16-bit weight copy of n values from the fp32 master, on `on`.
  void cast16(const float* from, void* to, std::int64_t n, cudaStream_t on) {
    with16([&](auto z) { k::to_16(from, static_cast<decltype(z)*>(to), n, on); });
  }
  void check_block(int block, const char* what) const {
    if (!offload || block < 0 || block >= static_cast<int>(block_range.size()))
      throw Error("CUDA GPT stage " + std::to_string(stage) + ": " + what + " of block " + std::to_string(block) +
                  (offload ? ": the stage has blocks 0.." + std::to_string(block_range.size() - 1)
                           : ": the stage keeps its parameters on the device (parallel.param_offload: none)"));
  }
  // The whole flat vector of the weights (which = 0) or an Adam moment (1, 2): the
  // resident part from the device, the offloaded blocks from their host copy.
  // `n` floats of device memory `d`, downloaded.
  std::vector<float> fetch(const DeviceMemory& d, std::int64_t n) const {
    std::vector<float> out(static_cast<std::size_t>(n));
    if (!out.empty()) {
      TDPIPE_CUDA_CHECK(cudaMemcpyAsync(out.data(), d.get(), out.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
      TDPIPE_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    return out;
  }
  std::vector<float> flat(int which) const {
    std::vector<float> out = fetch(which == 0 ? master : which == 1 ? m1 : m2, resident());
    if (offload) {
      const PinnedFloats& home = which == 0 ? home_master : which == 1 ? home_m1 : home_m2;
      out.insert(out.begin() + bstart, home.begin(), home.end());
    }
    return out;
  }
  void set_flat(int which, std::vector<float> values) {
    DeviceMemory& d = which == 0 ? master : which == 1 ? m1 : m2;
    if (offload) {
      PinnedFloats& home = which == 0 ? home_master : which == 1 ? home_m1 : home_m2;
      std::copy(values.begin() + bstart, values.begin() + bend, home.begin());
      values.erase(values.begin() + bstart, values.begin() + bend);
    }
    if (!values.empty())
      TDPIPE_CUDA_CHECK(cudaMemcpyAsync(d.get(), values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice,
                                        stream));
    TDPIPE_CUDA_CHECK(cudaStreamSynchronize(stream));  // `values` dies here
    if (which == 0) cast16(master.as<float>(), wbf.get(), resident(), stream);
  }
  void begin_block(int l) {
    if (block_begin) block_begin(l - first_block);
  }
  void end_block(int l) {
    if (block_end) block_end(l - first_block);
  }

  void add(const std::string& name, int rows, int cols, int block = -1) {
    index[name] = specs.size();
    specs.push_back({name, rows, cols, 0, block});
  }
  // The CPU model's parameter order (cpu_gpt.cpp, Impl::build); checked against it below.
  void build_specs() {
    const int H = cfg.hidden, F = cfg.ffn;
    if (first()) {
      add("embed.tok", cfg.vocab, H);
      add("embed.pos", cfg.seq, H);
    }
    for (int l = first_block; l < last_block; ++l) {
      const int b = l - first_block;
      add(bname(l, "ln1.g"), 1, H, b);
      add(bname(l, "ln1.b"), 1, H, b);
      add(bname(l, "wq"), H, H, b);
      add(bname(l, "wk"), H, H, b);
      add(bname(l, "wv"), H, H, b);
      add(bname(l, "wo"), H, H, b);
      add(bname(l, "bo"), 1, H, b);
      add(bname(l, "ln2.g"), 1, H, b);
      add(bname(l, "ln2.b"), 1, H, b);
      add(bname(l, "w1"), H, F, b);
      add(bname(l, "b1"), 1, F, b);
      add(bname(l, "w2"), F, H, b);
      add(bname(l, "b2"), 1, H, b);
    }
    if (last()) {
      add("head.ln.g", 1, H);
      add("head.ln.b", 1, H);
      add("head.out", H, cfg.vocab);
      add("head.bias", 1, cfg.vocab);
    }
    total = 0;
    block_range.assign(static_cast<std::size_t>(last_block - first_block), {0, 0});
    for (auto& s : specs) {
      s.offset = total;
      total += s.size();
      if (s.block < 0) continue;
      auto& [first, last] = block_range[static_cast<std::size_t>(s.block)];
      if (last == 0) first = s.offset;
      last = total;
    }
  }

  KvSaved& kv_of(int mb, int l) {
    auto [it, inserted] = kv.try_emplace({mb, l});
    if (inserted) {
      const std::size_t n = std::size_t(cfg.micro_batch) * cfg.seq * cfg.hidden;
      it->second.k = DeviceMemory(n * bytes16(), stream);
      it->second.v = DeviceMemory(n * bytes16(), stream);
      it->second.dk = DeviceMemory(n * sizeof(float), stream, true);
      it->second.dv = DeviceMemory(n * sizeof(float), stream, true);
    }
    return it->second;
  }

  // x (fp32 N×H, moved into the saved state) → returns the block's output (fp32 N×H).
  template <class T16>
  DeviceMemory block_forward(int mb, int l, int slice, int t0, int t1, DeviceMemory x, BlockSaved& s,
                             const SliceSaved& st) {
    const int b = cfg.micro_batch, T = t1 - t0, H = cfg.hidden, F = cfg.ffn;
    const int nh = cfg.heads, dh = H / nh, bh = b * nh, N = b * T, S = cfg.seq;
    const float eps = static_cast<float>(cfg.ln_eps);
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    const std::size_t nH = std::size_t(N) * H, nF = std::size_t(N) * F;
    s.x = std::move(x);
    s.mean1 = DeviceMemory(N * sizeof(float), stream);
    s.rstd1 = DeviceMemory(N * sizeof(float), stream);
    s.h = DeviceMemory(nH * sizeof(T16), stream);
    if (issuing()) k::layernorm_forward(s.x.as<float>(), P(bname(l, "ln1.g")), P(bname(l, "ln1.b")), s.h.as<T16>(),
                                        s.mean1.as<float>(), s.rstd1.as<float>(), N, H, eps, stream);
    stored<T16>(s.h, slice, st);
    // q, k, v: one batched GEMM over the three consecutive H×H weights.
    DeviceMemory qkv(3 * nH * sizeof(T16), stream);
    if (issuing()) gemm(cublas, false, false, N, H, H, 1.f, in16<T16>(s.h.get(), H, 0),
                        in16<T16>(W<T16>(bname(l, "wq")), H, std::int64_t(H) * H),
                        0.f, out16<T16>(qkv.get(), H, std::int64_t(nH)), 3);
    KvSaved& cache = kv_of(mb, l);
    s.q = DeviceMemory(nH * sizeof(T16), stream);
    if (issuing()) k::split_qkv(qkv.as<T16>(), s.q.as<T16>(), cache.k.as<T16>(), cache.v.as<T16>(), b, T, S, t0, nh, dh,
                                stream);
    stored<T16>(qkv, slice, st);
    qkv.reset();
    if (t0 > 0) {  // earlier slices' keys and values: rows [0, t0) of each (sequence, head)
      read(cache.k.as<T16>(), bh, std::int64_t(t0) * dh, std::int64_t(S) * dh, st);
      read(cache.v.as<T16>(), bh, std::int64_t(t0) * dh, std::int64_t(S) * dh, st);
    }
    // This slice's queries against keys 0 … t1 − 1 of the sequence, fused: the scores
    // and probabilities stay on chip. fp16: p ∈ [0, 1] and o, a convex combination of
    // rows of v, cannot overflow; a (o with its heads merged) is checked as it is stored.
    DeviceMemory o(nH * sizeof(T16), stream);
    s.lse = DeviceMemory(std::size_t(bh) * T * sizeof(float), stream);
    if (issuing()) k::flash_attention_forward(s.q.as<T16>(), cache.k.as<T16>(), cache.v.as<T16>(), o.as<T16>(), s.lse.as<float>(),
                                              bh, T, S, t0, dh, scale, stream);
    s.a = DeviceMemory(nH * sizeof(T16), stream);
    if (issuing()) k::merge_heads(o.as<T16>(), s.a.as<T16>(), b, T, nh, dh, stream);
    stored<T16>(s.a, slice, st);
    o.reset();
    s.x2 = DeviceMemory(nH * sizeof(float), stream);
    if (issuing()) gemm(cublas, false, false, N, H, H, 1.f, in16<T16>(s.a.get(), H), in16<T16>(W<T16>(bname(l, "wo")), H), 0.f,
                        out_f32(s.x2.get(), H));
    if (issuing()) k::bias_residual_add(s.x2.as<float>(), s.x2.as<float>(), P(bname(l, "bo")), s.x.as<float>(), N, H, stream);
    s.mean2 = DeviceMemory(N * sizeof(float), stream);
    s.rstd2 = DeviceMemory(N * sizeof(float), stream);
    s.h2 = DeviceMemory(nH * sizeof(T16), stream);
    if (issuing()) k::layernorm_forward(s.x2.as<float>(), P(bname(l, "ln2.g")), P(bname(l, "ln2.b")), s.h2.as<T16>(),
                                        s.mean2.as<float>(), s.rstd2.as<float>(), N, H, eps, stream);
    stored<T16>(s.h2, slice, st);
    s.u = DeviceMemory(nF * sizeof(T16), stream);
    if (issuing()) gemm(cublas, false, false, N, F, H, 1.f, in16<T16>(s.h2.get(), H), in16<T16>(W<T16>(bname(l, "w1")), F), 0.f,
                        out16<T16>(s.u.get(), F));
    if (issuing()) k::bias_add(s.u.as<T16>(), P(bname(l, "b1")), N, F, stream);
    s.g = DeviceMemory(nF * sizeof(T16), stream);
    if (issuing()) k::gelu_forward(s.u.as<T16>(), s.g.as<T16>(), std::int64_t(nF), stream);
    stored<T16>(s.u, slice, st);
    stored<T16>(s.g, slice, st);
    DeviceMemory out(nH * sizeof(float), stream);
    if (issuing()) gemm(cublas, false, false, N, H, F, 1.f, in16<T16>(s.g.get(), F), in16<T16>(W<T16>(bname(l, "w2")), H), 0.f,
                        out_f32(out.get(), H));
    if (issuing()) k::bias_residual_add(out.as<float>(), out.as<float>(), P(bname(l, "b2")), s.x2.as<float>(), N, H, stream);
    return out;
  }

  // dout (fp32 N×H) → dL/dx (fp32 N×H); saves what W needs.
  template <class T16>
  DeviceMemory block_backward(int mb, int l, int slice, int t0, int t1, const float* dout, BlockSaved& s,
                              const SliceSaved& st) {
    const int b = cfg.micro_batch, T = t1 - t0, H = cfg.hidden, F = cfg.ffn;
    const int nh = cfg.heads, dh = H / nh, bh = b * nh, N = b * T, S = cfg.seq;
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    // fp16: gradients are of the slice's scaled loss; the key/value accumulators, which
    // several slices add to, hold them unscaled.
    const float loss_scale = grad_scale(slice), unscale = 1.f / loss_scale;
    const std::size_t nH = std::size_t(N) * H, nF = std::size_t(N) * F;
    s.dz = DeviceMemory(nH * sizeof(T16), stream);
    if (issuing()) k::to_16(dout, s.dz.as<T16>(), std::int64_t(nH), stream);
    stored<T16>(s.dz, slice, st);
    DeviceMemory dg(nF * sizeof(T16), stream);
    if (issuing()) gemm(cublas, false, true, N, F, H, 1.f, in16<T16>(s.dz.get(), H), in16<T16>(W<T16>(bname(l, "w2")), H), 0.f,
                        out16<T16>(dg.get(), F));
    stored<T16>(dg, slice, st);
    s.du = DeviceMemory(nF * sizeof(T16), stream);
    if (issuing()) k::gelu_backward(dg.as<T16>(), s.u.as<T16>(), s.du.as<T16>(), std::int64_t(nF), stream);
    stored<T16>(s.du, slice, st);
    dg.reset();
    s.dh2 = DeviceMemory(nH * sizeof(float), stream);
    if (issuing()) gemm(cublas, false, true, N, H, F, 1.f, in16<T16>(s.du.get(), F), in16<T16>(W<T16>(bname(l, "w1")), F), 0.f,
                        out_f32(s.dh2.get(), H));
    DeviceMemory dx2(nH * sizeof(float), stream);
    if (issuing()) TDPIPE_CUDA_CHECK(cudaMemcpyAsync(dx2.get(), dout, nH * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    if (issuing()) k::layernorm_backward_input(s.dh2.as<float>(), s.x2.as<float>(), s.mean2.as<float>(), s.rstd2.as<float>(),
                                               P(bname(l, "ln2.g")), dx2.as<float>(), N, H, stream);
    s.dyattn = DeviceMemory(nH * sizeof(T16), stream);
    if (issuing()) k::to_16(dx2.as<float>(), s.dyattn.as<T16>(), std::int64_t(nH), stream);
    stored<T16>(s.dyattn, slice, st);
    DeviceMemory da(nH * sizeof(T16), stream);
    if (issuing()) gemm(cublas, false, true, N, H, H, 1.f, in16<T16>(s.dyattn.get(), H), in16<T16>(W<T16>(bname(l, "wo")), H), 0.f,
                        out16<T16>(da.get(), H));
    stored<T16>(da, slice, st);
    DeviceMemory dO(nH * sizeof(T16), stream);
    if (issuing()) k::split_heads(da.as<T16>(), dO.as<T16>(), b, T, nh, dh, stream);
    da.reset();
    KvSaved& cache = kv_of(mb, l);
    const std::int64_t skv = std::int64_t(S) * dh;
    DeviceMemory o(nH * sizeof(T16), stream);  // the forward's output, in head layout again
    if (issuing()) k::split_heads(s.a.as<T16>(), o.as<T16>(), b, T, nh, dh, stream);
    DeviceMemory delta(std::size_t(bh) * T * sizeof(float), stream);
    DeviceMemory dq(nH * sizeof(T16), stream);
    // Adds to rows < t1 of dK/dV: keys/values of rows < t0 belong to earlier slices, whose
    // B reads these sums later.
    if (issuing()) k::flash_attention_backward(s.q.as<T16>(), cache.k.as<T16>(), cache.v.as<T16>(), o.as<T16>(), dO.as<T16>(),
                                               s.lse.as<float>(), delta.as<float>(), dq.as<T16>(), cache.dk.as<float>(),
                                               cache.dv.as<float>(), bh, T, S, t0, dh, scale, unscale, stream);
    // fp16: dS = scale · P ⊙ (dP − D) no longer passes through fp16 (it stays fp32 on chip),
    // so it cannot overflow as the stored ds could; what it feeds is checked where it is
    // stored: dq here, the dK/dV sums (fp32, unscaled) rescaled into dqkv below.
    stored<T16>(dq, slice, st);
    // Rows [t0, t1) of the accumulators: this slice's parts and later slices' (read).
    read(cache.dk.as<float>() + std::int64_t(t0) * dh, bh, std::int64_t(T) * dh, skv, st);
    read(cache.dv.as<float>() + std::int64_t(t0) * dh, bh, std::int64_t(T) * dh, skv, st);
    delta.reset();
    o.reset();
    dO.reset();
    s.dqkv = DeviceMemory(3 * nH * sizeof(T16), stream);
    if (issuing()) k::gather_dqkv(dq.as<T16>(), cache.dk.as<float>(), cache.dv.as<float>(), s.dqkv.as<T16>(), b, T, S, t0, nh,
                                  dh, loss_scale, stream);
    stored<T16>(s.dqkv, slice, st);
    dq.reset();
    s.dh = DeviceMemory(nH * sizeof(float), stream);
    const char* names[3] = {"wq", "wk", "wv"};
    for (int i = 0; i < 3; ++i)
      if (issuing()) gemm(cublas, false, true, N, H, H, 1.f, in16<T16>(s.dqkv.as<T16>() + i * nH, H),
                          in16<T16>(W<T16>(bname(l, names[i])), H),
                          i == 0 ? 0.f : 1.f, out_f32(s.dh.get(), H));
    DeviceMemory dx = std::move(dx2);
    if (issuing()) k::layernorm_backward_input(s.dh.as<float>(), s.x.as<float>(), s.mean1.as<float>(), s.rstd1.as<float>(),
                                               P(bname(l, "ln1.g")), dx.as<float>(), N, H, stream);
    // W reads neither q, the row log-sum-exps nor the pre-GeLU u (it uses a, dqkv, du, g):
    // free them now, so a split schedule (zb-*) that defers W holds only what W needs.
    // The frees are stream-ordered after the kernels above that read them.
    s.q.reset();
    s.lse.reset();
    s.u.reset();
    return dx;
  }

  // fp16: each part of the slice's (scaled) weight gradient is added unscaled.
  template <class T16>
  void block_weight(int l, int slice, int T, BlockSaved& s) {
    const int H = cfg.hidden, F = cfg.ffn, N = cfg.micro_batch * T;
    const float u = 1.f / grad_scale(slice);
    const std::int64_t nH = std::int64_t(N) * H;
    if (issuing()) gemm(cublas, true, false, F, H, N, u, in16<T16>(s.g.get(), F), in16<T16>(s.dz.get(), H), 1.f,
                        out_f32(G(bname(l, "w2")), H));
    if (issuing()) k::column_sum(s.dz.as<T16>(), G(bname(l, "b2")), N, H, u, stream);
    if (issuing()) gemm(cublas, true, false, H, F, N, u, in16<T16>(s.h2.get(), H), in16<T16>(s.du.get(), F), 1.f,
                        out_f32(G(bname(l, "w1")), F));
    if (issuing()) k::column_sum(s.du.as<T16>(), G(bname(l, "b1")), N, F, u, stream);
    if (issuing()) k::layernorm_backward_weight(s.dh2.as<float>(), s.x2.as<float>(), s.mean2.as<float>(), s.rstd2.as<float>(),
                                                G(bname(l, "ln2.g")), G(bname(l, "ln2.b")), N, H, u, stream);
    if (issuing()) gemm(cublas, true, false, H, H, N, u, in16<T16>(s.a.get(), H), in16<T16>(s.dyattn.get(), H), 1.f,
                        out_f32(G(bname(l, "wo")), H));
    if (issuing()) k::column_sum(s.dyattn.as<T16>(), G(bname(l, "bo")), N, H, u, stream);
    // wq, wk, wv are consecutive H×H blocks, and dqkv holds dq, dk, dv back to back.
    if (issuing()) gemm(cublas, true, false, H, H, N, u, in16<T16>(s.h.get(), H, 0), in16<T16>(s.dqkv.get(), H, nH), 1.f,
                        out_f32(G(bname(l, "wq")), H, std::int64_t(H) * H), 3);
    if (issuing()) k::layernorm_backward_weight(s.dh.as<float>(), s.x.as<float>(), s.mean1.as<float>(), s.rstd1.as<float>(),
                                                G(bname(l, "ln1.g")), G(bname(l, "ln1.b")), N, H, u, stream);
  }

  // The public F, B and W once checked, for the stage's 16-bit type (the first argument
  // only names it).
  template <class T16>
  void forward(T16, int mb, int slice, const float* x, float* out, const int* tokens, const int* targets,
               float loss_scale, double* loss, SliceSaved& st);
  template <class T16>
  void backward_input(T16, int mb, int slice, const float* dy, float* dx, SliceSaved& st);
  template <class T16>
  void backward_weight(T16, int slice, SliceSaved& st, const std::function<void(std::int64_t)>& final_tail);
};

GptStageCuda::GptStageCuda(const cpu::GptConfig& config, int stage, int stages, cudaStream_t stream,
                           cublasHandle_t cublas, cpu::DeviceMemory* memory, bool offload, bool fp16)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.fp16 = fp16;
  I.cfg = config;
  I.stage = stage;
  I.stages = stages;
  I.stream = stream;
  I.cublas = cublas;
  I.memory = memory;
  std::tie(I.first_block, I.last_block) = cpu::stage_layers(config, stage, stages);
  I.build_specs();
  I.offload = offload && !I.block_range.empty();
  if (I.offload) {
    I.bstart = I.block_range.front().first;
    I.bend = I.block_range.back().second;
  }
  const auto blocks = I.block_range.size();
  I.loaded.resize(blocks);
  I.state.resize(blocks);
  I.in_use.resize(blocks);
  // Same initial weights as the CPU model, and a check that its layout is still ours.
  cpu::GptStage host(config, stage, stages);
  const std::vector<double>& flat = host.params();
  if (static_cast<std::int64_t>(flat.size()) != I.total)
    throw Error("CUDA GPT stage " + std::to_string(stage) + ": the CPU model has " + std::to_string(flat.size()) +
                " parameters, this one " + std::to_string(I.total) +
                " — exec/src/cpu_gpt.cpp's parameter list changed; update gpt_cuda.cpp");
  cpu::ParamMap named = host.named_params();
  for (const Spec& s : I.specs) {
    auto it = named.find(s.name);
    bool same = it != named.end() && static_cast<std::int64_t>(it->second.size()) == s.size();
    for (std::int64_t i = 0; same && i < s.size(); i += std::max<std::int64_t>(1, s.size() / 7))
      same = it->second[static_cast<std::size_t>(i)] == flat[static_cast<std::size_t>(s.offset + i)];
    if (!same)
      throw Error("CUDA GPT stage " + std::to_string(stage) + ": parameter " + s.name +
                  " is not where the CPU model keeps it — update gpt_cuda.cpp's parameter list");
  }
  std::vector<float> host_f(flat.begin(), flat.end());
  const std::int64_t resident = I.resident();
  const std::size_t bytes = static_cast<std::size_t>(resident) * sizeof(float);
  I.master = DeviceMemory(bytes, stream);
  I.grad = DeviceMemory(static_cast<std::size_t>(I.total) * sizeof(float), stream, true);
  I.m1 = DeviceMemory(bytes, stream, true);
  I.m2 = DeviceMemory(bytes, stream, true);
  I.wbf = DeviceMemory(static_cast<std::size_t>(resident) * I.bytes16(), stream);
  if (I.memory) I.memory->add(resident * (3 * 4 + 2));
  if (I.offload) {
    const auto b = host_f.begin() + I.bstart, e = host_f.begin() + I.bend;
    const auto n = static_cast<std::size_t>(I.bend - I.bstart);
    I.home_master = PinnedFloats(n);
    I.home_m1 = PinnedFloats(n);
    I.home_m2 = PinnedFloats(n);
    std::copy(b, e, I.home_master.begin());
    host_f.erase(b, e);
  }
  // A stage may hold no parameters (more virtual stages than layers): nothing to copy.
  if (bytes > 0)
    TDPIPE_CUDA_CHECK(cudaMemcpyAsync(I.master.get(), host_f.data(), bytes, cudaMemcpyHostToDevice, stream));
  I.cast16(I.master.as<float>(), I.wbf.get(), resident, stream);
  TDPIPE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

GptStageCuda::~GptStageCuda() = default;
GptStageCuda::GptStageCuda(GptStageCuda&&) noexcept = default;
GptStageCuda& GptStageCuda::operator=(GptStageCuda&&) noexcept = default;

bool GptStageCuda::is_first() const { return impl_->first(); }
bool GptStageCuda::is_last() const { return impl_->last(); }
float* GptStageCuda::grads() const { return impl_->grad.as<float>(); }
namespace {
// master_params() and moments() view flat vectors of every parameter: not under offload.
void refuse_offloaded(bool offload, int stage, const char* what) {
  if (offload)
    throw Error(std::string("CUDA GPT stage ") + std::to_string(stage) + ": " + what +
                " of every parameter, but the stage streams its blocks (param_offload: layers) — not built for "
                "the distributed optimizer or 1-bit Adam, which the scenario check refuses");
}
}  // namespace

float* GptStageCuda::master_params() const {
  refuse_offloaded(impl_->offload, impl_->stage, "the device's master weights");
  return impl_->master.as<float>();
}
float* GptStageCuda::moments(int which) const {
  if (which != 1 && which != 2) throw Error("moments(" + std::to_string(which) + "): expected 1 or 2");
  refuse_offloaded(impl_->offload, impl_->stage, "the device's Adam moments");
  return (which == 1 ? impl_->m1 : impl_->m2).as<float>();
}
std::int64_t GptStageCuda::parameter_count() const { return impl_->total; }

void GptStageCuda::begin_step() {
  Impl& I = *impl_;
  if (I.total > 0)
    TDPIPE_CUDA_CHECK(cudaMemsetAsync(I.grad.get(), 0, static_cast<std::size_t>(I.total) * sizeof(float), I.stream));
  I.slices.clear();
  I.kv.clear();
  if (I.fp16 && !I.flags.empty()) TDPIPE_CUDA_CHECK(cudaMemsetAsync(I.flags.get(), 0, I.flags.bytes(), I.stream));
}

void GptStageCuda::set_loss_scales(const std::vector<double>& scales) {
  Impl& I = *impl_;
  if (!I.fp16) throw Error("CUDA GPT stage " + std::to_string(I.stage) + ": loss scales, but it trains in bf16");
  for (double x : scales)
    if (!(x > 0) || !std::isfinite(static_cast<float>(x)))
      throw Error("CUDA GPT stage " + std::to_string(I.stage) + ": an fp16 loss scale of " + std::to_string(x) +
                  "; expected a positive fp32 number");
  if (I.flags.empty() || I.flags.bytes() != scales.size() * sizeof(int)) {
    I.flags = DeviceMemory(scales.size() * sizeof(int), I.stream, true);
  }
  I.scales.assign(scales.begin(), scales.end());
}

std::vector<std::uint8_t> GptStageCuda::overflowed() const {
  const Impl& I = *impl_;
  if (!I.fp16 || I.flags.empty()) return {};
  std::vector<int> host(I.scales.size());
  TDPIPE_CUDA_CHECK(cudaMemcpyAsync(host.data(), I.flags.get(), host.size() * sizeof(int), cudaMemcpyDeviceToHost,
                                    I.stream));
  TDPIPE_CUDA_CHECK(cudaStreamSynchronize(I.stream));
  return {host.begin(), host.end()};
}

void GptStageCuda::inject_overflow(int slice) { impl_->inject = slice; }

void GptStageCuda::forward(int mb, int slice, int t0, int t1, const float* x, float* out, const int* tokens,
                           const int* targets, float loss_scale, double* loss) {
  Impl& I = *impl_;
  if (t1 - t0 <= 0 || t0 < 0 || t1 > I.cfg.seq)
    throw Error("CUDA stage " + std::to_string(I.stage) + ": F" + std::to_string(mb) + ":s" + std::to_string(slice) +
                ": token range [" + std::to_string(t0) + ", " + std::to_string(t1) + ") outside the sequence");
  if (I.last() && (targets == nullptr || loss == nullptr))
    throw Error("CUDA last stage: F" + std::to_string(mb) + " without targets or a loss accumulator");
  if ((!I.first() && x == nullptr) || (!I.last() && out == nullptr))
    throw Error("CUDA stage " + std::to_string(I.stage) + ": F" + std::to_string(mb) + " without its input or output");
  auto [it, inserted] = I.slices.try_emplace({mb, slice});
  if (!inserted)
    throw Error("CUDA stage " + std::to_string(I.stage) + ": F" + std::to_string(mb) + ":s" + std::to_string(slice) +
                " ran twice in one step");
  SliceSaved& st = it->second;
  st.t0 = t0;
  st.t1 = t1;
  if (I.fp16) {
    I.grad_scale(slice);  // (checks the slice)
    st.taint = DeviceMemory(sizeof(int), I.stream, true);
  }
  I.with16([&](auto z) { I.forward(z, mb, slice, x, out, tokens, targets, loss_scale, loss, st); });
}

template <class T16>
void GptStageCuda::Impl::forward(T16, int mb, int slice, const float* x, float* out, const int* tokens,
                                 const int* targets, float loss_scale, double* loss, SliceSaved& st) {
  Impl& I = *this;
  const int t0 = st.t0, t1 = st.t1;
  const int b = I.cfg.micro_batch, T = t1 - t0, H = I.cfg.hidden, N = b * T;
  const std::size_t nH = std::size_t(N) * H;
  DeviceMemory act(nH * sizeof(float), I.stream);
  if (I.first()) {
    if (tokens == nullptr) throw Error("CUDA stage 0: F" + std::to_string(mb) + " without tokens");
    st.tokens = tokens;
    if (issuing()) k::embed_forward(tokens, I.P("embed.tok"), I.P("embed.pos"), act.as<float>(), b, T, I.cfg.seq, t0, H, I.stream);
  } else {
    if (issuing()) TDPIPE_CUDA_CHECK(cudaMemcpyAsync(act.get(), x, nH * sizeof(float), cudaMemcpyDeviceToDevice, I.stream));
    I.read(act.as<float>(), 1, std::int64_t(nH), std::int64_t(nH), st);
  }
  st.blocks.resize(static_cast<std::size_t>(I.last_block - I.first_block));
  for (int l = I.first_block; l < I.last_block; ++l) {
    I.begin_block(l);
    act = I.block_forward<T16>(mb, l, slice, t0, t1, std::move(act),
                               st.blocks[static_cast<std::size_t>(l - I.first_block)], st);
    I.end_block(l);
  }
  if (!I.last()) {
    if (issuing()) TDPIPE_CUDA_CHECK(cudaMemcpyAsync(out, act.get(), nH * sizeof(float), cudaMemcpyDeviceToDevice, I.stream));
    return;
  }
  const int V = I.cfg.vocab;
  HeadSaved& hs = st.head;
  hs.x = std::move(act);
  hs.mean = DeviceMemory(N * sizeof(float), I.stream);
  hs.rstd = DeviceMemory(N * sizeof(float), I.stream);
  hs.hf = DeviceMemory(nH * sizeof(T16), I.stream);
  if (issuing()) k::layernorm_forward(hs.x.as<float>(), I.P("head.ln.g"), I.P("head.ln.b"), hs.hf.as<T16>(), hs.mean.as<float>(),
                                      hs.rstd.as<float>(), N, H, static_cast<float>(I.cfg.ln_eps), I.stream);
  I.stored<T16>(hs.hf, slice, st);
  DeviceMemory logits(std::size_t(N) * V * sizeof(float), I.stream);
  if (issuing()) gemm(I.cublas, false, false, N, V, H, 1.f, in16<T16>(hs.hf.get(), H), in16<T16>(I.W<T16>("head.out"), V), 0.f,
                      out_f32(logits.get(), V));
  if (issuing()) k::bias_add(logits.as<float>(), I.P("head.bias"), N, V, I.stream);
  hs.dlogits = DeviceMemory(std::size_t(N) * V * sizeof(T16), I.stream);
  if (issuing()) k::cross_entropy(logits.as<float>(), targets, hs.dlogits.as<T16>(), loss, b, T, I.cfg.seq, t0, V, loss_scale,
                                  loss_scale * I.grad_scale(slice), I.stream);
  I.stored<T16>(hs.dlogits, slice, st);
}

void GptStageCuda::backward_input(int mb, int slice, const float* dy, float* dx) {
  Impl& I = *impl_;
  auto it = I.slices.find({mb, slice});
  if (it == I.slices.end())
    throw Error("CUDA stage " + std::to_string(I.stage) + ": B" + std::to_string(mb) + ":s" + std::to_string(slice) +
                " before its F");
  SliceSaved& st = it->second;
  if (st.backward_done)
    throw Error("CUDA stage " + std::to_string(I.stage) + ": B" + std::to_string(mb) + ":s" + std::to_string(slice) +
                " ran twice");
  if ((!I.last() && dy == nullptr) || (!I.first() && dx == nullptr))
    throw Error("CUDA stage " + std::to_string(I.stage) + ": B" + std::to_string(mb) + ":s" + std::to_string(slice) +
                " without its gradient input or output");
  st.backward_done = true;
  I.with16([&](auto z) { I.backward_input(z, mb, slice, dy, dx, st); });
}

template <class T16>
void GptStageCuda::Impl::backward_input(T16, int mb, int slice, const float* dy, float* dx, SliceSaved& st) {
  Impl& I = *this;
  const int H = I.cfg.hidden, N = I.cfg.micro_batch * (st.t1 - st.t0);
  const std::size_t nH = std::size_t(N) * H;
  DeviceMemory grad(nH * sizeof(float), I.stream, I.last());
  if (I.last()) {
    HeadSaved& hs = st.head;
    hs.dhf = DeviceMemory(nH * sizeof(float), I.stream);
    if (issuing()) gemm(I.cublas, false, true, N, H, I.cfg.vocab, 1.f, in16<T16>(hs.dlogits.get(), I.cfg.vocab),
                        in16<T16>(I.W<T16>("head.out"), I.cfg.vocab), 0.f, out_f32(hs.dhf.get(), H));
    if (issuing()) k::layernorm_backward_input(hs.dhf.as<float>(), hs.x.as<float>(), hs.mean.as<float>(), hs.rstd.as<float>(),
                                               I.P("head.ln.g"), grad.as<float>(), N, H, I.stream);
  } else {
    if (issuing()) TDPIPE_CUDA_CHECK(cudaMemcpyAsync(grad.get(), dy, nH * sizeof(float), cudaMemcpyDeviceToDevice, I.stream));
    I.read(grad.as<float>(), 1, std::int64_t(nH), std::int64_t(nH), st);
  }
  if (I.inject == slice && nH > 0) {
    // An injected overflow (the fault tests): the slice's backward starts from an inf.
    static const float inf = std::numeric_limits<float>::infinity();
    static const int one = 1;
    I.inject = -1;
    TDPIPE_CUDA_CHECK(cudaMemcpyAsync(grad.get(), &inf, sizeof inf, cudaMemcpyHostToDevice, I.stream));
    if (I.fp16)
      TDPIPE_CUDA_CHECK(cudaMemcpyAsync(I.flags.as<int>() + slice, &one, sizeof one, cudaMemcpyHostToDevice, I.stream));
  }
  for (int l = I.last_block - 1; l >= I.first_block; --l) {
    I.begin_block(l);
    grad = I.block_backward<T16>(mb, l, slice, st.t0, st.t1, grad.as<float>(),
                                 st.blocks[static_cast<std::size_t>(l - I.first_block)], st);
    I.end_block(l);
  }
  if (slice == 0) {
    // Slice 0 is the last backward of this micro-batch: its KV state is spent. The
    // frees are stream-ordered after the kernels that read it.
    for (int l = I.first_block; l < I.last_block; ++l) I.kv.erase({mb, l});
  }
  if (I.first()) {
    st.dx0 = std::move(grad);
    return;
  }
  if (issuing()) TDPIPE_CUDA_CHECK(cudaMemcpyAsync(dx, grad.get(), nH * sizeof(float), cudaMemcpyDeviceToDevice, I.stream));
}

void GptStageCuda::backward_weight(int mb, int slice, const std::function<void(std::int64_t)>& final_tail) {
  Impl& I = *impl_;
  auto it = I.slices.find({mb, slice});
  if (it == I.slices.end() || !it->second.backward_done)
    throw Error("CUDA stage " + std::to_string(I.stage) + ": W" + std::to_string(mb) + ":s" + std::to_string(slice) +
                " before its B");
  I.with16([&](auto z) { I.backward_weight(z, slice, it->second, final_tail); });
  I.slices.erase(it);
}

template <class T16>
void GptStageCuda::Impl::backward_weight(T16, int slice, SliceSaved& st,
                                         const std::function<void(std::int64_t)>& final_tail) {
  Impl& I = *this;
  const int T = st.t1 - st.t0, H = I.cfg.hidden, N = I.cfg.micro_batch * T, V = I.cfg.vocab;
  const float u = 1.f / I.grad_scale(slice);  // fp16: the parts are added unscaled
  if (I.last()) {
    HeadSaved& hs = st.head;
    if (issuing()) gemm(I.cublas, true, false, H, V, N, u, in16<T16>(hs.hf.get(), H), in16<T16>(hs.dlogits.get(), V), 1.f,
                        out_f32(I.G("head.out"), V));
    if (issuing()) k::column_sum(hs.dlogits.as<T16>(), I.G("head.bias"), N, V, u, I.stream);
    if (issuing()) k::layernorm_backward_weight(hs.dhf.as<float>(), hs.x.as<float>(), hs.mean.as<float>(), hs.rstd.as<float>(),
                                                I.G("head.ln.g"), I.G("head.ln.b"), N, H, u, I.stream);
    if (final_tail) final_tail(I.total - I.spec("head.ln.g").offset);
  }
  for (int l = I.last_block - 1; l >= I.first_block; --l) {
    I.block_weight<T16>(l, slice, T, st.blocks[static_cast<std::size_t>(l - I.first_block)]);
    if (final_tail && (l > I.first_block || I.first())) final_tail(I.total - I.spec(I.bname(l, "ln1.g")).offset);
  }
  if (I.first()) {
    if (u != 1.f && issuing()) k::scale(st.dx0.as<float>(), u, std::int64_t(N) * H, I.stream);
    if (issuing()) k::embed_backward(st.tokens, st.dx0.as<float>(), I.G("embed.tok"), I.G("embed.pos"), I.cfg.micro_batch, T,
                                     I.cfg.seq, st.t0, H, I.stream);
  }
  if (final_tail) final_tail(I.total);
}

void GptStageCuda::adam(const cpu::AdamConfig& a, int t) { adam(a, t, 0, impl_->total); }

void GptStageCuda::adam(const cpu::AdamConfig& a, int t, std::int64_t first, std::int64_t last) {
  Impl& I = *impl_;
  if (first < 0 || last < first || last > I.total)
    throw Error("Adam over parameters [" + std::to_string(first) + ", " + std::to_string(last) + ") of " +
                std::to_string(I.total));
  if (last == first) return;
  if (I.offload && first < I.bend && last > I.bstart)
    throw Error("CUDA GPT stage " + std::to_string(I.stage) + ": Adam over parameters [" + std::to_string(first) +
                ", " + std::to_string(last) + ") reaches the offloaded blocks; they step block by block (adam_block)");
  const double c1 = 1.0 - std::pow(a.beta1, t), c2 = 1.0 - std::pow(a.beta2, t);
  // Elementwise: a part of the flat vectors is stepped exactly as in the full step.
  const std::int64_t r = I.resident_index(first);
  I.with16([&](auto z) {
    k::adam(I.master.as<float>() + r, I.grad.as<float>() + first, I.m1.as<float>() + r, I.m2.as<float>() + r,
            I.wbf.as<decltype(z)>() + r, last - first, static_cast<float>(a.lr), static_cast<float>(a.beta1),
            static_cast<float>(a.beta2), static_cast<float>(a.eps), static_cast<float>(c1), static_cast<float>(c2),
            I.stream);
  });
}

int GptStageCuda::blocks() const { return static_cast<int>(impl_->block_range.size()); }

void GptStageCuda::set_block_hooks(std::function<void(int)> begin, std::function<void(int)> end) {
  impl_->block_begin = std::move(begin);
  impl_->block_end = std::move(end);
}

void GptStageCuda::load_block(int block, bool state, cudaStream_t copy) {
  Impl& I = *impl_;
  I.check_block(block, state ? "LOAD of the optimizer state" : "LOAD");
  const auto [first, last] = I.block_range[static_cast<std::size_t>(block)];
  const std::int64_t n = last - first, at = first - I.bstart;
  const std::size_t fbytes = static_cast<std::size_t>(n) * sizeof(float);
  BlockCopy c;
  auto upload = [&](DeviceMemory& into, const PinnedFloats& home) {
    into = DeviceMemory(fbytes, copy);
    TDPIPE_CUDA_CHECK(cudaMemcpyAsync(into.get(), home.data() + at, fbytes, cudaMemcpyHostToDevice, copy));
  };
  upload(c.master, I.home_master);
  if (state) {
    upload(c.m1, I.home_m1);
    upload(c.m2, I.home_m2);
    c.bytes = 3 * static_cast<std::int64_t>(fbytes);
    TDPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&c.stepped.e, cudaEventDisableTiming));
  } else {
    c.wbf = DeviceMemory(static_cast<std::size_t>(n) * I.bytes16(), copy);
    I.cast16(c.master.as<float>(), c.wbf.get(), n, copy);
    c.bytes = static_cast<std::int64_t>(fbytes) + n * std::int64_t(I.bytes16());
  }
  TDPIPE_CUDA_CHECK(cudaStreamSynchronize(copy));  // the LOAD ends when its block is there
  const std::int64_t bytes = c.bytes;
  std::lock_guard lock(I.copies_mu);
  if (state) {
    auto& slot = I.state[static_cast<std::size_t>(block)];
    if (slot)
      throw Error("CUDA GPT stage " + std::to_string(I.stage) + ": LOAD of block " + std::to_string(block) +
                  "'s optimizer state: it is on the device already");
    slot = std::move(c);
  } else {
    I.loaded[static_cast<std::size_t>(block)].push_back(std::move(c));
  }
  if (I.memory) I.memory->add(bytes);
}

void GptStageCuda::take_block(int block) {
  Impl& I = *impl_;
  I.check_block(block, "use");
  std::lock_guard lock(I.copies_mu);
  auto& queue = I.loaded[static_cast<std::size_t>(block)];
  if (I.in_use[static_cast<std::size_t>(block)])
    throw Error("CUDA GPT stage " + std::to_string(I.stage) + ": block " + std::to_string(block) +
                " taken again before its release");
  if (queue.empty())
    throw Error("CUDA GPT stage " + std::to_string(I.stage) + ": block " + std::to_string(block) +
                " used but no LOAD brought its weights");
  I.in_use[static_cast<std::size_t>(block)] = std::move(queue.front());
  queue.pop_front();
}

void GptStageCuda::release_block(int block) {
  Impl& I = *impl_;
  I.check_block(block, "release");
  auto& held = I.in_use[static_cast<std::size_t>(block)];
  if (!held) throw Error("CUDA GPT stage " + std::to_string(I.stage) + ": release of block " +
                         std::to_string(block) + ", which no op holds");
  // Freed in order behind the kernels just issued that read it.
  held->master.reset_on(I.stream);
  held->wbf.reset_on(I.stream);
  if (I.memory) I.memory->add(-held->bytes);
  held.reset();
}

void GptStageCuda::release_held() {
  Impl& I = *impl_;
  for (int b = 0; b < static_cast<int>(I.in_use.size()); ++b)
    if (I.in_use[static_cast<std::size_t>(b)]) release_block(b);
}

void GptStageCuda::adam_block(const cpu::AdamConfig& a, int t, int block, bool skip) {
  Impl& I = *impl_;
  I.check_block(block, "Adam");
  BlockCopy* c = nullptr;
  {
    std::lock_guard lock(I.copies_mu);
    auto& slot = I.state[static_cast<std::size_t>(block)];
    if (!slot)
      throw Error("CUDA GPT stage " + std::to_string(I.stage) + ": Adam of block " + std::to_string(block) +
                  ": its optimizer state is not on the device");
    c = &*slot;  // only its OFFLOAD, after this step, takes it
  }
  const auto [first, last] = I.block_range[static_cast<std::size_t>(block)];
  const double c1 = 1.0 - std::pow(a.beta1, t), c2 = 1.0 - std::pow(a.beta2, t);
  if (!skip)  // (no 16-bit copy: the block's next LOAD casts one)
    k::adam(c->master.as<float>(), I.grad.as<float>() + first, c->m1.as<float>(), c->m2.as<float>(),
            static_cast<bf16*>(nullptr), last - first, static_cast<float>(a.lr), static_cast<float>(a.beta1),
            static_cast<float>(a.beta2), static_cast<float>(a.eps), static_cast<float>(c1), static_cast<float>(c2),
            I.stream);
  TDPIPE_CUDA_CHECK(cudaEventRecord(c->stepped.e, I.stream));
}

void GptStageCuda::adam_resident(const cpu::AdamConfig& a, int t) {
  Impl& I = *impl_;
  if (!I.offload) return adam(a, t);
  adam(a, t, 0, I.bstart);
  adam(a, t, I.bend, I.total);
}

void GptStageCuda::offload_block(int block, cudaStream_t copy) {
  Impl& I = *impl_;
  I.check_block(block, "OFFLOAD");
  std::optional<BlockCopy> c;
  {
    std::lock_guard lock(I.copies_mu);
    c = std::move(I.state[static_cast<std::size_t>(block)]);
    I.state[static_cast<std::size_t>(block)].reset();
  }
  if (!c)
    throw Error("CUDA GPT stage " + std::to_string(I.stage) + ": OFFLOAD of block " + std::to_string(block) +
                ": its optimizer state is not on the device");
  if (I.memory) I.memory->add(-c->bytes);  // (freed below, or by `c` on an error)
  const auto [first, last] = I.block_range[static_cast<std::size_t>(block)];
  const std::int64_t at = first - I.bstart;
  const std::size_t fbytes = static_cast<std::size_t>(last - first) * sizeof(float);
  // After the block's Adam on the compute stream; the copy thread alone reads and
  // writes the block's host range (its LOADs and this OFFLOAD, in plan order).
  TDPIPE_CUDA_CHECK(cudaStreamWaitEvent(copy, c->stepped.e, 0));
  TDPIPE_CUDA_CHECK(cudaMemcpyAsync(I.home_master.data() + at, c->master.get(), fbytes, cudaMemcpyDeviceToHost, copy));
  TDPIPE_CUDA_CHECK(cudaMemcpyAsync(I.home_m1.data() + at, c->m1.get(), fbytes, cudaMemcpyDeviceToHost, copy));
  TDPIPE_CUDA_CHECK(cudaMemcpyAsync(I.home_m2.data() + at, c->m2.get(), fbytes, cudaMemcpyDeviceToHost, copy));
  TDPIPE_CUDA_CHECK(cudaStreamSynchronize(copy));
}

void GptStageCuda::adam_frozen_variance(const cpu::AdamConfig& a, int t, int frozen_at) {
  Impl& I = *impl_;
  if (frozen_at < 1 || t <= frozen_at)
    throw Error("1-bit Adam step " + std::to_string(t) + " with the variance frozen after step " +
                std::to_string(frozen_at));
  if (I.total == 0) return;
  if (I.offload) throw Error("1-bit Adam with parameter offload is not built (the scenario check refuses it)");
  const double c1 = 1.0 - std::pow(a.beta1, t), c2 = 1.0 - std::pow(a.beta2, frozen_at);
  I.with16([&](auto z) {
    k::adam_frozen_variance(I.master.as<float>(), I.m1.as<float>(), I.m2.as<float>(), I.wbf.as<decltype(z)>(),
                            I.total, static_cast<float>(a.lr), static_cast<float>(a.eps), static_cast<float>(c1),
                            static_cast<float>(c2), I.stream);
  });
}

void GptStageCuda::refresh_bf16_weights() {
  Impl& I = *impl_;
  I.cast16(I.master.as<float>(), I.wbf.get(), I.resident(), I.stream);
}

namespace {
cpu::ParamMap by_name(const std::vector<Spec>& specs, const std::vector<float>& flat) {
  cpu::ParamMap out;
  for (const Spec& s : specs) out[s.name].assign(flat.begin() + s.offset, flat.begin() + s.offset + s.size());
  return out;
}
}  // namespace

std::vector<double> GptStageCuda::download_flat(int which) const {
  if (which < 0 || which > 2) throw Error("download_flat(" + std::to_string(which) + "): expected 0, 1 or 2");
  const std::vector<float> f = impl_->flat(which);
  return {f.begin(), f.end()};
}

void GptStageCuda::upload_flat(int which, const std::vector<double>& values) {
  Impl& I = *impl_;
  if (which < 0 || which > 2) throw Error("upload_flat(" + std::to_string(which) + "): expected 0, 1 or 2");
  if (static_cast<std::int64_t>(values.size()) != I.total)
    throw Error("CUDA GPT stage " + std::to_string(I.stage) + ": " + std::to_string(values.size()) +
                " values for its " + std::to_string(I.total) + " parameters");
  I.set_flat(which, std::vector<float>(values.begin(), values.end()));
}

cpu::ParamMap GptStageCuda::named_params() const { return by_name(impl_->specs, impl_->flat(0)); }
cpu::ParamMap GptStageCuda::named_grads() const { return by_name(impl_->specs, impl_->fetch(impl_->grad, impl_->total)); }
cpu::ParamMap GptStageCuda::named_moments(int which) const {
  if (which != 1 && which != 2) throw Error("named_moments(" + std::to_string(which) + "): expected 1 or 2");
  return by_name(impl_->specs, impl_->flat(which));
}

void GptStageCuda::load_state(const cpu::ParamMap& params, const cpu::ParamMap& m1, const cpu::ParamMap& m2) {
  Impl& I = *impl_;
  std::vector<float> host(static_cast<std::size_t>(I.total));
  for (auto [map, which, what] : {std::tuple<const cpu::ParamMap*, int, const char*>{&params, 0, "parameters"},
                                  {&m1, 1, "first moments"},
                                  {&m2, 2, "second moments"}}) {
    for (const Spec& sp : I.specs) {
      const auto it = map->find(sp.name);
      if (it == map->end())
        throw Error("CUDA GPT stage " + std::to_string(I.stage) + ": the " + what + " to load have no " + sp.name);
      if (static_cast<std::int64_t>(it->second.size()) != sp.size())
        throw Error("CUDA GPT stage " + std::to_string(I.stage) + ": the " + what + " to load have " +
                    std::to_string(it->second.size()) + " values of " + sp.name + "; expected " +
                    std::to_string(sp.size()));
      std::copy(it->second.begin(), it->second.end(), host.begin() + sp.offset);
    }
    I.set_flat(which, host);  // the bf16 weights follow the master
  }
  TDPIPE_CUDA_CHECK(cudaStreamSynchronize(I.stream));
}

}  // namespace tdpipe::exec::cuda
