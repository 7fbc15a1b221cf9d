// gpt.hpp — the CPU executor's model: a GPT-style decoder in Eigen (double),
// split into virtual stages, with temporal slices and split backward.
//
// Stage s of V holds: the token + position embedding (s = 0), decoder blocks
// stage_layers(config, s, V) (LN → causal MHA → residual, LN → GeLU MLP → residual),
// and the final LN, LM head and cross-entropy (s = V − 1). An activation of one
// (micro-batch, slice) is a (b·T) × hidden matrix, rows sequence-major (row i·T + r
// is token t0 + r of sequence i). Slice j attends to the keys/values of slices ≤ j
// of its sequence, kept in a per-(micro-batch, block) KV cache; its input-gradient
// backward adds key/value gradients for the earlier slices to an accumulator they
// read when their own backward runs (slices go backward in reverse order).
// Serving (infer): items of several requests, each a run of its tokens at known
// positions, go through the blocks together, each attending to its request's KvCache.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Dense>

#include "tdpipe/ir/scenario.hpp"

namespace tdpipe::exec::cpu {

using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct GptConfig {
  int layers = 2;
  int hidden = 16;
  int heads = 2;
  int ffn = 64;
  int seq = 16;
  int vocab = 64;
  int micro_batch = 1;  ///< sequences per micro-batch (b)
  double ln_eps = 1e-5;
  std::uint64_t seed = 1234;  ///< weight initialisation
  /// Layers of each virtual stage (the plan's stage_layers); empty: a near-equal split.
  std::vector<int> partition;

  /// From a scenario's model (layers, hidden, ffn, heads, seq, vocab) and micro_batch.
  /// Throws tdpipe::Error naming the field when the model cannot run (hidden % heads …).
  static GptConfig from_scenario(const ir::Scenario& scenario);
};

struct AdamConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

/// Blocks [first, last) that virtual stage `stage` of `stages` holds: by
/// config.partition when given, else a near-equal split (ir::layer_range; a stage may
/// hold none when stages > layers).
std::pair<int, int> stage_layers(const GptConfig& config, int stage, int stages);

/// Parameters GptStage(config, stage, stages) holds — its blocks, plus the embeddings on
/// stage 0 and the final LayerNorm and LM head on the last — without building it (both
/// backends' memory checks size a model with it before allocating).
std::int64_t stage_parameter_count(const GptConfig& config, int stage, int stages);

/// Serving: the keys and values one request's tokens left in a stage's decoder blocks.
struct KvCache {
  std::vector<Mat> k, v;  ///< per local block: one row per cached token (position order)
  int tokens = 0;         ///< positions [0, tokens) are cached
  /// Keeps positions [0, keep) only (a later item recomputes the rest, or nothing reads it).
  void truncate(int keep);
};

/// Serving: one item of GptStage::infer's batch — tokens [position, position + tokens)
/// of request `request`, whose `cache` holds positions [0, position) and takes the new ones.
struct InferItem {
  int request = 0;  ///< names the request in errors
  int position = 0;
  int tokens = 0;
  KvCache* cache = nullptr;
  std::vector<int> ids;  ///< stage 0: the item's token ids (`tokens` of them)
};

/// Greedy sampling: each row's argmax (the lowest index among equal maxima).
std::vector<int> greedy_tokens(const Mat& logits);

/// Parameters by name ("embed.tok", "block3.wq", "head.out", …), flattened row-major.
using ParamMap = std::map<std::string, std::vector<double>>;

/// Bytes of weights and Adam state a rank's device holds, and the most it held at once
/// (parameter offload's measure). Thread-safe.
class DeviceMemory {
 public:
  void add(std::int64_t bytes) {
    const std::int64_t now = bytes_.fetch_add(bytes) + bytes;
    std::int64_t seen = peak_.load();
    while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
    }
  }
  std::int64_t bytes() const { return bytes_.load(); }
  std::int64_t peak() const { return peak_.load(); }

 private:
  std::atomic<std::int64_t> bytes_{0}, peak_{0};
};

/// One virtual stage of the model: parameters, gradients, Adam moments (each one
/// flat vector, so gradient buckets are contiguous views) and per-(mb, slice) state.
class GptStage {
 public:
  GptStage(const GptConfig& config, int stage, int stages);
  ~GptStage();
  GptStage(GptStage&&) noexcept;
  GptStage& operator=(GptStage&&) noexcept;

  int stage() const;
  bool is_first() const;
  bool is_last() const;

  /// Zeroes gradients and drops every cache.
  void begin_step();

  /// Forward of tokens [t0, t1) of micro-batch `mb` (slice `slice`). `x`: the input
  /// activation (stage > 0); `tokens`/`targets`: b rows of seq ids (stage 0 / last
  /// stage). Returns the output activation (empty on the last stage, which instead
  /// adds loss_scale · Σ cross-entropy to *loss).
  Mat forward(int mb, int slice, int t0, int t1, const Mat& x,
              const std::vector<std::vector<int>>* tokens,
              const std::vector<std::vector<int>>* targets, double loss_scale, double* loss);
  /// Serving forward of `items`: their rows stacked (item after item) go through each
  /// block together, each item attending causally to its cache and its own rows, no state
  /// kept for a backward. `x`: the input rows (stage > 0); stage 0 embeds items' ids at
  /// their positions. Returns the output rows, or on the last stage one row of logits per
  /// item (of its last token). Throws tdpipe::Error naming the request when an item reaches
  /// past model.seq or its cache does not hold exactly its position's tokens.
  Mat infer(const std::vector<InferItem>& items, const Mat& x);
  /// Input-gradient backward (B): from dL/d(output) (ignored on the last stage) to
  /// dL/d(input) (empty on stage 0); stashes what W needs.
  Mat backward_input(int mb, int slice, const Mat& dy);
  /// Weight-gradient backward (W) of a slice whose B ran: accumulates gradients, from the
  /// head through the blocks in reverse to the embedding; `done(tail)` (if given) after
  /// each part, with the count of trailing flat gradient elements finished so far.
  void backward_weight(int mb, int slice, const std::function<void(std::int64_t tail)>& done = {});
  /// B and W fused (BW), block by block from the last (each block's input gradient, then
  /// its weight gradient): the same results as backward_input then backward_weight, with
  /// `done` reporting the chunk's gradients final from its last parameters down.
  Mat backward(int mb, int slice, const Mat& dy, const std::function<void(std::int64_t tail)>& done = {});
  /// One Adam step (t = 1, 2, …) over this stage's parameters.
  void adam(const AdamConfig& adam, int t);
  /// The same step over parameters [first, last) only (a sharded optimizer's part).
  void adam(const AdamConfig& adam, int t, std::int64_t first, std::int64_t last);
  /// 1-bit Adam's step t after its warm-up: Adam's update with the first moment as the
  /// compressed all-reduce left it and the second as it was after step `frozen_at`,
  /// both unchanged (bias corrections 1 − β1^t and 1 − β2^frozen_at).
  void adam_frozen_variance(const AdamConfig& adam, int t, int frozen_at);

  std::vector<double>& params();
  std::vector<double>& grads();
  /// Adam's first (which = 1) or second (2) moment, flat like params().
  std::vector<double>& moments(int which);
  ParamMap named_params() const;
  ParamMap named_grads() const;
  /// Adam's first (which = 1) or second (2) moment, by parameter name.
  ParamMap named_moments(int which) const;
  /// Takes this stage's parameters and Adam moments by name from maps holding (at least)
  /// them — the state of another partition of the same model. Throws naming a missing
  /// or mis-sized tensor.
  void load_state(const ParamMap& params, const ParamMap& m1, const ParamMap& m2);
  /// Nanoseconds spent in this stage's decoder blocks (forward, input- and
  /// weight-gradient backward) since the previous call; the rest of an op's time is the
  /// embedding, the head and the loss (the load balancer tells the two apart).
  std::int64_t take_block_ns();
  /// Parameter offload. Counts this stage's weights and Adam moments in `memory` (8 bytes
  /// each), and with `offload` keeps its decoder blocks' in host memory (params(),
  /// moments() stay the host's master copy): a block is used only while load_block has
  /// put its device copy there, and using it otherwise throws naming the block.
  void attach_memory(DeviceMemory* memory, bool offload);
  /// Decoder blocks of this stage (the local block index of the calls below).
  int blocks() const;
  /// Copies block `block`'s weights (with `state`: and its Adam moments) to the device.
  void load_block(int block, bool state);
  /// Drops block `block`'s device copy of its weights (they did not change).
  void release_block(int block);
  /// Writes block `block`'s stepped weights and moments back to host memory, frees them.
  void offload_block(int block);
  /// Adam step t over block `block`'s device copy (after load_block(block, true)), the
  /// same arithmetic as adam().
  void adam_block(const AdamConfig& adam, int t, int block);
  /// Adam step t over the parameters outside the decoder blocks (embedding, head).
  void adam_resident(const AdamConfig& adam, int t);
  /// Called before and after forward, input-gradient and fused backward use a block's
  /// weights, with its local index; empty functions: none.
  void set_block_hooks(std::function<void(int block)> begin, std::function<void(int block)> end);

  /// fp16 training (model.dtype: fp16; tdpipe/exec/loss_scale.hpp). With `scales` (one
  /// loss scale per temporal slice; empty: fp64 throughout, the default) the stage stores
  /// activations and gradients through half-precision rounding where a mixed-precision
  /// model keeps them: the embedding's and each block's output, the keys and values, each
  /// block's input gradient, and a slice's parts of the weight gradients before they are
  /// unscaled into the master gradients; inside a block, and the weights and Adam state,
  /// stay fp64 (fp32 accumulation, master weights). Slice j's backward runs with its
  /// gradients multiplied by scales[j]: the loss gradient starts scaled, the key/value
  /// gradients later slices pass back are kept unscaled and take the reader's scale.
  /// Lasts until the next call; begin_step keeps it.
  void set_fp16(std::vector<double> scales);
  /// Per slice (of set_fp16's scales): whether a store this step was inf or NaN. Cleared
  /// by begin_step; empty without fp16.
  const std::vector<std::uint8_t>& overflowed() const;
  /// Fault injection for tests and `tdpipe exec --inject-overflow`: this step's next
  /// input-gradient backward of slice `slice` stores +inf into its gradient.
  void inject_overflow(int slice);

  /// Bytes of one (b·T) × hidden activation of a slice of T tokens.
  std::int64_t activation_elements(int tokens) const;

 private:
  Mat run_backward(int mb, int slice, const Mat& dy, bool input, bool weight,
                   const std::function<void(std::int64_t)>& done);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tdpipe::exec::cpu
