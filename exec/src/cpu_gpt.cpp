// cpu_gpt.cpp — forward, split backward (B / W) and Adam of one GPT virtual stage.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <list>
#include <mutex>
#include <random>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "tdpipe/exec/cpu/gpt.hpp"
#include "tdpipe/exec/loss_scale.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/plan.hpp"

namespace tdpipe::exec::cpu {
namespace {

using Vec = Eigen::RowVectorXd;
using MapMat = Eigen::Map<Mat>;
using MapVec = Eigen::Map<Vec>;

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

enum class Init { Normal, Ones, Zeros };

struct ParamSpec {
  std::string name;
  int rows = 0, cols = 0;
  Init init = Init::Normal;
  std::size_t offset = 0;
  int block = -1;  ///< local decoder block it belongs to; −1: embedding or head
};

// One Adam update of one element (the same arithmetic wherever the element lives).
inline void adam_element(const AdamConfig& a, double c1, double c2, double g, double& p, double& m1, double& m2) {
  m1 = a.beta1 * m1 + (1.0 - a.beta1) * g;
  m2 = a.beta2 * m2 + (1.0 - a.beta2) * g * g;
  p -= a.lr * (m1 / c1) / (std::sqrt(m2 / c2) + a.eps);
}

// One device copy of a decoder block under parameter offload: its weights while a compute
// op uses them; with its Adam moments (`state`) while OPT steps it. A block may have two
// copies at once — each LOAD takes one of the plan's slots, and the next op's first
// block can be the one the last op still uses — with the same weights (they change only
// in OPT, after every use).
struct DeviceCopy {
  std::vector<double> w, m1, m2;
  bool state() const { return !m1.empty(); }
  std::int64_t bytes() const { return static_cast<std::int64_t>((w.size() + m1.size() + m2.size()) * sizeof(double)); }
};
using DeviceBlock = std::list<DeviceCopy>;  // a list: a copy stays put while others come and go

// The block's copy holding (or not holding) optimizer state, or end().
DeviceBlock::iterator find_copy(DeviceBlock& d, bool state) {
  return std::find_if(d.begin(), d.end(), [state](const DeviceCopy& c) { return c.state() == state; });
}

// LayerNorm over rows: y = xhat ⊙ g + b. Keeps xhat and 1/σ for backward.
void ln_forward(const Mat& x, const MapVec& g, const MapVec& b, double eps, Mat& xhat,
                Eigen::VectorXd& rstd, Mat& y) {
  const Eigen::Index n = x.cols();
  xhat.resize(x.rows(), n);
  rstd.resize(x.rows());
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    const double mean = x.row(r).mean();
    const double var = (x.row(r).array() - mean).square().sum() / static_cast<double>(n);
    rstd(r) = 1.0 / std::sqrt(var + eps);
    xhat.row(r) = (x.row(r).array() - mean) * rstd(r);
  }
  y = (xhat.array().rowwise() * g.array()).rowwise() + b.array();
}

// dL/dx of LayerNorm given dL/dy.
Mat ln_backward(const Mat& dy, const Mat& xhat, const Eigen::VectorXd& rstd, const MapVec& g) {
  const double n = static_cast<double>(dy.cols());
  Mat dxhat = dy.array().rowwise() * g.array();
  Mat dx(dy.rows(), dy.cols());
  for (Eigen::Index r = 0; r < dy.rows(); ++r) {
    const double m1 = dxhat.row(r).sum() / n;
    const double m2 = dxhat.row(r).dot(xhat.row(r)) / n;
    dx.row(r) = rstd(r) * (dxhat.row(r).array() - m1 - xhat.row(r).array() * m2);
  }
  return dx;
}

constexpr double kGeluC = 0.7978845608028654;  // sqrt(2/pi)

double gelu(double u) { return 0.5 * u * (1.0 + std::tanh(kGeluC * (u + 0.044715 * u * u * u))); }
double gelu_grad(double u) {
  const double inner = kGeluC * (u + 0.044715 * u * u * u);
  const double t = std::tanh(inner);
  return 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * kGeluC * (1.0 + 3.0 * 0.044715 * u * u);
}

// Row r of `s` (the scores of the query at position first + r against keys 0 … cols − 1)
// becomes its softmax over the keys up to that position; later keys are masked to 0.
void causal_softmax(Mat& s, int first) {
  for (Eigen::Index r = 0; r < s.rows(); ++r) {
    const Eigen::Index pos = first + r;
    const double mx = s.row(r).head(pos + 1).maxCoeff();
    double sum = 0;
    for (Eigen::Index c = 0; c < s.cols(); ++c) {
      const double e = c <= pos ? std::exp(s(r, c) - mx) : 0.0;
      s(r, c) = e;
      sum += e;
    }
    s.row(r) /= sum;
  }
}

// Forward state of one block for one (mb, slice), and what B hands to W.
struct BlockState {
  Mat xhat1, h, q, a, xhat2, h2, u, g;
  Eigen::VectorXd rstd1, rstd2;
  std::vector<Mat> probs;  // per (sequence, head): T × t1
  // Filled by B for W.
  Mat dh, dq, dk, dv, dy_attn, dh2, du, dz;
  bool tainted = false;  // fp16: the slice's taint once B passed this block (W charges by it)
};

struct HeadState {
  Mat xhatf, hf, probs;
  Eigen::VectorXd rstdf;
  Mat dlogits, dhf;
  bool tainted = false;  // fp16: the slice's taint at the head's B
};

struct SliceState {
  int t0 = 0, t1 = 0;
  std::vector<BlockState> blocks;
  HeadState head;
  std::vector<std::vector<int>> tokens;  // stage 0: ids of this slice, per sequence
  Mat dx0;                               // stage 0: gradient at the embedding output
  bool backward_done = false;
  // fp16: this (mb, slice) read an inf/NaN another slice or stage stored (and was flagged
  // for): its own stores then overflow by contagion, which is not charged to its scale.
  bool tainted = false;
};

// Per-(mb, block) keys/values of the whole sequence (filled slice by slice) and the
// gradients later slices pushed back to earlier rows.
struct KvState {
  Mat k, v, dk, dv;
};

}  // namespace

struct GptStage::Impl {
  GptConfig cfg;
  int stage = 0, stages = 1;
  int first_block = 0, last_block = 0;
  std::vector<ParamSpec> specs;
  std::map<std::string, std::size_t> index;
  std::vector<double> params, grads, m1, m2;
  std::map<std::pair<int, int>, SliceState> slices;          // (mb, slice)
  std::map<std::pair<int, int>, KvState> kv;                 // (mb, block)
  std::int64_t block_ns = 0;  // time in decoder blocks since take_block_ns()
  // Parameter offload (attach_memory): device copies of the decoder blocks.
  DeviceMemory* memory = nullptr;
  bool offload = false;
  std::vector<DeviceBlock> device;  // [local block]; the lists guarded by device_mutex
  std::mutex device_mutex;          // the copy stream adds and removes copies beside compute
  std::vector<std::pair<std::size_t, std::size_t>> block_range;  // [local block] its params [first, last)
  std::function<void(int)> block_begin, block_end;
  int adding_block = -1;  // build(): the block add() files tensors under
  // fp16 (set_fp16): per-slice loss scales (empty: fp64), this step's overflow per slice,
  // and the slice whose next backward is injected with an inf (−1: none).
  std::vector<double> fp16_scales;
  std::vector<std::uint8_t> overflow;
  int inject = -1;
  bool tainted = false;  // the running op's SliceState::tainted

  bool fp16() const { return !fp16_scales.empty(); }
  double grad_scale(int slice) const {
    if (!fp16()) return 1.0;
    if (slice < 0 || slice >= static_cast<int>(fp16_scales.size()))
      throw Error(fmt::format("stage {}: slice {} has no loss scale (set_fp16 gave {})", stage, slice,
                              fp16_scales.size()));
    return fp16_scales[static_cast<std::size_t>(slice)];
  }
  // A store of slice `slice`'s activation or gradient: through fp16 when training in it.
  // An overflow is charged to the slice whose store first produced it (not to one that
  // only carries another's inf onwards: `tainted`).
  void store(Mat& m, int slice) {
    if (!fp16()) return;
    grad_scale(slice);  // (checks the slice)
    if (store_fp16(m.data(), m.size()) && !tainted) overflow[static_cast<std::size_t>(slice)] = 1;
  }
  // fp16: the running op read `m` from another slice or stage; an inf or NaN in it was
  // flagged where it was stored.
  template <class M>
  void taint_if_bad(const Eigen::MatrixBase<M>& m) {
    if (fp16() && !m.allFinite()) tainted = true;
  }
  // Adds a slice's part of a weight gradient (scaled by its loss scale, for fp16 first
  // stored in it) to the master gradient, unscaled; fp64: the plain sum, as before.
  template <class Target, class Part>
  void accumulate(Target&& g, const Part& part, int slice) {
    if (!fp16()) {
      g.noalias() += part;
      return;
    }
    Mat c = part;
    store(c, slice);
    g += c / grad_scale(slice);
  }

  /// Runs `f` (a loop over this stage's blocks) and adds its time to block_ns.
  template <class F>
  void timed_blocks(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    block_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  }

  bool first() const { return stage == 0; }
  bool last() const { return stage == stages - 1; }
  int nblocks() const { return last_block - first_block; }

  void add(const std::string& name, int rows, int cols, Init init) {
    ParamSpec s{name, rows, cols, init, 0, adding_block};
    index[name] = specs.size();
    specs.push_back(s);
  }
  std::string bname(int l, const char* p) const { return fmt::format("block{}.{}", l, p); }

  // Where a tensor's weights are: the host vector, or under offload a block's device copy.
  double* weights(const ParamSpec& s) {
    if (!offload || s.block < 0) return params.data() + s.offset;
    std::lock_guard lock(device_mutex);
    DeviceBlock& d = device[static_cast<std::size_t>(s.block)];
    if (d.empty())
      throw Error(fmt::format("stage {}: {} used while block {} is in host memory (no LOAD brought it to the device)",
                              stage, s.name, first_block + s.block));
    return d.front().w.data() + (s.offset - block_range[static_cast<std::size_t>(s.block)].first);
  }
  MapMat P(const std::string& name) {
    const ParamSpec& s = specs[index.at(name)];
    return MapMat(weights(s), s.rows, s.cols);
  }
  MapMat G(const std::string& name) {
    const ParamSpec& s = specs[index.at(name)];
    return MapMat(grads.data() + s.offset, s.rows, s.cols);
  }
  MapVec Pv(const std::string& name) {
    const ParamSpec& s = specs[index.at(name)];
    return MapVec(weights(s), s.rows * s.cols);
  }
  DeviceBlock& device_block(int b, const char* what) {
    if (!offload || b < 0 || b >= nblocks())
      throw Error(fmt::format("stage {}: {} of block {}: {}", stage, what, b,
                              offload ? fmt::format("the stage has blocks 0..{}", nblocks() - 1)
                                      : std::string("the stage keeps its weights on the device (no offload)")));
    return device[static_cast<std::size_t>(b)];
  }
  // Takes block b's copy with (state) or without optimizer state off the device: the copy,
  // its bytes no longer counted; `what` and `missing` word the error when there is none.
  DeviceCopy take_copy(int b, bool state, const char* what, const char* missing) {
    DeviceBlock& d = device_block(b, what);
    std::lock_guard lock(device_mutex);
    const auto it = find_copy(d, state);
    if (it == d.end())
      throw Error(fmt::format("stage {}: {} of block {}: {} is not on the device", stage, what, first_block + b,
                              missing));
    DeviceCopy c = std::move(*it);
    d.erase(it);
    memory->add(-c.bytes());
    return c;
  }
  MapVec Gv(const std::string& name) {
    const ParamSpec& s = specs[index.at(name)];
    return MapVec(grads.data() + s.offset, s.rows * s.cols);
  }

  void build() {
    const int H = cfg.hidden, F = cfg.ffn;
    if (first()) {
      add("embed.tok", cfg.vocab, H, Init::Normal);
      add("embed.pos", cfg.seq, H, Init::Normal);
    }
    for (int l = first_block; l < last_block; ++l) {
      adding_block = l - first_block;
      add(bname(l, "ln1.g"), 1, H, Init::Ones);
      add(bname(l, "ln1.b"), 1, H, Init::Zeros);
      // No bias on q/k/v: a key bias has an exactly-zero gradient (softmax is shift
      // invariant) that round-off would turn into Adam noise of size lr.
      add(bname(l, "wq"), H, H, Init::Normal);
      add(bname(l, "wk"), H, H, Init::Normal);
      add(bname(l, "wv"), H, H, Init::Normal);
      add(bname(l, "wo"), H, H, Init::Normal);
      add(bname(l, "bo"), 1, H, Init::Zeros);
      add(bname(l, "ln2.g"), 1, H, Init::Ones);
      add(bname(l, "ln2.b"), 1, H, Init::Zeros);
      add(bname(l, "w1"), H, F, Init::Normal);
      add(bname(l, "b1"), 1, F, Init::Zeros);
      add(bname(l, "w2"), F, H, Init::Normal);
      add(bname(l, "b2"), 1, H, Init::Zeros);
    }
    adding_block = -1;
    if (last()) {
      add("head.ln.g", 1, H, Init::Ones);
      add("head.ln.b", 1, H, Init::Zeros);
      add("head.out", H, cfg.vocab, Init::Normal);
      add("head.bias", 1, cfg.vocab, Init::Zeros);
    }
    std::size_t total = 0;
    block_range.assign(static_cast<std::size_t>(nblocks()), {0, 0});
    for (auto& s : specs) {
      s.offset = total;
      total += static_cast<std::size_t>(s.rows) * s.cols;
      if (s.block < 0) continue;
      auto& [first, last] = block_range[static_cast<std::size_t>(s.block)];
      if (first == last) first = s.offset;  // a block's tensors are contiguous
      last = total;
    }
    params.assign(total, 0.0);
    grads.assign(total, 0.0);
    m1.assign(total, 0.0);
    m2.assign(total, 0.0);
    // Each tensor is seeded by its name, so any partition of the model starts from
    // the same weights as the single-device reference.
    for (const auto& s : specs) {
      double* p = params.data() + s.offset;
      const std::size_t n = static_cast<std::size_t>(s.rows) * s.cols;
      if (s.init == Init::Ones) std::fill(p, p + n, 1.0);
      if (s.init != Init::Normal) continue;
      std::mt19937_64 rng(cfg.seed ^ fnv1a(s.name));
      std::normal_distribution<double> dist(0.0, 0.02);
      for (std::size_t i = 0; i < n; ++i) p[i] = dist(rng);
    }
  }

  KvState& kv_of(int mb, int l) {
    auto [it, inserted] = kv.try_emplace({mb, l});
    if (inserted) {
      const int rows = cfg.micro_batch * cfg.seq;
      it->second.k = Mat::Zero(rows, cfg.hidden);
      it->second.v = Mat::Zero(rows, cfg.hidden);
      it->second.dk = Mat::Zero(rows, cfg.hidden);
      it->second.dv = Mat::Zero(rows, cfg.hidden);
    }
    return it->second;
  }

  Mat block_forward(int mb, int l, int slice, int t0, int t1, const Mat& x, BlockState& st) {
    const int b = cfg.micro_batch, T = t1 - t0, H = cfg.hidden;
    const int nh = cfg.heads, dh = H / nh;
    const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
    Mat h;
    ln_forward(x, Pv(bname(l, "ln1.g")), Pv(bname(l, "ln1.b")), cfg.ln_eps, st.xhat1, st.rstd1, h);
    st.h = h;
    st.q = h * P(bname(l, "wq"));
    Mat k = h * P(bname(l, "wk"));
    Mat v = h * P(bname(l, "wv"));
    store(k, slice);
    store(v, slice);
    KvState& cache = kv_of(mb, l);
    for (int i = 0; i < b && t0 > 0; ++i) {  // earlier slices' keys and values
      taint_if_bad(cache.k.middleRows(i * cfg.seq, t0));
      taint_if_bad(cache.v.middleRows(i * cfg.seq, t0));
    }
    for (int i = 0; i < b; ++i) {
      cache.k.middleRows(i * cfg.seq + t0, T) = k.middleRows(i * T, T);
      cache.v.middleRows(i * cfg.seq + t0, T) = v.middleRows(i * T, T);
    }
    st.a.resize(b * T, H);
    st.probs.assign(static_cast<std::size_t>(b * nh), Mat());
    for (int i = 0; i < b; ++i) {
      for (int hd = 0; hd < nh; ++hd) {
        const Mat qh = st.q.block(i * T, hd * dh, T, dh);
        const Mat kh = cache.k.block(i * cfg.seq, hd * dh, t1, dh);
        const Mat vh = cache.v.block(i * cfg.seq, hd * dh, t1, dh);
        Mat s = (qh * kh.transpose()) * scale;
        causal_softmax(s, t0);
        st.a.block(i * T, hd * dh, T, dh) = s * vh;
        st.probs[static_cast<std::size_t>(i * nh + hd)] = std::move(s);
      }
    }
    Mat x2 = x + Mat((st.a * P(bname(l, "wo"))).rowwise() + Pv(bname(l, "bo")));
    Mat h2;
    ln_forward(x2, Pv(bname(l, "ln2.g")), Pv(bname(l, "ln2.b")), cfg.ln_eps, st.xhat2, st.rstd2, h2);
    st.h2 = h2;
    st.u = (h2 * P(bname(l, "w1"))).rowwise() + Pv(bname(l, "b1"));
    st.g = st.u.unaryExpr([](double z) { return gelu(z); });
    return x2 + Mat((st.g * P(bname(l, "w2"))).rowwise() + Pv(bname(l, "b2")));
  }

  // Serving: block l over the stacked rows of `items` (item i's from first_row[i]); the
  // same arithmetic as block_forward, each item attending to its cache plus its own rows.
  Mat block_infer(int l, const std::vector<InferItem>& items, const std::vector<Eigen::Index>& first_row,
                  const Mat& x) {
    const int H = cfg.hidden, nh = cfg.heads, dh = H / nh;
    const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
    const auto local = static_cast<std::size_t>(l - first_block);
    Mat xhat, h;
    Eigen::VectorXd rstd;
    ln_forward(x, Pv(bname(l, "ln1.g")), Pv(bname(l, "ln1.b")), cfg.ln_eps, xhat, rstd, h);
    const Mat q = h * P(bname(l, "wq"));
    const Mat k = h * P(bname(l, "wk"));
    const Mat v = h * P(bname(l, "wv"));
    Mat a(x.rows(), H);
    for (std::size_t i = 0; i < items.size(); ++i) {
      const InferItem& item = items[i];
      const Eigen::Index r0 = first_row[i];
      const int T = item.tokens, n = item.position + T;
      Mat& ck = item.cache->k[local];
      Mat& cv = item.cache->v[local];
      ck.conservativeResize(n, H);
      cv.conservativeResize(n, H);
      ck.bottomRows(T) = k.middleRows(r0, T);
      cv.bottomRows(T) = v.middleRows(r0, T);
      for (int hd = 0; hd < nh; ++hd) {
        const Mat qh = q.block(r0, hd * dh, T, dh);
        Mat s = (qh * ck.block(0, hd * dh, n, dh).transpose()) * scale;
        causal_softmax(s, item.position);
        a.block(r0, hd * dh, T, dh) = s * cv.block(0, hd * dh, n, dh);
      }
    }
    Mat x2 = x + Mat((a * P(bname(l, "wo"))).rowwise() + Pv(bname(l, "bo")));
    Mat xhat2, h2;
    Eigen::VectorXd rstd2;
    ln_forward(x2, Pv(bname(l, "ln2.g")), Pv(bname(l, "ln2.b")), cfg.ln_eps, xhat2, rstd2, h2);
    const Mat u = (h2 * P(bname(l, "w1"))).rowwise() + Pv(bname(l, "b1"));
    const Mat g = u.unaryExpr([](double z) { return gelu(z); });
    return x2 + Mat((g * P(bname(l, "w2"))).rowwise() + Pv(bname(l, "b2")));
  }

  Mat block_backward(int mb, int l, int slice, int t0, int t1, const Mat& dout, BlockState& st) {
    const int b = cfg.micro_batch, T = t1 - t0, H = cfg.hidden;
    const int nh = cfg.heads, dh = H / nh;
    const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
    st.dz = dout;
    Mat dg = dout * P(bname(l, "w2")).transpose();
    st.du = dg.array() * st.u.unaryExpr([](double z) { return gelu_grad(z); }).array();
    st.dh2 = st.du * P(bname(l, "w1")).transpose();
    Mat dx2 = dout + ln_backward(st.dh2, st.xhat2, st.rstd2, Pv(bname(l, "ln2.g")));
    st.dy_attn = dx2;
    Mat da = dx2 * P(bname(l, "wo")).transpose();
    KvState& cache = kv_of(mb, l);
    st.dq.resize(b * T, H);
    for (int i = 0; i < b; ++i) {
      for (int hd = 0; hd < nh; ++hd) {
        const Mat& p = st.probs[static_cast<std::size_t>(i * nh + hd)];
        const Mat kh = cache.k.block(i * cfg.seq, hd * dh, t1, dh);
        const Mat vh = cache.v.block(i * cfg.seq, hd * dh, t1, dh);
        const Mat qh = st.q.block(i * T, hd * dh, T, dh);
        const Mat dO = da.block(i * T, hd * dh, T, dh);
        const Mat dp = dO * vh.transpose();
        Mat ds = p.array() * (dp.colwise() - (dp.array() * p.array()).rowwise().sum().matrix()).array();
        ds *= scale;
        st.dq.block(i * T, hd * dh, T, dh) = ds * kh;
        // Keys/values of rows < t0 belong to earlier slices: their B reads the sums later.
        // fp16: each part is stored at this slice's scale and summed unscaled.
        if (!fp16()) {
          cache.dk.block(i * cfg.seq, hd * dh, t1, dh) += ds.transpose() * qh;
          cache.dv.block(i * cfg.seq, hd * dh, t1, dh) += p.transpose() * dO;
          continue;
        }
        Mat dk_part = ds.transpose() * qh, dv_part = p.transpose() * dO;
        store(dk_part, slice);
        store(dv_part, slice);
        cache.dk.block(i * cfg.seq, hd * dh, t1, dh) += dk_part / grad_scale(slice);
        cache.dv.block(i * cfg.seq, hd * dh, t1, dh) += dv_part / grad_scale(slice);
      }
    }
    st.dk.resize(b * T, H);
    st.dv.resize(b * T, H);
    for (int i = 0; i < b; ++i) {
      st.dk.middleRows(i * T, T) = cache.dk.middleRows(i * cfg.seq + t0, T);
      st.dv.middleRows(i * T, T) = cache.dv.middleRows(i * cfg.seq + t0, T);
    }
    if (fp16()) {
      taint_if_bad(st.dk);  // later slices' parts (this slice's own were stored finite or flagged)
      taint_if_bad(st.dv);
      st.dk *= grad_scale(slice);
      st.dv *= grad_scale(slice);
      store(st.dk, slice);
      store(st.dv, slice);
    }
    st.dh = st.dq * P(bname(l, "wq")).transpose() + st.dk * P(bname(l, "wk")).transpose() +
            st.dv * P(bname(l, "wv")).transpose();
    return dx2 + ln_backward(st.dh, st.xhat1, st.rstd1, Pv(bname(l, "ln1.g")));
  }

  void block_weight(int l, int slice, BlockState& st) {
    accumulate(G(bname(l, "w2")), st.g.transpose() * st.dz, slice);
    accumulate(Gv(bname(l, "b2")), st.dz.colwise().sum(), slice);
    accumulate(G(bname(l, "w1")), st.h2.transpose() * st.du, slice);
    accumulate(Gv(bname(l, "b1")), st.du.colwise().sum(), slice);
    accumulate(Gv(bname(l, "ln2.g")), (st.dh2.array() * st.xhat2.array()).matrix().colwise().sum(), slice);
    accumulate(Gv(bname(l, "ln2.b")), st.dh2.colwise().sum(), slice);
    accumulate(G(bname(l, "wo")), st.a.transpose() * st.dy_attn, slice);
    accumulate(Gv(bname(l, "bo")), st.dy_attn.colwise().sum(), slice);
    accumulate(G(bname(l, "wq")), st.h.transpose() * st.dq, slice);
    accumulate(G(bname(l, "wk")), st.h.transpose() * st.dk, slice);
    accumulate(G(bname(l, "wv")), st.h.transpose() * st.dv, slice);
    accumulate(Gv(bname(l, "ln1.g")), (st.dh.array() * st.xhat1.array()).matrix().colwise().sum(), slice);
    accumulate(Gv(bname(l, "ln1.b")), st.dh.colwise().sum(), slice);
  }
};

std::pair<int, int> stage_layers(const GptConfig& c, int stage, int stages) {
  return ir::layer_range(c.partition, c.layers, stage, stages);
}

std::int64_t stage_parameter_count(const GptConfig& c, int stage, int stages) {
  const auto [first, last] = stage_layers(c, stage, stages);
  std::int64_t n = std::int64_t(last - first) *
                   (4LL * c.hidden * c.hidden + 2LL * c.hidden * c.ffn + 6LL * c.hidden + c.ffn);
  if (stage == 0) n += std::int64_t(c.vocab + c.seq) * c.hidden;
  if (stage == stages - 1) n += std::int64_t(c.hidden + 1) * c.vocab + 2LL * c.hidden;
  return n;
}

GptConfig GptConfig::from_scenario(const ir::Scenario& sc) {
  const auto& m = sc.model;
  const std::string where = sc.source_file.empty() ? sc.name : sc.source_file;
  auto need = [&](bool ok, const char* field, const std::string& what) {
    if (!ok) throw Error(fmt::format("{}: model.{}: {} (the CPU executor's GPT)", where, field, what));
  };
  need(m.layers >= 1, "layers", "expected ≥ 1");
  need(m.hidden >= 1, "hidden", "expected ≥ 1");
  need(m.heads >= 1 && m.hidden % m.heads == 0, "heads",
       fmt::format("expected a divisor of hidden = {}", m.hidden));
  need(m.seq >= 1, "seq", "expected ≥ 1");
  need(m.vocab >= 2, "vocab", "expected ≥ 2");
  // The executor's maths is a GeLU MLP with multi-head attention; flash vs standard
  // attention is a kernel choice with the same result, so either is accepted.
  if (m.mlp != "gelu")
    throw Error(fmt::format("{}: model.mlp: expected gelu, got \"{}\"; the CPU executor runs GeLU "
                            "multi-head attention only (drop mlp or set mlp: gelu)", where, m.mlp));
  if (m.kv_heads_or_heads() != m.heads)
    throw Error(fmt::format("{}: model.kv_heads: expected heads = {}, got {}; the CPU executor runs GeLU "
                            "multi-head attention only, not grouped-query attention (drop kv_heads)",
                            where, m.heads, m.kv_heads));
  GptConfig c;
  c.layers = m.layers;
  c.hidden = m.hidden;
  c.heads = m.heads;
  c.ffn = m.ffn > 0 ? m.ffn : 4 * m.hidden;
  c.seq = m.seq;
  c.vocab = m.vocab;
  c.micro_batch = std::max(1, sc.parallel.micro_batch);
  return c;
}

GptStage::GptStage(const GptConfig& config, int stage, int stages) : impl_(std::make_unique<Impl>()) {
  if (stages < 1 || stage < 0 || stage >= stages)
    throw Error(fmt::format("GptStage: stage {} of {} is out of range", stage, stages));
  impl_->cfg = config;
  impl_->stage = stage;
  impl_->stages = stages;
  std::tie(impl_->first_block, impl_->last_block) = stage_layers(config, stage, stages);
  impl_->build();
}
GptStage::~GptStage() = default;
GptStage::GptStage(GptStage&&) noexcept = default;
GptStage& GptStage::operator=(GptStage&&) noexcept = default;

int GptStage::stage() const { return impl_->stage; }
bool GptStage::is_first() const { return impl_->first(); }
bool GptStage::is_last() const { return impl_->last(); }
std::vector<double>& GptStage::params() { return impl_->params; }
std::vector<double>& GptStage::grads() { return impl_->grads; }
std::vector<double>& GptStage::moments(int which) {
  if (which != 1 && which != 2) throw Error(fmt::format("Adam moment {}: expected 1 or 2", which));
  return which == 1 ? impl_->m1 : impl_->m2;
}
std::int64_t GptStage::take_block_ns() { return std::exchange(impl_->block_ns, 0); }
std::int64_t GptStage::activation_elements(int tokens) const {
  return static_cast<std::int64_t>(impl_->cfg.micro_batch) * tokens * impl_->cfg.hidden;
}

void GptStage::begin_step() {
  std::fill(impl_->grads.begin(), impl_->grads.end(), 0.0);
  impl_->slices.clear();
  impl_->kv.clear();
  impl_->overflow.assign(impl_->fp16_scales.size(), 0);
  impl_->inject = -1;
  impl_->tainted = false;
}

void GptStage::set_fp16(std::vector<double> scales) {
  for (double s : scales)
    if (!(s > 0) || !std::isfinite(s))
      throw Error(fmt::format("stage {}: an fp16 loss scale of {}; expected a positive number", impl_->stage, s));
  impl_->fp16_scales = std::move(scales);
  impl_->overflow.assign(impl_->fp16_scales.size(), 0);
}

const std::vector<std::uint8_t>& GptStage::overflowed() const { return impl_->overflow; }

void GptStage::inject_overflow(int slice) { impl_->inject = slice; }

Mat GptStage::forward(int mb, int slice, int t0, int t1, const Mat& x,
                      const std::vector<std::vector<int>>* tokens,
                      const std::vector<std::vector<int>>* targets, double loss_scale,
                      double* loss) {
  Impl& I = *impl_;
  const int b = I.cfg.micro_batch, T = t1 - t0, H = I.cfg.hidden;
  if (T <= 0 || t0 < 0 || t1 > I.cfg.seq)
    throw Error(fmt::format("stage {}: F{}:s{}: token range [{}, {}) outside the sequence of {}",
                            I.stage, mb, slice, t0, t1, I.cfg.seq));
  auto [it, inserted] = I.slices.try_emplace({mb, slice});
  if (!inserted)
    throw Error(fmt::format("stage {}: F{}:s{} ran twice in one step", I.stage, mb, slice));
  SliceState& st = it->second;
  st.t0 = t0;
  st.t1 = t1;
  I.tainted = false;
  Mat act;
  if (I.first()) {
    if (!tokens || static_cast<int>(tokens->size()) != b)
      throw Error(fmt::format("stage 0: F{}: expected {} token rows", mb, b));
    act.resize(b * T, H);
    MapMat tok = I.P("embed.tok");
    MapMat pos = I.P("embed.pos");
    st.tokens.assign(static_cast<std::size_t>(b), {});
    for (int i = 0; i < b; ++i)
      for (int r = 0; r < T; ++r) {
        const int id = (*tokens)[static_cast<std::size_t>(i)][static_cast<std::size_t>(t0 + r)];
        if (id < 0 || id >= I.cfg.vocab)
          throw Error(fmt::format("token id {} outside the vocabulary of {}", id, I.cfg.vocab));
        st.tokens[static_cast<std::size_t>(i)].push_back(id);
        act.row(i * T + r) = tok.row(id) + pos.row(t0 + r);
      }
    I.store(act, slice);
  } else {
    if (x.rows() != b * T || x.cols() != H)
      throw Error(fmt::format("stage {}: F{}:s{}: input is {}×{}, expected {}×{}", I.stage, mb,
                              slice, x.rows(), x.cols(), b * T, H));
    act = x;
  }
  I.taint_if_bad(act);
  st.blocks.resize(static_cast<std::size_t>(I.nblocks()));
  I.timed_blocks([&] {
    for (int l = I.first_block; l < I.last_block; ++l) {
      if (I.block_begin) I.block_begin(l - I.first_block);
      act = I.block_forward(mb, l, slice, t0, t1, act, st.blocks[static_cast<std::size_t>(l - I.first_block)]);
      I.store(act, slice);
      if (I.block_end) I.block_end(l - I.first_block);
    }
  });
  st.tainted = I.tainted;
  if (!I.last()) return act;

  HeadState& hs = st.head;
  ln_forward(act, I.Pv("head.ln.g"), I.Pv("head.ln.b"), I.cfg.ln_eps, hs.xhatf, hs.rstdf, hs.hf);
  Mat logits = (hs.hf * I.P("head.out")).rowwise() + I.Pv("head.bias");
  hs.probs.resize(logits.rows(), logits.cols());
  hs.dlogits = Mat::Zero(logits.rows(), logits.cols());
  double sum_ce = 0;
  if (!targets || static_cast<int>(targets->size()) != b)
    throw Error(fmt::format("stage {}: F{}: expected {} target rows", I.stage, mb, b));
  for (int i = 0; i < b; ++i)
    for (int r = 0; r < T; ++r) {
      const int row = i * T + r;
      const int y = (*targets)[static_cast<std::size_t>(i)][static_cast<std::size_t>(t0 + r)];
      const double mx = logits.row(row).maxCoeff();
      Vec e = (logits.row(row).array() - mx).exp();
      const double z = e.sum();
      hs.probs.row(row) = e / z;
      sum_ce += std::log(z) - (logits(row, y) - mx);
      hs.dlogits.row(row) = hs.probs.row(row) * (loss_scale * I.grad_scale(slice));
      hs.dlogits(row, y) -= loss_scale * I.grad_scale(slice);
    }
  I.store(hs.dlogits, slice);
  st.tainted = I.tainted;
  if (loss) *loss += loss_scale * sum_ce;
  return Mat();
}

void KvCache::truncate(int keep) {
  keep = std::max(keep, 0);
  if (keep >= tokens) return;
  for (auto* blocks : {&k, &v})
    for (Mat& m : *blocks) m.conservativeResize(keep, m.cols());
  tokens = keep;
}

std::vector<int> greedy_tokens(const Mat& logits) {
  std::vector<int> out;
  for (Eigen::Index r = 0; r < logits.rows(); ++r) {
    Eigen::Index best = 0;
    for (Eigen::Index c = 1; c < logits.cols(); ++c)
      if (logits(r, c) > logits(r, best)) best = c;
    out.push_back(static_cast<int>(best));
  }
  return out;
}

Mat GptStage::infer(const std::vector<InferItem>& items, const Mat& x) {
  Impl& I = *impl_;
  const int H = I.cfg.hidden;
  std::vector<Eigen::Index> first_row;
  Eigen::Index rows = 0;
  for (const InferItem& item : items) {
    if (item.tokens < 1 || item.position < 0)
      throw Error(fmt::format("stage {}: request {}: an item of {} tokens at position {}", I.stage, item.request,
                              item.tokens, item.position));
    if (item.position + item.tokens > I.cfg.seq)
      throw Error(fmt::format("stage {}: request {}: tokens [{}, {}) reach past the model's {} positions (model.seq)",
                              I.stage, item.request, item.position, item.position + item.tokens, I.cfg.seq));
    if (!item.cache || item.cache->tokens != item.position)
      throw Error(fmt::format("stage {}: request {}: an item at position {} needs the request's KV cache of {} tokens, "
                              "got {}", I.stage, item.request, item.position, item.position,
                              item.cache ? fmt::format("{} tokens", item.cache->tokens) : std::string("none")));
    if (I.first() && static_cast<int>(item.ids.size()) != item.tokens)
      throw Error(fmt::format("stage 0: request {}: an item of {} tokens with {} token ids", item.request, item.tokens,
                              item.ids.size()));
    for (std::size_t j = 0; j < first_row.size(); ++j)
      if (items[j].cache == item.cache)
        throw Error(fmt::format("stage {}: requests {} and {} share a KV cache in one batch", I.stage,
                                items[j].request, item.request));
    first_row.push_back(rows);
    rows += item.tokens;
  }
  Mat act;
  if (I.first()) {
    act.resize(rows, H);
    MapMat tok = I.P("embed.tok");
    MapMat pos = I.P("embed.pos");
    for (std::size_t i = 0; i < items.size(); ++i)
      for (int r = 0; r < items[i].tokens; ++r) {
        const int id = items[i].ids[static_cast<std::size_t>(r)];
        if (id < 0 || id >= I.cfg.vocab)
          throw Error(fmt::format("request {}: token id {} outside the vocabulary of {}", items[i].request, id,
                                  I.cfg.vocab));
        act.row(first_row[i] + r) = tok.row(id) + pos.row(items[i].position + r);
      }
  } else {
    if (x.rows() != rows || x.cols() != H)
      throw Error(fmt::format("stage {}: the batch's input is {}×{}, expected {}×{} (its items' tokens × hidden)",
                              I.stage, x.rows(), x.cols(), rows, H));
    act = x;
  }
  for (const InferItem& item : items)
    if (item.cache->tokens == 0) {
      item.cache->k.assign(static_cast<std::size_t>(I.nblocks()), Mat(0, H));
      item.cache->v.assign(static_cast<std::size_t>(I.nblocks()), Mat(0, H));
    }
  I.timed_blocks([&] {
    for (int l = I.first_block; l < I.last_block; ++l) {
      if (I.block_begin) I.block_begin(l - I.first_block);
      act = I.block_infer(l, items, first_row, act);
      if (I.block_end) I.block_end(l - I.first_block);
    }
  });
  for (const InferItem& item : items) item.cache->tokens += item.tokens;
  if (!I.last()) return act;
  Mat last(static_cast<Eigen::Index>(items.size()), H);
  for (std::size_t i = 0; i < items.size(); ++i)
    last.row(static_cast<Eigen::Index>(i)) = act.row(first_row[i] + items[i].tokens - 1);
  Mat xhat, hf;
  Eigen::VectorXd rstd;
  ln_forward(last, I.Pv("head.ln.g"), I.Pv("head.ln.b"), I.cfg.ln_eps, xhat, rstd, hf);
  return (hf * I.P("head.out")).rowwise() + I.Pv("head.bias");
}

Mat GptStage::backward_input(int mb, int slice, const Mat& dy) { return run_backward(mb, slice, dy, true, false, {}); }

void GptStage::backward_weight(int mb, int slice, const std::function<void(std::int64_t)>& done) {
  run_backward(mb, slice, Mat(), false, true, done);
}

Mat GptStage::backward(int mb, int slice, const Mat& dy, const std::function<void(std::int64_t)>& done) {
  return run_backward(mb, slice, dy, true, true, done);
}

Mat GptStage::run_backward(int mb, int slice, const Mat& dy, bool input, bool weight,
                           const std::function<void(std::int64_t)>& done) {
  Impl& I = *impl_;
  const auto n = static_cast<std::int64_t>(I.params.size());
  auto finished_from = [&](const std::string& first_name) {
    if (done) done(n - static_cast<std::int64_t>(I.specs[I.index.at(first_name)].offset));
  };
  auto it = I.slices.find({mb, slice});
  if (it == I.slices.end())
    throw Error(fmt::format("stage {}: {}{}:s{} before its F", I.stage, input ? "B" : "W", mb, slice));
  SliceState& st = it->second;
  if (input && st.backward_done) throw Error(fmt::format("stage {}: B{}:s{} ran twice", I.stage, mb, slice));
  if (!input && !st.backward_done) throw Error(fmt::format("stage {}: W{}:s{} before its B", I.stage, mb, slice));
  st.backward_done = true;
  const int T = st.t1 - st.t0;
  I.tainted = st.tainted;
  Mat grad;
  if (input) {
    if (I.last()) {
      HeadState& hs = st.head;
      hs.dhf = hs.dlogits * I.P("head.out").transpose();
      grad = ln_backward(hs.dhf, hs.xhatf, hs.rstdf, I.Pv("head.ln.g"));
      I.store(grad, slice);
    } else {
      const int rows = I.cfg.micro_batch * T;
      if (dy.rows() != rows || dy.cols() != I.cfg.hidden)
        throw Error(fmt::format("stage {}: B{}:s{}: gradient is {}×{}, expected {}×{}", I.stage, mb, slice,
                                dy.rows(), dy.cols(), rows, I.cfg.hidden));
      grad = dy;
      I.taint_if_bad(grad);
    }
    if (I.inject == slice && grad.size() > 0) {
      grad(0, 0) = std::numeric_limits<double>::infinity();
      I.inject = -1;
      if (I.fp16()) I.overflow[static_cast<std::size_t>(slice)] = 1;
    }
    if (I.last()) st.head.tainted = I.tainted;
  }
  if (weight && I.last()) {
    HeadState& hs = st.head;
    I.tainted = hs.tainted;  // a fused BW and a later W charge the same slice
    I.accumulate(I.G("head.out"), hs.hf.transpose() * hs.dlogits, slice);
    I.accumulate(I.Gv("head.bias"), hs.dlogits.colwise().sum(), slice);
    I.accumulate(I.Gv("head.ln.g"), (hs.dhf.array() * hs.xhatf.array()).matrix().colwise().sum(), slice);
    I.accumulate(I.Gv("head.ln.b"), hs.dhf.colwise().sum(), slice);
    finished_from("head.ln.g");
  }
  // Block by block from the last: the fused backward (BW) takes each block's input and
  // weight gradients together, as an autograd backward does, so the chunk's gradients
  // are final from its last parameters down while the op runs.
  I.timed_blocks([&] {
    for (int l = I.last_block - 1; l >= I.first_block; --l) {
      auto& stash = st.blocks[static_cast<std::size_t>(l - I.first_block)];
      // Only the input gradient reads the block's weights (W reads activations).
      if (input && I.block_begin) I.block_begin(l - I.first_block);
      if (input) {
        grad = I.block_backward(mb, l, slice, st.t0, st.t1, grad, stash);
        I.store(grad, slice);
        stash.tainted = I.tainted;
      }
      if (weight) {
        I.tainted = stash.tainted;
        I.block_weight(l, slice, stash);
        finished_from(I.bname(l, "ln1.g"));
      }
      if (input && I.block_end) I.block_end(l - I.first_block);
    }
  });
  if (input && slice == 0) {
    // Slice 0 is the last backward of this micro-batch: its KV state is spent.
    for (int l = I.first_block; l < I.last_block; ++l) I.kv.erase({mb, l});
  }
  if (input) st.tainted = I.tainted;
  if (input && I.first()) st.dx0 = std::move(grad);
  if (weight) {
    if (I.first()) {
      MapMat gtok = I.G("embed.tok");
      MapMat gpos = I.G("embed.pos");
      // The gradient at the embedding output is a stored (scaled) gradient already.
      if (I.fp16()) st.dx0 /= I.grad_scale(slice);
      for (std::size_t i = 0; i < st.tokens.size(); ++i)
        for (int r = 0; r < T; ++r) {
          const Eigen::Index row = static_cast<Eigen::Index>(i) * T + r;
          gtok.row(st.tokens[i][static_cast<std::size_t>(r)]) += st.dx0.row(row);
          gpos.row(st.t0 + r) += st.dx0.row(row);
        }
    }
    if (done) done(n);
    I.slices.erase(it);
  }
  return input && !I.first() ? grad : Mat();
}

void GptStage::adam(const AdamConfig& a, int t) { adam(a, t, 0, static_cast<std::int64_t>(impl_->params.size())); }

void GptStage::adam(const AdamConfig& a, int t, std::int64_t first, std::int64_t last) {
  Impl& I = *impl_;
  if (first < 0 || last < first || last > static_cast<std::int64_t>(I.params.size()))
    throw Error(fmt::format("stage {}: Adam over parameters [{}, {}) of {}", I.stage, first, last, I.params.size()));
  const double c1 = 1.0 - std::pow(a.beta1, t), c2 = 1.0 - std::pow(a.beta2, t);
  for (auto i = static_cast<std::size_t>(first); i < static_cast<std::size_t>(last); ++i)
    adam_element(a, c1, c2, I.grads[i], I.params[i], I.m1[i], I.m2[i]);
}

void GptStage::attach_memory(DeviceMemory* memory, bool offload) {
  Impl& I = *impl_;
  I.memory = memory;
  I.offload = offload;
  I.device.assign(offload ? static_cast<std::size_t>(I.nblocks()) : 0, {});
  std::size_t resident = I.params.size();
  if (offload)
    for (const auto& [first, last] : I.block_range) resident -= last - first;
  memory->add(static_cast<std::int64_t>(3 * resident * sizeof(double)));
}

int GptStage::blocks() const { return impl_->nblocks(); }

void GptStage::load_block(int block, bool state) {
  Impl& I = *impl_;
  DeviceBlock& d = I.device_block(block, "LOAD");
  const auto [first, last] = I.block_range[static_cast<std::size_t>(block)];
  const auto at = [&](std::vector<double>& v, std::size_t i) { return v.begin() + static_cast<std::ptrdiff_t>(i); };
  // The copy is made outside the lock (the host vectors do not change while the
  // plan's LOADs run: OPT writes them through OFFLOADs, after every use).
  DeviceCopy c;
  c.w.assign(at(I.params, first), at(I.params, last));
  if (state) {
    c.m1.assign(at(I.m1, first), at(I.m1, last));
    c.m2.assign(at(I.m2, first), at(I.m2, last));
  }
  I.memory->add(c.bytes());
  std::lock_guard lock(I.device_mutex);
  if (state) {
    for (const DeviceCopy& other : d)
      if (other.state())
        throw Error(fmt::format("stage {}: LOAD of block {}'s optimizer state: it is on the device already", I.stage,
                                I.first_block + block));
    d.push_back(std::move(c));  // OPT's copy; the weight copies in use stay in front
  } else {
    d.push_front(std::move(c));
  }
}

void GptStage::release_block(int block) { impl_->take_copy(block, false, "release", "a copy of its weights"); }

void GptStage::offload_block(int block) {
  Impl& I = *impl_;
  const DeviceCopy c = I.take_copy(block, true, "OFFLOAD", "its optimizer state");
  // Written back on the copy thread, which alone reads the block's host range (its LOADs).
  const std::size_t first = I.block_range[static_cast<std::size_t>(block)].first;
  const auto at = [&](std::vector<double>& v) { return v.begin() + static_cast<std::ptrdiff_t>(first); };
  std::copy(c.w.begin(), c.w.end(), at(I.params));
  std::copy(c.m1.begin(), c.m1.end(), at(I.m1));
  std::copy(c.m2.begin(), c.m2.end(), at(I.m2));
}

void GptStage::adam_block(const AdamConfig& a, int t, int block) {
  Impl& I = *impl_;
  DeviceBlock& d = I.device_block(block, "Adam");
  DeviceCopy* c = nullptr;
  {
    std::lock_guard lock(I.device_mutex);
    const auto it = find_copy(d, true);
    if (it == d.end())
      throw Error(fmt::format("stage {}: Adam of block {}: its optimizer state is not on the device", I.stage,
                              I.first_block + block));
    c = &*it;  // a list element stays put; only its OFFLOAD, after this step, removes it
  }
  const std::size_t first = I.block_range[static_cast<std::size_t>(block)].first;
  const double c1 = 1.0 - std::pow(a.beta1, t), c2 = 1.0 - std::pow(a.beta2, t);
  for (std::size_t i = 0; i < c->w.size(); ++i) adam_element(a, c1, c2, I.grads[first + i], c->w[i], c->m1[i], c->m2[i]);
}

void GptStage::adam_resident(const AdamConfig& a, int t) {
  Impl& I = *impl_;
  if (I.block_range.empty()) return adam(a, t);
  adam(a, t, 0, static_cast<std::int64_t>(I.block_range.front().first));
  adam(a, t, static_cast<std::int64_t>(I.block_range.back().second), static_cast<std::int64_t>(I.params.size()));
}

void GptStage::set_block_hooks(std::function<void(int)> begin, std::function<void(int)> end) {
  impl_->block_begin = std::move(begin);
  impl_->block_end = std::move(end);
}

void GptStage::adam_frozen_variance(const AdamConfig& a, int t, int frozen_at) {
  Impl& I = *impl_;
  if (frozen_at < 1 || t <= frozen_at)
    throw Error(fmt::format("stage {}: 1-bit Adam step {} with the variance frozen after step {}", I.stage, t, frozen_at));
  const double c1 = 1.0 - std::pow(a.beta1, t), c2 = 1.0 - std::pow(a.beta2, frozen_at);
  for (std::size_t i = 0; i < I.params.size(); ++i)
    I.params[i] -= a.lr * (I.m1[i] / c1) / (std::sqrt(I.m2[i] / c2) + a.eps);
}

ParamMap GptStage::named_params() const {
  ParamMap out;
  for (const auto& s : impl_->specs) {
    const auto* p = impl_->params.data() + s.offset;
    out[s.name].assign(p, p + static_cast<std::size_t>(s.rows) * s.cols);
  }
  return out;
}

ParamMap GptStage::named_moments(int which) const {
  if (which != 1 && which != 2) throw Error(fmt::format("named_moments({}): expected 1 or 2", which));
  const std::vector<double>& m = which == 1 ? impl_->m1 : impl_->m2;
  ParamMap out;
  for (const auto& s : impl_->specs) {
    const auto* p = m.data() + s.offset;
    out[s.name].assign(p, p + static_cast<std::size_t>(s.rows) * s.cols);
  }
  return out;
}

void GptStage::load_state(const ParamMap& params, const ParamMap& m1, const ParamMap& m2) {
  for (const auto& s : impl_->specs) {
    const std::size_t n = static_cast<std::size_t>(s.rows) * s.cols;
    for (auto [map, into, what] : {std::tuple<const ParamMap*, std::vector<double>*, const char*>{&params, &impl_->params, "parameters"},
                                   {&m1, &impl_->m1, "first moments"},
                                   {&m2, &impl_->m2, "second moments"}}) {
      const auto it = map->find(s.name);
      if (it == map->end() || it->second.size() != n)
        throw Error(fmt::format("stage {}: the {} to load have no {} of {} values", impl_->stage, what, s.name, n));
      std::copy(it->second.begin(), it->second.end(), into->begin() + static_cast<std::ptrdiff_t>(s.offset));
    }
  }
}

ParamMap GptStage::named_grads() const {
  ParamMap out;
  for (const auto& s : impl_->specs) {
    const auto* p = impl_->grads.data() + s.offset;
    out[s.name].assign(p, p + static_cast<std::size_t>(s.rows) * s.cols);
  }
  return out;
}

}  // namespace tdpipe::exec::cpu
