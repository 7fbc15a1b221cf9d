// serving_scheduler.hpp — internal: what the serving planners share — the scheduler
// state (each request's progress and KV, the running queue, the batches so far) and the
// two schedulers that fill it, pp/tp's continuous batching (serving_continuous.cpp) and
// the TD-Pipe controller (serving_tdpipe.cpp). plan_serving (serving_plan.cpp) lowers
// their batches into ops.
#pragma once

#include <algorithm>
#include <deque>
#include <iterator>
#include <set>
#include <utility>
#include <vector>

#include "tdpipe/ir/serving.hpp"
#include "tdpipe/planner/serving_cost.hpp"

namespace tdpipe::planner::detail {

using ir::Request;
using ir::ServeBatch;
using ir::ServeItem;

/// The state every scheduler shares: per request its progress and KV, the running queue
/// in the order its requests' tokens return, and the batches so far.
class Scheduler {
 public:
  Scheduler(const ir::ServingConfig& cfg, const std::vector<Request>& requests, int stages, long long capacity)
      : cfg_(cfg), req_(requests), P_(stages), capacity_(capacity) {
    const std::size_t n = requests.size();
    done_.assign(n, 0);
    held_.assign(n, 0);
    last_.assign(n, -1);
    for (int r = 0; r < static_cast<int>(n); ++r) waiting_.push_back(r);
  }

  bool finished() const { return waiting_.empty() && running_.empty(); }
  int next_batch() const { return static_cast<int>(batches_.size()); }
  long long blocks() const { return blocks_; }
  long long capacity() const { return capacity_; }
  int block_tokens() const { return cfg_.block_tokens; }
  const std::vector<long long>& blocks_after() const { return blocks_after_; }
  std::vector<ServeBatch> take_batches() { return std::move(batches_); }
  std::deque<int>& waiting() { return waiting_; }
  std::deque<int>& running() { return running_; }
  int running_count() const { return static_cast<int>(running_.size()); }
  const Request& request(int r) const { return req_[static_cast<std::size_t>(r)]; }
  int done(int r) const { return done_[static_cast<std::size_t>(r)]; }
  int held(int r) const { return held_[static_cast<std::size_t>(r)]; }
  /// Whether r's token from its last batch is back before batch `j` starts.
  bool ready(int r, int j) const { return last_[static_cast<std::size_t>(r)] <= j - P_; }

  /// The item that moves request r one token on: its prompt (and, after a preemption,
  /// what it generated) as a prefill when nothing is cached, else one decode token.
  ServeItem item_for(int r) const {
    const Request& q = request(r);
    if (held(r) == 0) return {r, 0, q.prompt + done(r)};
    return {r, q.prompt + done(r) - 1, 1};
  }
  /// Blocks the item adds to the cache.
  long long blocks_for(const ServeItem& i) const {
    return ir::kv_blocks(i.position + i.tokens, block_tokens()) - ir::kv_blocks(held(i.request), block_tokens());
  }
  /// Frees r's cache and sends it back to the front of the queue (recompute later).
  void preempt(int r) {
    blocks_ -= ir::kv_blocks(held(r), block_tokens());
    held_[static_cast<std::size_t>(r)] = 0;
    waiting_.push_front(r);
    preempted_.push_back(r);
  }

  /// Appends a batch: caches its tokens, records its KV, retires finished requests and
  /// queues the others (in this batch's order) to run again once their token is back.
  void add(std::vector<ServeItem> items, int phase) {
    const int j = next_batch();
    for (const ServeItem& i : items) {
      blocks_ += blocks_for(i);
      held_[static_cast<std::size_t>(i.request)] = i.position + i.tokens;
      last_[static_cast<std::size_t>(i.request)] = j;
    }
    for (const ServeItem& i : items) {
      const int r = i.request;
      done_[static_cast<std::size_t>(r)] = i.position + i.tokens - request(r).prompt + 1;
      if (done(r) >= request(r).output) {
        blocks_ -= ir::kv_blocks(held(r), block_tokens());
        held_[static_cast<std::size_t>(r)] = 0;
      } else {
        running_.push_back(r);
      }
    }
    blocks_after_.push_back(peak_after_batch(items));
    batches_.push_back({std::move(items), phase, std::move(preempted_)});
    preempted_.clear();
  }

  /// Takes up to `n` requests from the front of the running queue for batch `j`: those
  /// whose token is back. With `wait` and none back, the requests of the earliest batch
  /// to return instead (batch j then waits for their tokens).
  std::vector<int> take_ready(int j, int n, bool wait) {
    std::vector<int> out;
    while (static_cast<int>(out.size()) < n && !running_.empty() && ready(running_.front(), j)) {
      out.push_back(running_.front());
      running_.pop_front();
    }
    if (!out.empty() || !wait || running_.empty()) return out;
    const int first = last_[static_cast<std::size_t>(running_.front())];
    while (static_cast<int>(out.size()) < n && !running_.empty() &&
           last_[static_cast<std::size_t>(running_.front())] == first) {
      out.push_back(running_.front());
      running_.pop_front();
    }
    return out;
  }

  /// take_ready for a decode round: when more requests are back than `n`, the n whose
  /// cached tokens sum closest to `goal_tokens` (one at a time, the one nearest the
  /// remaining average), so batches equal in count read about as much KV too; the others
  /// stay at the front of the pool, in their order, for the next batch.
  std::vector<int> take_balanced(int j, int n, double goal_tokens) {
    std::size_t back = 0;
    while (back < running_.size() && ready(running_[back], j)) ++back;
    if (back <= static_cast<std::size_t>(n)) return take_ready(j, n, true);
    std::multiset<std::pair<int, std::size_t>> pool;  // (tokens cached, place in the queue)
    for (std::size_t k = 0; k < back; ++k) pool.insert({held(running_[k]), k});
    std::vector<char> chosen(back, 0);
    double left = goal_tokens;
    for (int c = n; c > 0; --c) {
      const double want = left / c;
      auto it = pool.lower_bound({static_cast<int>(std::min(want, 1e9)), 0});
      if (it == pool.end() || (it != pool.begin() && want - std::prev(it)->first < it->first - want)) --it;
      chosen[it->second] = 1;
      left -= it->first;
      pool.erase(it);
    }
    std::vector<int> out, rest;
    for (std::size_t k = 0; k < back; ++k) (chosen[k] ? out : rest).push_back(running_[k]);
    running_.erase(running_.begin(), running_.begin() + static_cast<std::ptrdiff_t>(back));
    running_.insert(running_.begin(), rest.begin(), rest.end());
    return out;
  }

 private:
  /// KV blocks the ranks hold once the batch ran: with the batch's tokens, before the
  /// finished requests' blocks are freed (the most the batch needs).
  long long peak_after_batch(const std::vector<ServeItem>& items) const {
    long long freed = 0;
    for (const ServeItem& i : items)
      if (done(i.request) >= request(i.request).output)
        freed += ir::kv_blocks(i.position + i.tokens, block_tokens());
    return blocks_ + freed;
  }

  const ir::ServingConfig& cfg_;
  const std::vector<Request>& req_;
  int P_ = 1;
  long long capacity_ = 0;
  std::vector<int> done_;  ///< output tokens produced
  std::vector<int> held_;  ///< tokens in the KV cache
  std::vector<int> last_;  ///< last batch the request was in
  std::deque<int> waiting_, running_;
  std::vector<int> preempted_;  ///< since the last batch
  long long blocks_ = 0;
  std::vector<ServeBatch> batches_;
  std::vector<long long> blocks_after_;
};

/// vLLM's continuous batching with P batches in flight (pp; tp is P = 1).
void schedule_continuous(Scheduler& s, const ir::ServingConfig& cfg);
/// The TD-Pipe controller over P pipeline stages.
void schedule_tdpipe(Scheduler& s, const ir::ServingConfig& cfg, const ServingCost& cost, int P);

}  // namespace tdpipe::planner::detail
