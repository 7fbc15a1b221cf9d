// serving_tdpipe.cpp — the TD-Pipe controller (Zhang et al., ICPP 2025; the repo's
// core/scheduler.py as REFERENCES.md summarises it): prefill windows bounded by the
// projected KV peak, decode windows of work-stolen batches, and the switch rule.
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "serving_scheduler.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/planner/serving.hpp"

namespace tdpipe::planner {
namespace detail {
namespace {

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

/// Seconds of the slowest stage for `items`.
double stage_seconds(const ServingCost& cost, const std::vector<ServeItem>& items) {
  double worst = 0;
  for (int r = 0; r < cost.stages(); ++r) worst = std::max(worst, cost.batch_seconds(r, items));
  return worst;
}

/// stage_seconds of a batch of `n` decode tokens at context `ctx`.
double decode_seconds(const ServingCost& cost, int n, int ctx) {
  return stage_seconds(cost, std::vector<ServeItem>(static_cast<std::size_t>(std::max(1, n)),
                                                    ServeItem{0, std::max(0, ctx - 1), 1}));
}

}  // namespace

void schedule_tdpipe(Scheduler& s, const ir::ServingConfig& cfg, const ServingCost& cost, int P) {
  const double limit = cfg.kv_fraction * static_cast<double>(s.capacity());
  int phase = 0;
  auto projection_of_running = [&] {
    KvProjection proj(cfg.block_tokens);
    for (int r : s.running()) proj.add(s.held(r), s.request(r).output - s.done(r));
    return proj;
  };
  // At most P · max_batch_requests run at once: every decode round then serves each
  // running request once (P batches of at most max_batch_requests), so requests do
  // decode in lockstep, as the KV projection assumes.
  const int max_running = P * cfg.max_batch_requests;
  // Prefill batches the projection admits from the front of the queue (without taking
  // them when `commit` is false: the switch rule's candidates).
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
    // the requests the round has not served (⌊N/P⌋, +1 for the first N mod P batches:
    // within one of each other while all come back; fewer when a finished request left
    // its batch short, the round's last batch then taking the rest); among the requests
    // whose token is back it picks those that give it its share of the round's cached
    // tokens, since a decode step's time follows the KV it reads as much as its count.
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

}  // namespace detail

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

}  // namespace tdpipe::planner
