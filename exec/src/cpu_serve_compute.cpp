// cpu_serve_compute.cpp — ServeCompute: a serving plan's batches through one rank's
// decoder layers, per-request KV caches, the token feedback to stage 0.
#include "tdpipe/exec/cpu/serve_compute.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>

#include <fmt/format.h>

#include "tdpipe/exec/cpu/backend.hpp"
#include "tdpipe/exec/cpu/serve.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec::cpu {
namespace {

// While a batch runs, before each block: the runtime's poll (ComputeOp::poll), so the
// rank's transfers go on; its time is not the op's layers'.
class PolledBlocks {
 public:
  PolledBlocks(const ComputeOp& op, GptStage& st) : st_(st) {
    if (!op.poll) return;
    st.set_block_hooks(
        [poll = op.poll, this](int) {
          const auto t0 = std::chrono::steady_clock::now();
          (*poll)();
          waited_ += std::chrono::steady_clock::now() - t0;
        },
        {});
  }
  ~PolledBlocks() { st_.set_block_hooks({}, {}); }
  std::int64_t waited_ns() const { return std::chrono::duration_cast<std::chrono::nanoseconds>(waited_).count(); }
  PolledBlocks(const PolledBlocks&) = delete;
  PolledBlocks& operator=(const PolledBlocks&) = delete;

 private:
  GptStage& st_;
  std::chrono::steady_clock::duration waited_{0};
};

}  // namespace

ServeCompute::ServeCompute(const GptConfig& config, const ir::Plan& plan, int rank)
    : serve_(plan.serve ? &*plan.serve : nullptr),
      rank_(rank),
      stages_(plan.virtual_stages()),
      hidden_(config.hidden),
      vocab_(config.vocab),
      stage_(config, plan.stage_of.at(static_cast<std::size_t>(rank)).at(0), plan.virtual_stages()) {
  if (!serve_) throw Error(fmt::format("rank {}: the plan has no serving table (plan.serve)", rank));
  const auto& batches = serve_->batches;
  const int requests = static_cast<int>(serve_->requests.size());
  // After each item its request's cache keeps what its next item reads: that item's
  // position (0 before a recompute, or after the request's last item).
  std::vector<std::pair<int, int>> last(static_cast<std::size_t>(requests), {-1, -1});
  keep_after_.resize(batches.size());
  for (std::size_t b = 0; b < batches.size(); ++b) {
    int tokens = 0;
    keep_after_[b].assign(batches[b].items.size(), 0);
    for (std::size_t k = 0; k < batches[b].items.size(); ++k) {
      const ir::ServeItem& item = batches[b].items[k];
      if (item.request < 0 || item.request >= requests)
        throw Error(fmt::format("serving table: batch {} item {} names request {}; the plan has {} requests", b, k,
                                item.request, requests));
      auto& [pb, pk] = last[static_cast<std::size_t>(item.request)];
      if (pb >= 0) keep_after_[static_cast<std::size_t>(pb)][static_cast<std::size_t>(pk)] = item.position;
      pb = static_cast<int>(b);
      pk = static_cast<int>(k);
      tokens += item.tokens;
    }
    batch_tokens_.push_back(tokens);
  }
  begin_step(0);
}

void ServeCompute::begin_step(int) {
  caches_.clear();
  kv_tokens_ = peak_kv_tokens_ = 0;
  kv_tokens_after_.assign(serve_->batches.size(), -1);
  produced_.assign(serve_->requests.size(), {});
  sequences_.clear();
  if (!stage_.is_first()) return;
  for (std::size_t r = 0; r < serve_->requests.size(); ++r)
    sequences_.push_back(prompt_tokens(serve_->seed, static_cast<int>(r), serve_->requests[r].prompt, vocab_));
}

const ir::ServeBatch& ServeCompute::batch(int b) const {
  if (b < 0 || b >= static_cast<int>(serve_->batches.size()))
    throw Error(fmt::format("rank {}: batch {} is not in the serving table (it has {})", rank_, b,
                            serve_->batches.size()));
  return serve_->batches[static_cast<std::size_t>(b)];
}

void ServeCompute::learn(int r, int index, int id) {
  auto& seq = sequences_[static_cast<std::size_t>(r)];
  const int prompt = serve_->requests[static_cast<std::size_t>(r)].prompt;
  const auto at = static_cast<std::size_t>(prompt + index);
  if (id < 0 || id >= vocab_)
    throw Error(fmt::format("rank {}: token {} of request {} is {}, outside the vocabulary of {}", rank_, index, r, id,
                            vocab_));
  if (at < seq.size()) {
    if (seq[at] != id)
      throw Error(fmt::format("rank {}: token {} of request {} came back as {} after {}", rank_, index, r, id,
                              seq[at]));
    return;
  }
  if (at != seq.size())
    throw Error(fmt::format("rank {}: token {} of request {} came back before token {}", rank_, index, r,
                            static_cast<int>(seq.size()) - prompt));
  seq.push_back(id);
}

void ServeCompute::take_tokens(int b, const Buffer& buffer) {
  const auto& items = batch(b).items;
  if (buffer.dtype != DType::U8 || buffer.bytes() != static_cast<std::int64_t>(4 * items.size()))
    throw Error(fmt::format("rank {}: the tokens of batch {} came as {} bytes; expected 4 per item ({})", rank_, b,
                            buffer.bytes(), 4 * items.size()));
  for (std::size_t k = 0; k < items.size(); ++k) {
    std::int32_t id = 0;
    std::memcpy(&id, buffer.as<std::uint8_t>() + 4 * k, 4);
    const ir::ServeItem& item = items[k];
    learn(item.request, item.position + item.tokens - serve_->requests[static_cast<std::size_t>(item.request)].prompt,
          id);
  }
}

std::vector<int> ServeCompute::item_ids(int b, const ir::ServeItem& item) const {
  const auto& seq = sequences_[static_cast<std::size_t>(item.request)];
  const auto end = static_cast<std::size_t>(item.position + item.tokens);
  if (end > seq.size())
    throw Error(fmt::format("rank {}: batch {} reads request {}'s tokens up to position {}, but only {} are known: "
                            "the token of its previous batch has not come back (a missing dependency of the plan's "
                            "PREFILL/DECODE on that batch's token RECV)", rank_, b, item.request, end, seq.size()));
  return {seq.begin() + item.position, seq.begin() + static_cast<std::ptrdiff_t>(end)};
}

Buffer ServeCompute::run(const ComputeOp& op, Buffer input) {
  last_layers_ns_ = -1;
  if (!ir::is_serving(op.kind))
    throw Error(fmt::format("rank {}: {} in a serving run; it runs PREFILL and DECODE only", rank_,
                            ir::to_string(op.kind)));
  const ir::ServeBatch& b = batch(op.mb);
  for (const auto& [fed, buffer] : op.token_inputs) take_tokens(fed, buffer);
  std::vector<InferItem> items;
  items.reserve(b.items.size());
  for (const ir::ServeItem& s : b.items) {
    InferItem item{s.request, s.position, s.tokens, &caches_[s.request], {}};
    if (stage_.is_first()) item.ids = item_ids(op.mb, s);
    items.push_back(std::move(item));
  }
  Mat x;
  if (!stage_.is_first()) {
    const std::int64_t rows = batch_tokens_[static_cast<std::size_t>(op.mb)];
    if (input.dtype != DType::F64 || input.elements != rows * hidden_)
      throw Error(fmt::format("rank {}: the input of batch {} has {} elements; expected {} tokens × hidden {}", rank_,
                              op.mb, input.elements, rows, hidden_));
    x = Eigen::Map<const Mat>(input.as<double>(), rows, hidden_);
  }
  Mat y;
  {
    const PolledBlocks polled(op, stage_);
    stage_.take_block_ns();
    y = stage_.infer(items, x);
    last_layers_ns_ = std::max<std::int64_t>(0, stage_.take_block_ns() - polled.waited_ns());
  }
  // The batch's tokens are cached; then each request keeps what its next item reads.
  for (const ir::ServeItem& s : b.items) kv_tokens_ += s.tokens;
  peak_kv_tokens_ = std::max(peak_kv_tokens_, kv_tokens_);
  for (std::size_t k = 0; k < b.items.size(); ++k) {
    const int r = b.items[k].request;
    KvCache& cache = caches_.at(r);
    const int keep = keep_after_[static_cast<std::size_t>(op.mb)][k];
    kv_tokens_ -= cache.tokens - std::min(cache.tokens, keep);
    cache.truncate(keep);
    if (cache.tokens == 0) caches_.erase(r);
  }
  kv_tokens_after_[static_cast<std::size_t>(op.mb)] = kv_tokens_;
  if (!stage_.is_last()) {
    Buffer out = host_buffer(y.size());
    std::copy(y.data(), y.data() + y.size(), out.as<double>());
    return out;
  }
  const std::vector<int> ids = greedy_tokens(y);
  Buffer out = stages_ > 1 ? host_bytes(static_cast<std::int64_t>(4 * ids.size())) : Buffer{};
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const ir::ServeItem& s = b.items[k];
    auto& produced = produced_[static_cast<std::size_t>(s.request)];
    const int index = s.position + s.tokens - serve_->requests[static_cast<std::size_t>(s.request)].prompt;
    if (index != static_cast<int>(produced.size()))
      throw Error(fmt::format("rank {}: batch {} produces token {} of request {}, which has {} so far", rank_, op.mb,
                              index, s.request, produced.size()));
    produced.push_back(ids[k]);
    if (stage_.is_first()) learn(s.request, index, ids[k]);  // one stage: its own tokens feed its next batches
    if (!out.empty()) {
      const std::int32_t id = ids[k];
      std::memcpy(out.as<std::uint8_t>() + 4 * k, &id, 4);
    }
  }
  return out;
}

Buffer ServeCompute::allocate(const TensorKey& key) {
  const auto& items = batch(key.mb).items;
  if (stages_ > 1 && key.stage == stages_ - 1) return host_bytes(static_cast<std::int64_t>(4 * items.size()));
  return host_buffer(static_cast<std::int64_t>(batch_tokens_[static_cast<std::size_t>(key.mb)]) * hidden_);
}

Buffer ServeCompute::grad_bucket(int chunk, int index, int count) {
  throw Error(fmt::format("rank {}: gradient bucket {} of {} of chunk {} in a serving run, which has no gradients",
                          rank_, index, count, chunk));
}

Buffer ServeCompute::param_bucket(int chunk, int index, int count) {
  throw Error(fmt::format("rank {}: parameter bucket {} of {} of chunk {} in a serving run, which has no optimizer",
                          rank_, index, count, chunk));
}

}  // namespace tdpipe::exec::cpu
