// schedule_tdpipe.cpp — TD-Pipe training: every micro-batch cut into S temporal slices,
// ordered by a deterministic, dependency-driven list scheduler over the slice DAG (the
// seed's "dynamic dependency analyser", made reproducible).
//
// The DAG (one chunk per rank, virtual stage = rank):
//   F(mb, r, s)  needs F(mb, r−1, s) and F(mb, r, s−1)
//   BW(mb, r, s) needs BW(mb, r+1, s), F(mb, r, s) and BW(mb, r, s+1)
// Each rank issues its forwards in (mb, slice) order and its fused backwards in
// (mb, reverse slice) order, so the scheduler only decides how the two streams
// interleave. It simulates time with op costs F(s) = c_s and BW(s) = 2·c_s (c =
// params.slice_costs, equal if empty; no communication cost) and repeats:
//
//   1. Each rank's candidate: its next BW; and its next F unless the rank already holds
//      `cap` slice activations (F done, BW not yet). The cap is 1F1B's: (p−r)·S on rank
//      r, or params.max_inflight on every rank when > 0 (at least S).
//   2. A candidate can start at max(rank free, its inputs done); a rank takes the one
//      that can start first, the backward on a tie (older micro-batch, frees memory).
//   3. Commit, over all ranks, the candidate that starts first (lowest rank on a tie).
//
// Candidates whose inputs are not yet scheduled would start later than any scheduled
// one (costs are positive), so committing in start order is exact list scheduling.
// With S = 1 this is exactly 1F1B: a rank's next backward depends (through the next
// rank) on its own next forward, so the forward always wins until the cap stops it.
// Bubble with equal slices: (p−1)(F+BW)/S per rank instead of 1F1B's (p−1)(F+BW).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <string>
#include <vector>

#include "schedule_common.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::planner::detail {
namespace {

constexpr double kUnset = -1.0;
constexpr double kNever = std::numeric_limits<double>::infinity();

struct Candidate {
  double start = kNever;
  bool backward = false;
};

class SliceListScheduler {
 public:
  SliceListScheduler(int p, int m, int S, std::vector<double> costs, std::vector<int> caps)
      : p_(p), m_(m), S_(S), costs_(std::move(costs)), caps_(std::move(caps)),
        per_rank_(static_cast<std::size_t>(m) * S),
        f_end_(static_cast<std::size_t>(p) * per_rank_, kUnset),
        b_end_(static_cast<std::size_t>(p) * per_rank_, kUnset),
        next_f_(p, 0), next_b_(p, 0), inflight_(p, 0), free_at_(p, 0.0), version_(p, 0) {}

  std::vector<std::vector<ir::Op>> run() {
    std::vector<std::vector<ir::Op>> ranks(p_);
    for (auto& ops : ranks) ops.reserve(2 * per_rank_);
    for (int r = 0; r < p_; ++r) push(r);
    std::size_t left = 2 * per_rank_ * static_cast<std::size_t>(p_);
    while (left > 0) {
      if (heap_.empty()) throw deadlock();
      const Entry e = heap_.top();
      heap_.pop();
      if (e.version != version_[e.rank]) continue;  // stale: the rank's state changed
      commit(e.rank, e.backward, e.start, ranks[e.rank]);
      --left;
      // Only this rank and the consumer of what it produced can change their candidate:
      // a forward feeds rank r+1's next F, a backward rank r−1's next BW.
      push(e.rank);
      const int consumer = e.backward ? e.rank - 1 : e.rank + 1;
      if (consumer >= 0 && consumer < p_) push(consumer);
    }
    return ranks;
  }

 private:
  struct Entry {
    double start;
    int rank;
    bool backward;
    unsigned version;
    bool operator>(const Entry& o) const {
      return start != o.start ? start > o.start : rank > o.rank;
    }
  };

  std::size_t idx(int rank, int mb, int slice) const {
    return static_cast<std::size_t>(rank) * per_rank_ + static_cast<std::size_t>(mb) * S_ +
           slice;
  }
  // Forwards in (mb, slice) order, backwards in (mb, reverse slice) order.
  int f_mb(int k) const { return k / S_; }
  int f_slice(int k) const { return k % S_; }
  int b_mb(int k) const { return k / S_; }
  int b_slice(int k) const { return S_ - 1 - k % S_; }

  Candidate candidate(int r) const {
    Candidate best;
    if (next_f_[r] < static_cast<int>(per_rank_) && inflight_[r] < caps_[r]) {
      const int mb = f_mb(next_f_[r]), s = f_slice(next_f_[r]);
      double ready = free_at_[r];
      if (r > 0) ready = std::max(ready, done(f_end_[idx(r - 1, mb, s)]));
      best = {ready, false};  // slice s−1 on this rank is earlier in the same stream
    }
    if (next_b_[r] < static_cast<int>(per_rank_)) {
      const int mb = b_mb(next_b_[r]), s = b_slice(next_b_[r]);
      double ready = std::max(free_at_[r], done(f_end_[idx(r, mb, s)]));
      if (r + 1 < p_) ready = std::max(ready, done(b_end_[idx(r + 1, mb, s)]));
      if (ready <= best.start && ready < kNever) best = {ready, true};
    }
    return best;
  }

  static double done(double end) { return end == kUnset ? kNever : end; }

  void push(int r) {
    ++version_[r];
    const Candidate c = candidate(r);
    if (c.start < kNever) heap_.push({c.start, r, c.backward, version_[r]});
  }

  void commit(int r, bool backward, double start, std::vector<ir::Op>& ops) {
    if (backward) {
      const int mb = b_mb(next_b_[r]), s = b_slice(next_b_[r]);
      free_at_[r] = start + 2.0 * costs_[s];
      b_end_[idx(r, mb, s)] = free_at_[r];
      ++next_b_[r];
      --inflight_[r];
      ops.push_back(compute_op(ir::OpKind::BW, mb, 0, s));
    } else {
      const int mb = f_mb(next_f_[r]), s = f_slice(next_f_[r]);
      free_at_[r] = start + costs_[s];
      f_end_[idx(r, mb, s)] = free_at_[r];
      ++next_f_[r];
      ++inflight_[r];
      ops.push_back(compute_op(ir::OpKind::F, mb, 0, s));
    }
  }

  Error deadlock() const {
    std::string where;
    for (int r = 0; r < p_; ++r) {
      if (next_b_[r] >= static_cast<int>(per_rank_)) continue;
      where += fmt::format("; rank {} holds {} of cap {}, next F{}:s{}, next BW{}:s{}", r,
                           inflight_[r], caps_[r], f_mb(next_f_[r]), f_slice(next_f_[r]),
                           b_mb(next_b_[r]), b_slice(next_b_[r]));
    }
    return Error(fmt::format(
        "schedule tdpipe: the list scheduler cannot place another op under the activation "
        "cap (p = {}, m = {}, S = {}){}: expected caps that never grow along the pipeline "
        "and hold at least one micro-batch (S slices)",
        p_, m_, S_, where));
  }

  int p_, m_, S_;
  std::vector<double> costs_;
  std::vector<int> caps_;
  std::size_t per_rank_;
  std::vector<double> f_end_, b_end_;
  std::vector<int> next_f_, next_b_, inflight_;
  std::vector<double> free_at_;
  std::vector<unsigned> version_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap_;
};

}  // namespace

ir::Plan make_tdpipe(const ScheduleParams& params) {
  const int p = params.stages, m = params.microbatches, S = params.slices;

  std::vector<double> costs = params.slice_costs;
  if (costs.empty()) costs.assign(S, 1.0);
  if (static_cast<int>(costs.size()) != S)
    throw Error(fmt::format(
        "schedule tdpipe: slice_costs has {} entries: expected one per slice (S = {}) or none",
        costs.size(), S));
  for (int s = 0; s < S; ++s)
    if (!(costs[s] > 0) || !std::isfinite(costs[s]))
      throw Error(fmt::format(
          "schedule tdpipe: slice_costs[{}] = {}: expected a finite cost greater than 0", s,
          costs[s]));
  if (params.max_inflight < 0 || (params.max_inflight > 0 && params.max_inflight < S))
    throw Error(fmt::format(
        "schedule tdpipe: max_inflight = {}: expected 0 (1F1B's cap, (p−r)·S slices on rank "
        "r) or at least S = {} slices (one whole micro-batch per rank)",
        params.max_inflight, S));

  std::vector<int> caps(p);
  for (int r = 0; r < p; ++r) caps[r] = params.max_inflight > 0 ? params.max_inflight : (p - r) * S;

  ir::Plan plan = plan_skeleton("tdpipe", p, m, 1, S);
  plan.ranks = SliceListScheduler(p, m, S, std::move(costs), std::move(caps)).run();
  return plan;
}

}  // namespace tdpipe::planner::detail
