// serve_compute.hpp — the CPU backend's Compute for serving plans: one pipeline rank's
// decoder layers (a GptStage) and a KV cache per request.
//
// PREFILL/DECODE of batch b runs the batch's items (ir::ServeItem) through the stage
// together (GptStage::infer). Stage 0 builds each item's token ids: the request's prompt
// (prompt_tokens) then the tokens it generated so far, which the last stage sends back
// (ComputeOp::token_inputs; with one stage, its own). The last stage samples greedily and
// records every token. After each item a request's cache keeps only what its next item
// reads: nothing after its last token or before a recompute (a preempted request's
// next item starts again at position 0).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "tdpipe/exec/backend.hpp"
#include "tdpipe/exec/cpu/gpt.hpp"
#include "tdpipe/ir/plan.hpp"

namespace tdpipe::exec::cpu {

class ServeCompute final : public Compute {
 public:
  /// Pipeline rank `rank` of serving plan `plan` (plan.serve set; it must outlive this),
  /// with model `config` cut into the plan's stages.
  ServeCompute(const GptConfig& config, const ir::Plan& plan, int rank);

  /// Drops every cache and token: a serving plan runs from its start.
  void begin_step(int step) override;
  /// PREFILL/DECODE of batch op.mb (Compute::run's serving form); throws tdpipe::Error
  /// for another op or a batch whose tokens stage 0 has not learnt.
  Buffer run(const ComputeOp& op, Buffer input) override;
  std::int64_t last_layers_ns() const override { return last_layers_ns_; }
  /// Stage 0 of a pipeline, the last stage's tokens of batch key.mb (4 bytes per item);
  /// otherwise the hidden states of that batch (tokens × hidden doubles).
  Buffer allocate(const TensorKey& key) override;
  /// Serving has no gradients: throws tdpipe::Error.
  Buffer grad_bucket(int chunk, int index, int count) override;
  /// Serving has no optimizer: throws tdpipe::Error.
  Buffer param_bucket(int chunk, int index, int count) override;
  double end_step() override { return 0; }

  /// The last stage: per request, the output tokens it sampled so far, in order.
  const std::vector<std::vector<int>>& tokens() const { return produced_; }
  /// The most tokens this rank's KV caches held at once (after a batch's tokens were
  /// cached, before finished requests let theirs go).
  std::int64_t peak_kv_tokens() const { return peak_kv_tokens_; }
  /// Per batch, the tokens this rank's KV caches held once its PREFILL/DECODE ended (after
  /// finished and soon-recomputed requests let theirs go); −1 for a batch not run yet.
  /// Written by the rank's thread as each op ends: read it after that thread is joined.
  const std::vector<std::int64_t>& kv_tokens_after() const { return kv_tokens_after_; }

 private:
  const ir::ServeBatch& batch(int b) const;
  /// Stage 0: learns batch b's tokens from the last stage's buffer.
  void take_tokens(int b, const Buffer& buffer);
  /// Stage 0: output token `index` of request r is `id` (again: it must be the same).
  void learn(int r, int index, int id);
  /// Stage 0: the ids of item `item` of batch b, from the request's prompt and tokens.
  std::vector<int> item_ids(int b, const ir::ServeItem& item) const;

  const ir::ServePlan* serve_;
  int rank_, stages_;
  int hidden_, vocab_;
  GptStage stage_;
  std::vector<int> batch_tokens_;                  ///< per batch: its items' tokens
  std::vector<std::vector<int>> keep_after_;       ///< [batch][item]: cache tokens kept after it
  std::map<int, KvCache> caches_;                  ///< per request holding some
  std::int64_t kv_tokens_ = 0, peak_kv_tokens_ = 0;
  std::vector<std::int64_t> kv_tokens_after_;      ///< per batch: kv_tokens_ as its op ended
  std::vector<std::vector<int>> sequences_;        ///< stage 0: per request, prompt then tokens learnt
  std::vector<std::vector<int>> produced_;         ///< last stage: per request, tokens sampled
  std::int64_t last_layers_ns_ = -1;
};

}  // namespace tdpipe::exec::cpu
