// serving_plan.cpp — the serving planners (pp, tp, tdpipe; see serving.hpp) and the
// lowering of their batches into ops.
#include "tdpipe/planner/serving.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <numeric>
#include <set>

#include <fmt/format.h>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/planner/serving_cost.hpp"

namespace tdpipe::planner {
namespace {

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
  const std::vector<ServeBatch>& batches() const { return batches_; }
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
    peak_ = std::max(peak_, blocks_);
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
  long long blocks_ = 0, peak_ = 0;
  std::vector<ServeBatch> batches_;
  std::vector<long long> blocks_after_;
};

/// vLLM's continuous batching with P batches in flight (pp; tp is P = 1).
void schedule_continuous(Scheduler& s, const ir::ServingConfig& cfg) {
  const long long watermark = std::max<long long>(1, s.capacity() / 100);
  while (!s.finished()) {
    const int j = s.next_batch();
    auto& waiting = s.waiting();
    auto admissible = [&] {
      return !waiting.empty() && s.blocks() + s.blocks_for(s.item_for(waiting.front())) <= s.capacity() - watermark;
    };
    // Decodes of the requests whose token is back; with none and no prompt to admit,
    // those of the earliest batch to return (this batch then waits for them).
    std::vector<int> decode = s.take_ready(j, cfg.max_batch_requests, false);
    if (decode.empty() && !admissible()) decode = s.take_ready(j, cfg.max_batch_requests, true);
    // A decode that needs a block when none is free preempts the batch's latest-admitted
    // request (vLLM's recompute preemption), until the rest fit.
    auto need = [&] {
      long long n = 0;
      for (int r : decode) n += s.blocks_for(s.item_for(r));
      return n;
    };
    while (!decode.empty() && s.blocks() + need() > s.capacity()) {
      s.preempt(decode.back());
      decode.pop_back();
    }
    std::vector<ServeItem> items;
    long long new_blocks = 0;
    int tokens = 0;
    for (int r : decode) {
      items.push_back(s.item_for(r));
      new_blocks += s.blocks_for(items.back());
      tokens += 1;
    }
    while (!waiting.empty() && static_cast<int>(items.size()) < cfg.max_batch_requests) {
      const ServeItem item = s.item_for(waiting.front());
      if (tokens + item.tokens > cfg.max_batch_tokens && !items.empty()) break;
      const long long blocks = s.blocks_for(item);
      if (s.blocks() + new_blocks + blocks > s.capacity() - watermark) break;
      items.push_back(item);
      new_blocks += blocks;
      tokens += item.tokens;
      waiting.pop_front();
    }
    // Everything preempted and nothing admitted: the blocks are held by requests in
    // flight; the next batch takes (or preempts) those.
    if (items.empty() && !s.running().empty()) continue;
    if (items.empty()) {
      const int r = waiting.empty() ? -1 : waiting.front();
      throw Error(fmt::format("serving: request {} ({} prompt tokens) cannot be admitted: its prompt needs {} KV "
                              "blocks and the GPUs hold {} with nothing else running",
                              r, r < 0 ? 0 : s.request(r).prompt,
                              r < 0 ? 0 : ir::kv_blocks(s.request(r).prompt, cfg.block_tokens), s.capacity()));
    }
    s.add(std::move(items), 0);
  }
}

/// Projected peak KV blocks of requests (tokens cached now, decode steps left) decoding
/// in lockstep: at step u each request still running holds c + u tokens. The peak is at
/// the last step of some request; ⌈x / B⌉ ≤ (x + B − 1) / B bounds it from above.
class KvProjection {
 public:
  explicit KvProjection(int block_tokens) : B_(block_tokens) {}
  /// Adds a request; kept sorted by steps left, longest first, so peak() is one pass.
  void add(long long cached, long long steps) {
    const auto at = std::upper_bound(items_.begin(), items_.end(), steps,
                                     [](long long s, const std::pair<long long, long long>& i) { return s > i.first; });
    last_ = static_cast<std::size_t>(at - items_.begin());
    items_.insert(at, {steps, cached});
  }
  /// Removes the request add() added last.
  void pop() { items_.erase(items_.begin() + static_cast<std::ptrdiff_t>(last_)); }
  long long peak() const {
    double best = 0, sum_c = 0;
    for (std::size_t k = 0; k < items_.size(); ++k) {
      sum_c += static_cast<double>(items_[k].second);
      // The alive set at step u is every request with at least u steps left.
      if (k + 1 < items_.size() && items_[k + 1].first == items_[k].first) continue;
      const double n = static_cast<double>(k + 1);
      const double u = static_cast<double>(items_[k].first);
      best = std::max(best, (sum_c + n * u + n * (B_ - 1)) / B_);
    }
    return static_cast<long long>(std::floor(best));
  }
  std::size_t size() const { return items_.size(); }

 private:
  int B_;
  std::vector<std::pair<long long, long long>> items_;  ///< (steps left, tokens cached), steps descending
  std::size_t last_ = 0;
};

/// Seconds of one stage (the slowest) for a batch of `n` decode tokens at context `ctx`.
double decode_seconds(const ServingCost& cost, int n, int ctx) {
  std::vector<ServeItem> items(static_cast<std::size_t>(std::max(1, n)), ServeItem{0, std::max(0, ctx - 1), 1});
  double worst = 0;
  for (int r = 0; r < cost.stages(); ++r) worst = std::max(worst, cost.batch_seconds(r, items));
  return worst;
}

double stage_seconds(const ServingCost& cost, const std::vector<ServeItem>& items) {
  double worst = 0;
  for (int r = 0; r < cost.stages(); ++r) worst = std::max(worst, cost.batch_seconds(r, items));
  return worst;
}

/// The TD-Pipe controller.
void schedule_tdpipe(Scheduler& s, const ir::ServingConfig& cfg, const ServingCost& cost, int P) {
  const double limit = cfg.kv_fraction * static_cast<double>(s.capacity());
  int phase = 0;
  auto projection_of_running = [&] {
    KvProjection proj(cfg.block_tokens);
    for (int r : s.running()) proj.add(s.held(r), s.request(r).output - s.done(r));
    return proj;
  };
  // Prefill batches the projection admits from the front of the queue (without taking
  // them when `commit` is false: the switch rule's candidates).
  // At most P · max_batch_requests run at once: every decode round then serves each
  // running request once (P batches of at most max_batch_requests), so requests do
  // decode in lockstep, as the KV projection assumes.
  const int max_running = P * cfg.max_batch_requests;
  auto prefill_batches = [&](bool commit) {
    std::vector<std::vector<ServeItem>> out;
    KvProjection proj = projection_of_running();
    auto& waiting = s.waiting();
    std::size_t at = 0;
    bool full = false;  // the KV projection or the running cap stopped admission
    while (at < waiting.size() && !full) {
      std::vector<ServeItem> batch;
      int tokens = 0;
      while (at < waiting.size() && static_cast<int>(batch.size()) < cfg.max_batch_requests) {
        if (static_cast<int>(proj.size()) >= max_running) {
          full = true;
          break;
        }
        const int r = waiting[at];
        const ServeItem item = s.item_for(r);
        if (tokens + item.tokens > cfg.max_batch_tokens && !batch.empty()) break;
        proj.add(item.tokens, s.request(r).output - s.done(r) - 1);
        if (static_cast<double>(proj.peak()) > limit) {
          proj.pop();
          full = true;
          break;
        }
        batch.push_back(item);
        tokens += item.tokens;
        ++at;
      }
      if (!batch.empty()) out.push_back(std::move(batch));
      else break;
    }
    if (commit) waiting.erase(waiting.begin(), waiting.begin() + static_cast<std::ptrdiff_t>(at));
    return out;
  };
  const double full = cfg.max_batch_requests;
  while (!s.finished()) {
    // Prefill window.
    if (!s.waiting().empty()) {
      auto batches = prefill_batches(true);
      if (batches.empty() && s.running().empty()) {
        const int r = s.waiting().front();
        const Request& q = s.request(r);
        throw Error(fmt::format("serving: request {} ({} prompt + {} output tokens) needs {} KV blocks at its full "
                                "length; kv_fraction {} of the GPUs' {} blocks is {:.0f}",
                                r, q.prompt, q.output, ir::kv_blocks(q.prompt + q.output, cfg.block_tokens),
                                cfg.kv_fraction, s.capacity(), limit));
      }
      for (auto& b : batches) s.add(std::move(b), phase);
      if (!batches.empty()) ++phase;
    }
    // Decode window: rounds of P batches from one pool until the controller switches. A
    // round serves every running request once: each batch takes ⌈left / slots left⌉ of
    // the requests the round has not served (⌊N/P⌋, +1 for the first N mod P batches), so
    // the batches stay within one of each other; among the requests whose token is back
    // it picks those that give it its share of the round's cached tokens, since a decode
    // step's time follows the KV it reads as much as its request count.
    int in_window = 0, round_left = 0;
    double round_tokens = 0;
    while (!s.running().empty()) {
      const int j = s.next_batch();
      const int slot = in_window % P;
      if (slot == 0) {
        round_left = s.running_count();
        round_tokens = 0;
        for (int r : s.running()) round_tokens += s.held(r);
      }
      const int slots_left = P - slot;
      const int target =
          std::min(cfg.max_batch_requests, std::max(1, (round_left + slots_left - 1) / slots_left));
      std::vector<int> take = s.take_balanced(j, target, round_tokens * target / std::max(1, round_left));
      round_left = std::max(0, round_left - static_cast<int>(take.size()));
      for (int r : take) round_tokens -= s.held(r);
      std::vector<ServeItem> items;
      for (int r : take) items.push_back(s.item_for(r));
      s.add(std::move(items), phase);
      ++in_window;
      if (in_window % P != 0 || s.waiting().empty() || s.running().empty()) continue;
      const double b = static_cast<double>(s.running_count()) / P;
      if (b > 0.75 * full) continue;
      double ctx = 0;
      for (int r : s.running()) ctx += s.held(r);
      ctx /= std::max(1, s.running_count());
      SwitchInputs in;
      in.stages = P;
      in.decode_batch = b;
      in.decode_seconds = decode_seconds(cost, static_cast<int>(std::ceil(b)), static_cast<int>(ctx));
      in.full_batch = full;
      in.full_seconds = decode_seconds(cost, static_cast<int>(full), static_cast<int>(ctx));
      int admitted = 0;
      for (const auto& batch : prefill_batches(false)) {
        in.prefill_seconds.push_back(stage_seconds(cost, batch));
        admitted += static_cast<int>(batch.size());
      }
      in.decode_after_seconds =
          decode_seconds(cost, static_cast<int>(std::ceil((s.running_count() + admitted) / double(P))), static_cast<int>(ctx));
      if (switch_decision(in).to_prefill) break;
    }
    if (in_window > 0) ++phase;
  }
}

}  // namespace

SwitchDecision switch_decision(const SwitchInputs& in) {
  SwitchDecision d;
  if (in.prefill_seconds.empty() || !(in.decode_seconds > 0) || !(in.full_seconds > 0)) return d;
  d.decode_intensity = (in.decode_batch / in.decode_seconds) / (in.full_batch / in.full_seconds);
  const double sum = std::accumulate(in.prefill_seconds.begin(), in.prefill_seconds.end(), 0.0);
  const double longest = *std::max_element(in.prefill_seconds.begin(), in.prefill_seconds.end());
  d.prefill_time = sum + (in.stages - 1) * longest;
  d.bubble = (in.stages - 1) * std::max(0.0, longest - in.decode_after_seconds);
  d.prefill_intensity = d.prefill_time > 0 ? (d.prefill_time - d.bubble) / d.prefill_time : 0;
  d.to_prefill = d.decode_intensity < d.prefill_intensity;
  return d;
}

ir::Plan plan_serving(const ir::Scenario& scenario, const std::string& planner,
                      const std::vector<Request>& requests) {
  const auto& names = ir::serving_planner_names();
  if (std::find(names.begin(), names.end(), planner) == names.end())
    throw Error(fmt::format("unknown serving planner '{}'; expected one of: {}", planner, fmt::join(names, ", ")));
  if (!scenario.serving)
    throw Error(fmt::format("{}: no serving: section; a serving plan needs one (requests, lengths, memory)",
                            scenario.name));
  if (requests.empty()) throw Error("serving: no requests to plan");
  const ir::Scenario sc = serving_layout(scenario, planner);
  const ir::ServingConfig& cfg = *sc.serving;
  const int P = sc.parallel.pipeline;
  const ServingCost cost(sc, P);
  const long long capacity = cost.kv_capacity_blocks();
  for (std::size_t r = 0; r < requests.size(); ++r) {
    const Request& q = requests[r];
    if (q.prompt < 1 || q.output < 1)
      throw Error(fmt::format("serving: request {}: prompt {} and output {} tokens; expected at least 1 each", r,
                              q.prompt, q.output));
    if (static_cast<long long>(q.prompt) + q.output - 1 > sc.model.seq)
      throw Error(fmt::format("serving: request {}: {} prompt + {} output tokens exceed the model's context of "
                              "model.seq = {} tokens",
                              r, q.prompt, q.output, sc.model.seq));
    if (ir::kv_blocks(q.prompt + q.output, cfg.block_tokens) > capacity)
      throw Error(fmt::format("serving: request {}: {} tokens need {} KV blocks; the GPUs hold {}", r,
                              q.prompt + q.output, ir::kv_blocks(q.prompt + q.output, cfg.block_tokens), capacity));
  }

  // The plan holds an item per output token (12 bytes) and 3·P ops per batch: bound it
  // before building it.
  long long outputs = 0;
  for (const Request& q : requests) outputs += q.output;
  constexpr long long kMaxOutputTokens = 200'000'000;
  if (outputs > kMaxOutputTokens)
    throw Error(fmt::format("serving: {} requests generate {} output tokens; a plan holds at most {} (one item each, "
                            "{:.1f} GiB of plan already): serve fewer requests (--count) or shorter outputs",
                            requests.size(), outputs, kMaxOutputTokens, 12.0 * kMaxOutputTokens / (1 << 30)));
  Scheduler s(cfg, requests, P, capacity);
  if (planner == "tdpipe") schedule_tdpipe(s, cfg, cost, P);
  else schedule_continuous(s, cfg);
  const std::vector<long long> blocks_after = s.blocks_after();

  ir::Plan plan;
  plan.schedule = "serve-" + planner;
  plan.stages = P;
  plan.chunks = 1;
  plan.slices = 1;
  plan.data = 1;
  plan.lowered = true;
  plan.stage_of.assign(static_cast<std::size_t>(P), std::vector<int>{});
  for (int r = 0; r < P; ++r) plan.stage_of[static_cast<std::size_t>(r)] = {r};
  plan.scenario = sc;
  ir::ServePlan serve;
  serve.planner = planner;
  serve.requests = requests;
  serve.batches = s.take_batches();
  serve.block_tokens = cfg.block_tokens;
  serve.seed = cfg.seed;
  for (int r = 0; r < P; ++r) {
    serve.kv_bytes_per_token.push_back(cost.kv_bytes_per_token(r));
    serve.kv_capacity_bytes.push_back(static_cast<double>(capacity) * cfg.block_tokens * cost.kv_bytes_per_token(r));
  }
  const int n = static_cast<int>(serve.batches.size());
  plan.microbatches = n;

  // Where rank 0 receives each batch's tokens: in the p2p group of batch g(b), at the
  // latest b + P − 1 (deadlock-free: see serving.hpp) and before the first batch that
  // needs them; non-decreasing in b, as the last rank sends them in that order.
  std::vector<int> need(static_cast<std::size_t>(n), std::numeric_limits<int>::max());
  std::vector<int> prev(requests.size(), -1);
  std::vector<std::vector<int>> uses(static_cast<std::size_t>(n));  // batches whose tokens batch j needs
  for (int j = 0; j < n; ++j) {
    for (const ServeItem& i : serve.batches[static_cast<std::size_t>(j)].items) {
      // A request's next batch needs the token its previous batch produced (a recomputed
      // prefill too: it re-reads the tokens generated so far from rank 0's record).
      const int b = prev[static_cast<std::size_t>(i.request)];
      if (b >= 0) {
        need[static_cast<std::size_t>(b)] = std::min(need[static_cast<std::size_t>(b)], j);
        uses[static_cast<std::size_t>(j)].push_back(b);
      }
      prev[static_cast<std::size_t>(i.request)] = j;
    }
  }
  std::vector<int> group(static_cast<std::size_t>(n));
  for (int b = n - 1; b >= 0; --b) {
    long long g = static_cast<long long>(b) + P - 1;
    if (need[static_cast<std::size_t>(b)] != std::numeric_limits<int>::max())
      g = std::min<long long>(g, need[static_cast<std::size_t>(b)] - 1);
    if (b + 1 < n) g = std::min<long long>(g, group[static_cast<std::size_t>(b) + 1]);
    group[static_cast<std::size_t>(b)] = static_cast<int>(g);
  }

  // Per rank and batch j: [RECV of j's input], PREFILL/DECODE j, then one p2p group
  // posted together (non-blocking sends, as vLLM's isend): j's output SEND, the RECV of
  // j + 1's input, and on rank 0 the token RECVs placed at j. Grouping the next input
  // with this output lets a stage run ahead of its successor by a batch, as real
  // pipelines do, without the rendezvous stalling either.
  plan.ranks.assign(static_cast<std::size_t>(P), {});
  std::vector<int> recv_tok(static_cast<std::size_t>(n), -1);  // rank 0's RECV of batch b's tokens
  const double block_tokens = cfg.block_tokens;
  std::vector<int> batch_tokens(static_cast<std::size_t>(n), 0);
  for (int j = 0; j < n; ++j)
    for (const ServeItem& i : serve.batches[static_cast<std::size_t>(j)].items)
      batch_tokens[static_cast<std::size_t>(j)] += i.tokens;
  auto make = [](ir::OpKind kind, int mb) {
    ir::Op op;
    op.kind = kind;
    op.mb = mb;
    op.stream = ir::default_stream(kind);
    return op;
  };
  auto hidden_recv = [&](int r, int j) {
    ir::Op recv = make(ir::OpKind::RECV, j);
    recv.payload = ir::OpKind::F;
    recv.peer = r - 1;
    recv.bytes = static_cast<std::int64_t>(cost.hidden_bytes(batch_tokens[static_cast<std::size_t>(j)]));
    return recv;
  };
  auto token_recv = [&](int b) {
    ir::Op recv = make(ir::OpKind::RECV, b);
    recv.payload = ir::OpKind::F;
    recv.peer = P - 1;
    recv.bytes = static_cast<std::int64_t>(4 * serve.batches[static_cast<std::size_t>(b)].items.size());
    return recv;
  };
  for (int r = 0; r < P; ++r) {
    auto& ops = plan.ranks[static_cast<std::size_t>(r)];
    const bool first = r == 0, last = r == P - 1;
    std::size_t next_recv = 0;  // batches whose token RECV rank 0 has placed
    int recv_hidden = -1;       // the RECV of the next batch's input
    if (!first && n > 0) {
      recv_hidden = static_cast<int>(ops.size());
      ops.push_back(hidden_recv(r, 0));
    }
    for (int j = 0; j < n; ++j) {
      const ServeBatch& batch = serve.batches[static_cast<std::size_t>(j)];
      ir::Op op = make(batch.has_prefill() ? ir::OpKind::PREFILL : ir::OpKind::DECODE, j);
      op.est_seconds = cost.batch_seconds(r, batch.items);
      op.flops = cost.batch_flops(r, batch.items);
      op.bytes = static_cast<std::int64_t>(std::llround(static_cast<double>(blocks_after[static_cast<std::size_t>(j)]) *
                                                        block_tokens * cost.kv_bytes_per_token(r)));
      if (recv_hidden >= 0) op.deps.push_back({r, recv_hidden});
      if (first && P > 1) {
        auto& u = uses[static_cast<std::size_t>(j)];
        std::sort(u.begin(), u.end());
        u.erase(std::unique(u.begin(), u.end()), u.end());
        for (int b : u) op.deps.push_back({0, recv_tok[static_cast<std::size_t>(b)]});
      }
      const int compute = static_cast<int>(ops.size());
      ops.push_back(op);
      if (P == 1) continue;
      ir::Op send = make(ir::OpKind::SEND, j);
      send.payload = ir::OpKind::F;
      send.peer = last ? 0 : r + 1;
      send.bytes = last ? static_cast<std::int64_t>(4 * batch.items.size())
                        : static_cast<std::int64_t>(cost.hidden_bytes(batch_tokens[static_cast<std::size_t>(j)]));
      send.deps.push_back({r, compute});
      send.batch = j;
      ops.push_back(send);
      recv_hidden = -1;
      if (!first && j + 1 < n) {
        ir::Op recv = hidden_recv(r, j + 1);
        recv.batch = j;
        recv_hidden = static_cast<int>(ops.size());
        ops.push_back(recv);
      }
      if (!first) continue;
      while (next_recv < static_cast<std::size_t>(n) && group[next_recv] <= j) {
        ir::Op recv = token_recv(static_cast<int>(next_recv));
        recv.batch = j;
        recv_tok[next_recv] = static_cast<int>(ops.size());
        ops.push_back(recv);
        ++next_recv;
      }
    }
    if (first && P > 1)
      for (; next_recv < static_cast<std::size_t>(n); ++next_recv) ops.push_back(token_recv(static_cast<int>(next_recv)));
  }
  plan.serve = std::move(serve);
  return plan;
}

}  // namespace tdpipe::planner
