// schedule_auto.cpp — `auto`: a memory-bounded, dependency-driven list scheduler over
// F, B and W of every (micro-batch, slice) — the zero-bubble paper's automatic
// scheduler (Qi et al., ICLR 2024, §3.1) made general to TD-Pipe's temporal slices.
//
// The DAG (one chunk per rank, virtual stage = rank; S = 1 is plain zero bubble):
//   F(mb, r, s) needs F(mb, r−1, s) (+ the link's time) and F(mb, r, s−1)
//   B(mb, r, s) needs B(mb, r+1, s) (+ the link's time), F(mb, r, s) and B(mb, r, s+1)
//   W(mb, r, s) needs B(mb, r, s)
// Each rank issues its F in (mb, slice) order and its B in (mb, reverse slice) order;
// W's wait in a queue in the order their B's ran. Memory: an F adds its activation
// bytes, a B frees what W does not need, a W the rest; an F is issued only while the
// rank's live bytes stay within its budget (parallel.memory_budget).
//
// Time is simulated with the plan's own op costs and link times. Ranks are visited in
// the order they become free (lowest rank on a tie); a rank that is free at time t:
//   1. runs the B or F that can start at t (both: B first, or F first — a policy knob);
//   2. else runs its oldest W when it fits before the next F/B can start (that start is
//      known, or bounded below by the producing rank's free time + op + link), when
//      memory blocks its F (a W frees memory), or always (the "greedy W" knob);
//   3. else idles until that next start.
// Inputs of an op that is not yet placed start no earlier than the producer's rank is
// free, so the bound in 2 is a true lower bound and the rank never idles past work it
// could have started. Once F and B are used up only W's remain, which run back to back:
// the paper's tail fill. The paper grid-searches two binary knobs of its heuristic; here
// every combination of (B-first / F-first) × (W when it fits, greedily, or trailing
// its B by r or 2r backward steps as ZB-H1 / ZB-H2 do) × (forward cap: the byte budget
// alone, 1F1B's, ZB-H2's) is built — on all cores — and the one with the shortest
// makespan is kept (the first in that order on a tie): deterministic.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <cmath>
#include <deque>
#include <limits>
#include <queue>
#include <string>
#include <vector>

#include "schedule_common.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::planner::detail {
namespace {

/// A policy that cannot place its next op under the memory budget.
struct Stuck : Error {
  using Error::Error;
};

constexpr double kNotYet = -1.0;
constexpr int kPasses = 2;
constexpr double kInf = std::numeric_limits<double>::infinity();

/// When a W may run: into a gap it fits (forecast), whenever nothing else can start
/// (greedy), or — the zero-bubble templates' rule — right after the B that comes
/// `r` (trail) or `2r` (trail2) backward steps after its own B on rank r.
enum class WMode { Fit, Greedy, Trail, Trail2 };
/// How many forwards a rank may run ahead of its backwards, besides the byte budget:
/// 1F1B's (p − r)·S, ZB-H2's (2(p − r) − 1)·S, or only the budget.
enum class Cap { OneF1B, TwoF1B, Budget };

struct Policy {
  bool backward_first = true;
  WMode w = WMode::Fit;
  Cap cap = Cap::Budget;
};

struct Schedule {
  std::vector<std::vector<ir::Op>> ranks;
  double makespan = 0;
  /// When each rank's k-th F and k-th B had its inputs ([rank·n + k]): the next pass's
  /// forecast of the gaps a W may fill.
  std::vector<double> f_inputs, b_inputs;
};

class AutoScheduler {
 public:
  AutoScheduler(int p, int m, int S, const AutoCosts& c, Policy policy, const Schedule* forecast)
      : p_(p), m_(m), S_(S), n_(m * S), c_(c), policy_(policy), forecast_(forecast),
        f_end_(static_cast<std::size_t>(p) * n_, kNotYet), b_end_(static_cast<std::size_t>(p) * n_, kNotYet),
        next_f_(p, 0), next_b_(p, 0), live_(p, 0.0), free_at_(p, 0.0), pending_w_(p) {
    for (int r = 0; r < p; ++r) {
      double work = 0;
      for (int s = 0; s < S; ++s) work += c.f_seconds[r][s] + c.b_seconds[r][s] + c.w_seconds[r][s];
      left_.push_back(work * m);
      const int ahead = policy.cap == Cap::OneF1B ? p - r : policy.cap == Cap::TwoF1B ? 2 * (p - r) - 1 : n_;
      caps_.push_back(std::max(ahead, 1) * S);
      trail_.push_back(policy.w == WMode::Trail ? r : policy.w == WMode::Trail2 ? 2 * r : -1);
    }
  }

  /// Schedules everything; or, once some rank's free time plus the compute it has left
  /// passes *cutoff (the best makespan found so far, which this run then cannot beat),
  /// stops with makespan = ∞.
  Schedule run(const std::atomic<double>* cutoff = nullptr) {
    Schedule out;
    out.ranks.resize(p_);
    for (auto& ops : out.ranks) ops.reserve(static_cast<std::size_t>(n_) * (c_.split_backward ? 3 : 2));
    out.f_inputs.assign(static_cast<std::size_t>(p_) * n_, 0.0);
    out.b_inputs.assign(static_cast<std::size_t>(p_) * n_, 0.0);
    out_ = &out;
    using Entry = std::pair<double, int>;  // (time the rank is free, rank): lowest first
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
    for (int r = 0; r < p_; ++r) heap.push({0.0, r});
    while (!heap.empty()) {
      const auto [t, r] = heap.top();
      heap.pop();
      if (t != free_at_[r]) continue;  // superseded
      const double next = step(r, t, out.ranks[r]);
      if (next < kInf) {
        // Rank r's remaining ops run one after another from `next`: a lower bound on the
        // makespan (with a margin over the rounding of the running sum).
        if (cutoff && next + left_[r] > cutoff->load(std::memory_order_relaxed) * (1 + 1e-9)) {
          out.makespan = kInf;
          return out;
        }
        free_at_[r] = next;
        heap.push({next, r});
      }
    }
    for (int r = 0; r < p_; ++r)
      if (next_b_[r] < n_ || !pending_w_[r].empty()) throw stuck();
    out.makespan = *std::max_element(free_at_.begin(), free_at_.end());
    return out;
  }

 private:
  std::size_t at(int r, int k) const { return static_cast<std::size_t>(r) * n_ + k; }
  // k-th F is (mb, s) = (k / S, k % S); k-th B is (k / S, S − 1 − k % S); table index mb·S + s.
  int b_index(int k) const { return (k / S_) * S_ + (S_ - 1 - k % S_); }
  double f_dur(int r, int s) const { return c_.f_seconds[r][s]; }
  double b_dur(int r, int s) const {
    return c_.split_backward ? c_.b_seconds[r][s] : c_.b_seconds[r][s] + c_.w_seconds[r][s];
  }

  /// Earliest start of an input-bound op: exact when every input is placed (`known`),
  /// else a lower bound from the producers' free times.
  struct Ready {
    double time = kInf;
    bool known = false;
  };

  Ready f_ready(int r, double t) const {
    const int k = next_f_[r];
    Ready out{t, true};
    if (r > 0) {
      const double e = f_end_[at(r - 1, k)];
      if (e == kNotYet) {
        out.known = false;
        out.time = std::max(out.time, free_at_[r - 1] + f_dur(r - 1, k % S_) + c_.p2p_seconds[r - 1]);
      } else {
        out.time = std::max(out.time, e + c_.p2p_seconds[r - 1]);
      }
    }
    return out;  // F(mb, r, s−1) is this rank's previous F: already placed
  }

  Ready b_ready(int r, double t) const {
    const int idx = b_index(next_b_[r]);
    const int s = idx % S_;
    Ready out{t, true};
    const double own_f = f_end_[at(r, idx)];
    if (own_f == kNotYet) {
      out.known = false;
      out.time = std::max(out.time, t + f_dur(r, s));
    } else {
      out.time = std::max(out.time, own_f);
    }
    if (r + 1 < p_) {
      const double e = b_end_[at(r + 1, idx)];
      if (e == kNotYet) {
        out.known = false;
        out.time = std::max(out.time, free_at_[r + 1] + b_dur(r + 1, s) + c_.p2p_seconds[r]);
      } else {
        out.time = std::max(out.time, e + c_.p2p_seconds[r]);
      }
    }
    return out;  // B(mb, r, s+1) is this rank's previous B: already placed
  }

  static bool now(const Ready& x, double t) { return x.known && x.time <= t; }

  /// A not-yet-known start, sharpened by the previous pass's input times when there is one.
  double forecast(const Ready& x, bool backward, int r) const {
    if (x.known || !forecast_) return x.time;
    const auto& in = backward ? forecast_->b_inputs : forecast_->f_inputs;
    return std::max(x.time, in[at(r, backward ? next_b_[r] : next_f_[r])]);
  }

  /// Places at most one op on rank r, free at t; returns when the rank is next free
  /// (kInf: nothing left).
  double step(int r, double t, std::vector<ir::Op>& ops) {
    const bool has_f = next_f_[r] < n_;
    const bool f_bytes_fit =
        has_f && live_[r] + c_.f_bytes[r][next_f_[r] % S_] <= c_.budget_bytes[r] * (1 + 1e-12);
    const bool f_fits = f_bytes_fit && next_f_[r] - next_b_[r] < caps_[r];
    // The templates' W: due once `trail` more B's ran after its own (in slice units).
    if (trail_[r] >= 0 && static_cast<int>(pending_w_[r].size()) > trail_[r] * S_) return place_w(r, t, ops);
    const bool has_b = next_b_[r] < n_;
    const Ready f = f_fits ? f_ready(r, t) : Ready{};
    const Ready b = has_b ? b_ready(r, t) : Ready{};
    const bool f_now = f_fits && now(f, t), b_now = has_b && now(b, t);
    if (b_now && (!f_now || policy_.backward_first)) return place_b(r, t, ops);
    if (f_now) return place_f(r, t, ops);
    const double next = std::min(f_fits ? f.time : kInf, has_b ? b.time : kInf);
    if (!pending_w_[r].empty()) {
      const int idx = pending_w_[r].front();
      const double w = c_.w_seconds[r][idx % S_];
      const double expected = std::min(f_fits ? forecast(f, false, r) : kInf, has_b ? forecast(b, true, r) : kInf);
      const bool gap = policy_.w == WMode::Fit ? expected >= t + w : !(next < kInf);  // trail: only the tail
      if (policy_.w == WMode::Greedy || gap) return place_w(r, t, ops);
      if (has_f && !f_bytes_fit) return place_w(r, t, ops);  // memory blocks the F: a W frees some
    }
    if (!(next < kInf)) return kInf;  // nothing left here, or stuck (run() reports it)
    return next > t ? next : std::nextafter(t, kInf);
  }

  double place_f(int r, double t, std::vector<ir::Op>& ops) {
    const int k = next_f_[r]++;
    const int s = k % S_;
    live_[r] += c_.f_bytes[r][s];
    left_[r] -= f_dur(r, s);
    out_->f_inputs[at(r, k)] = r > 0 ? f_end_[at(r - 1, k)] + c_.p2p_seconds[r - 1] : 0.0;
    f_end_[at(r, k)] = t + f_dur(r, s);
    ops.push_back(compute_op(ir::OpKind::F, k / S_, 0, s));
    return f_end_[at(r, k)];
  }

  double place_b(int r, double t, std::vector<ir::Op>& ops) {
    const int k = next_b_[r]++;
    const int idx = b_index(k);
    const int s = idx % S_;
    out_->b_inputs[at(r, k)] =
        std::max(f_end_[at(r, idx)], r + 1 < p_ ? b_end_[at(r + 1, idx)] + c_.p2p_seconds[r] : 0.0);
    b_end_[at(r, idx)] = t + b_dur(r, s);
    left_[r] -= b_dur(r, s);
    if (c_.split_backward) {
      live_[r] += c_.b_bytes[r][s];
      pending_w_[r].push_back(idx);
      ops.push_back(compute_op(ir::OpKind::B, idx / S_, 0, s));
    } else {
      live_[r] += c_.b_bytes[r][s] + c_.w_bytes[r][s];
      ops.push_back(compute_op(ir::OpKind::BW, idx / S_, 0, s));
    }
    return b_end_[at(r, idx)];
  }

  double place_w(int r, double t, std::vector<ir::Op>& ops) {
    const int idx = pending_w_[r].front();
    pending_w_[r].pop_front();
    const int s = idx % S_;
    live_[r] += c_.w_bytes[r][s];
    left_[r] -= c_.w_seconds[r][s];
    ops.push_back(compute_op(ir::OpKind::W, idx / S_, 0, s));
    return t + c_.w_seconds[r][s];
  }

  Stuck stuck() const {
    std::string where;
    for (int r = 0; r < p_; ++r)
      if (next_b_[r] < n_)
        where += fmt::format("; rank {}: {:.4g} of {:.4g} bytes live, {} of {} F and {} B placed", r, live_[r],
                             c_.budget_bytes[r], next_f_[r], n_, next_b_[r]);
    return Stuck(fmt::format("schedule auto: no op can be placed under the memory budget (p = {}, m = {}, S = {}){}",
                             p_, m_, S_, where));
  }

  int p_, m_, S_, n_;
  const AutoCosts& c_;
  Policy policy_;
  const Schedule* forecast_;
  Schedule* out_ = nullptr;
  std::vector<double> f_end_, b_end_;
  std::vector<int> next_f_, next_b_, caps_, trail_;
  std::vector<double> live_, free_at_;
  std::vector<double> left_;  ///< per rank: seconds of compute not yet placed
  std::vector<std::deque<int>> pending_w_;
};

/// The costs to schedule with: the given table, or unit costs and a budget of p
/// micro-batches; checked for shape, finiteness and a budget that holds a micro-batch.
AutoCosts checked_costs(const ScheduleParams& params) {
  const int p = params.stages, S = params.slices;
  AutoCosts c = params.auto_costs;
  auto table = [&](double v) { return std::vector<std::vector<double>>(p, std::vector<double>(S, v)); };
  if (c.f_seconds.empty()) {
    const bool split = c.split_backward;
    c = AutoCosts{};
    c.split_backward = split;
    c.f_seconds = c.b_seconds = c.w_seconds = table(1.0);
    c.f_bytes = table(1.0);
    c.b_bytes = table(-1.0);
    c.w_bytes = table(0.0);
    c.p2p_seconds.assign(static_cast<std::size_t>(std::max(p - 1, 0)), 0.0);
    c.budget_bytes.assign(p, double(std::min(p, params.microbatches)) * S);
  }
  auto check_table = [&](const std::vector<std::vector<double>>& t, const char* name, bool bytes) {
    bool ok = static_cast<int>(t.size()) == p;
    for (const auto& row : t) ok = ok && static_cast<int>(row.size()) == S;
    if (!ok) throw Error(fmt::format("schedule auto: {} must have p = {} rows of S = {} entries", name, p, S));
    for (int r = 0; r < p; ++r)
      for (int s = 0; s < S; ++s)
        if (!std::isfinite(t[r][s]) || (!bytes && t[r][s] < 0))
          throw Error(fmt::format("schedule auto: {}[{}][{}] = {}: expected a finite {}", name, r, s, t[r][s],
                                  bytes ? "number of bytes" : "time ≥ 0"));
  };
  check_table(c.f_seconds, "f_seconds", false);
  check_table(c.b_seconds, "b_seconds", false);
  check_table(c.w_seconds, "w_seconds", false);
  check_table(c.f_bytes, "f_bytes", true);
  check_table(c.b_bytes, "b_bytes", true);
  check_table(c.w_bytes, "w_bytes", true);
  if (static_cast<int>(c.p2p_seconds.size()) != std::max(p - 1, 0) || static_cast<int>(c.budget_bytes.size()) != p)
    throw Error(fmt::format("schedule auto: expected {} link times and {} budgets, got {} and {}", p - 1, p,
                            c.p2p_seconds.size(), c.budget_bytes.size()));
  for (int r = 0; r < p; ++r) {
    double one = 0;  // a micro-batch's slices are all live before its last slice's B
    for (int s = 0; s < S; ++s) one += c.f_bytes[r][s];
    if (c.budget_bytes[r] < one * (1 - 1e-12))
      throw Error(fmt::format("schedule auto: rank {}'s memory budget ({:.4g} bytes) holds less than one "
                              "micro-batch's activations ({:.4g} bytes over S = {} slices); expected a larger "
                              "parallel.memory_budget",
                              r, c.budget_bytes[r], one, S));
  }
  return c;
}

}  // namespace

ir::Plan make_auto(const ScheduleParams& params) {
  const int p = params.stages, m = params.microbatches, S = params.slices;
  const AutoCosts costs = checked_costs(params);
  std::vector<Policy> policies;
  for (Cap cap : {Cap::Budget, Cap::OneF1B, Cap::TwoF1B})
    for (bool backward_first : {true, false})
      for (WMode w : {WMode::Fit, WMode::Greedy, WMode::Trail, WMode::Trail2}) {
        if (!costs.split_backward && w != WMode::Fit) continue;  // no W to place
        policies.push_back({backward_first, w, cap});
      }
  // Each policy's passes are independent of the others': build them on the machine's
  // cores, each worker keeping its best, then keep the shortest, the earliest policy on
  // a tie (the same choice on any machine).
  struct Best {
    std::size_t policy = 0;
    Schedule schedule;
  };
  auto better = [](const Best& a, const Best& b) {
    return a.schedule.makespan < b.schedule.makespan ||
           (a.schedule.makespan == b.schedule.makespan && a.policy < b.policy);
  };
  // The least makespan any worker has built so far. A policy's last pass stops once it
  // runs past it (it cannot be kept); earlier passes run whole, since the next pass reads
  // their times. Which runs stop depends on thread timing, what is kept does not: a
  // stopped run is longer than a kept one.
  std::atomic<double> cutoff{kInf};
  auto lower_cutoff = [&cutoff](double makespan) {
    double seen = cutoff.load();
    while (makespan < seen && !cutoff.compare_exchange_weak(seen, makespan)) {
    }
  };
  auto build = [&](std::size_t i, Best& best) {
    const Policy& policy = policies[i];
    // Pass 0 forecasts gaps by lower bounds only; each further pass by the input times
    // the previous pass saw, so a W goes where the last pass had a gap it fits.
    Schedule previous;
    for (int pass = 0; pass < kPasses; ++pass) {
      const bool last = pass + 1 == kPasses || policy.w != WMode::Fit;  // only a fitted W reads forecasts
      Best candidate{i, AutoScheduler(p, m, S, costs, policy, pass ? &previous : nullptr).run(last ? &cutoff : nullptr)};
      lower_cutoff(candidate.schedule.makespan);
      if (better(candidate, best)) {
        if (last) {
          best = std::move(candidate);
        } else {
          best.policy = candidate.policy;
          best.schedule.ranks = candidate.schedule.ranks;
          best.schedule.makespan = candidate.schedule.makespan;
        }
      }
      if (last) break;
      previous = std::move(candidate.schedule);
    }
  };
  const std::size_t workers =
      std::min<std::size_t>(policies.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<Best> bests(workers);
  for (auto& b : bests) b.schedule.makespan = kInf;
  std::atomic<std::size_t> next{0};
  // Per policy, what its build threw. A policy stuck under the budget (Stuck) is
  // only a policy that does not fit: the others may; anything else fails the plan. The
  // error reported is the earliest policy's, the same on any machine.
  std::vector<std::exception_ptr> errors(policies.size());
  std::vector<char> stuck(policies.size(), 0);
  auto worker = [&](std::size_t w) {
    for (std::size_t i; (i = next++) < policies.size();) {
      try {
        build(i, bests[w]);
      } catch (const Stuck&) {
        errors[i] = std::current_exception();
        stuck[i] = 1;
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> threads;
  for (std::size_t w = 1; w < workers; ++w) threads.emplace_back(worker, w);
  worker(0);
  for (auto& t : threads) t.join();
  Best* best = &bests[0];
  for (auto& b : bests)
    if (better(b, *best)) best = &b;
  for (std::size_t i = 0; i < policies.size(); ++i)
    if (errors[i] && (!stuck[i] || !(best->schedule.makespan < kInf))) std::rethrow_exception(errors[i]);
  ir::Plan plan = plan_skeleton("auto", p, m, 1, S);
  plan.ranks = std::move(best->schedule.ranks);
  return plan;
}

}  // namespace tdpipe::planner::detail
