// replay.cpp — the shared event engine: a plan's op order replayed with fixed
// durations and rendezvous SEND/RECV (see replay.hpp for the semantics).
//
// How it is fast: every op gets a flat global index; data dependencies and
// SEND/RECV partners are array look-ups (plan_index.hpp); each (rank, stream)
// is a cursor over its ops, advanced as far as it can go, and a blocked stream
// parks on the one op it waits for and is woken when that op completes. No op is
// scanned while nothing changed for it, so the cost is linear in ops + deps.
#include "tdpipe/ir/replay.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "plan_index.hpp"
#include "prefault.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/plan_io.hpp"

namespace tdpipe::ir {
namespace {

using detail::PlanIndex;
constexpr int kStreams = kStreamCount;  // Compute, P2P, DP, Copy
constexpr std::int64_t kNotDone = -1;
constexpr std::uint32_t kLagBit = 1u << 31;

bool is_comm(OpKind kind) { return detail::p2p_kind(kind) || detail::collective_kind(kind); }

class Engine {
  using Slot = detail::Slot;
  static constexpr Slot kSlots = detail::kSlots;

 public:
  Engine(const Plan& plan, const DurationFn& duration, const detail::PlanIndex* shared)
      : plan_(plan),
        duration_(duration),
        own_ix_(shared ? detail::PlanIndex{} : detail::build_index(plan)),
        ix_(shared ? *shared : own_ix_) {
    n_ = ix_.total();
    precompute();
    build_streams();
  }

  /// Runs every stream as far as it goes; throws on a deadlock.
  void simulate() {
    for (int s = 0; s < static_cast<int>(pos_.size()); ++s)
      if (stream_begin_[s] < stream_begin_[s + 1]) push(s);
    while (!work_.empty()) {
      const int s = work_.back();
      work_.pop_back();
      queued_[static_cast<std::size_t>(s)] = 0;
      advance(s);
    }
    for (int s = 0; s < static_cast<int>(pos_.size()); ++s)
      if (stream_begin_[s] + pos_[static_cast<std::size_t>(s)] < stream_begin_[s + 1])
        throw Error(deadlock_message());
  }

  /// Timing by global index (moved out: the engine is spent).
  std::vector<OpTiming> take_timing() { return std::move(timing_); }

  ReplayResult run(bool want_timing = true) {
    simulate();
    ReplayResult result;
    for (const OpTiming& t : timing_) result.makespan_ns = std::max(result.makespan_ns, t.end_ns);
    if (!want_timing) return result;
    result.timing.resize(static_cast<std::size_t>(plan_.num_ranks()));
    for (int r = 0; r < plan_.num_ranks(); ++r) {
      const auto b = timing_.begin() + ix_.offset[static_cast<std::size_t>(r)];
      const auto e = timing_.begin() + ix_.offset[static_cast<std::size_t>(r) + 1];
      result.timing[static_cast<std::size_t>(r)].assign(b, e);
    }
    return result;
  }

 private:
  const Op& op_at(int rank, int local) const {
    return plan_.ranks[static_cast<std::size_t>(rank)][static_cast<std::size_t>(local)];
  }

  /// (rank, stream) cursors over the ops, from the stream ids precompute() noted.
  void build_streams() {
    const int ranks = plan_.num_ranks();
    stream_begin_.assign(static_cast<std::size_t>(ranks) * kStreams + 1, 0);
    for (int r = 0; r < ranks; ++r)
      for (int g = ix_.offset[static_cast<std::size_t>(r)]; g < ix_.offset[static_cast<std::size_t>(r) + 1]; ++g)
        ++stream_begin_[static_cast<std::size_t>(r) * kStreams + stream_of_[static_cast<std::size_t>(g)] + 1];
    for (std::size_t s = 1; s < stream_begin_.size(); ++s) stream_begin_[s] += stream_begin_[s - 1];
    detail::resize_prefaulted(stream_ops_, static_cast<std::size_t>(n_));
    std::vector<int> fill(stream_begin_.begin(), stream_begin_.end() - 1);
    for (int r = 0; r < ranks; ++r)
      for (int g = ix_.offset[static_cast<std::size_t>(r)]; g < ix_.offset[static_cast<std::size_t>(r) + 1]; ++g)
        stream_ops_[static_cast<std::size_t>(
            fill[static_cast<std::size_t>(r) * kStreams + stream_of_[static_cast<std::size_t>(g)]]++)] = g;
    stream_of_ = {};
    const std::size_t streams = static_cast<std::size_t>(ranks) * kStreams;
    pos_.assign(streams, 0);
    time_.assign(streams, 0);
    wait_next_.assign(streams, -1);
    queued_.assign(streams, 0);
  }

  static int stream_index(const Op& op) {
    const int s = static_cast<int>(op.stream);
    return s < kStreams ? s : 0;
  }

  void precompute() {
    const std::size_t n = static_cast<std::size_t>(n_);
    detail::assign_prefaulted(timing_, n, OpTiming{kNotDone, kNotDone});
    detail::assign_prefaulted(dur_, n, std::int64_t{0});
    detail::assign_prefaulted(wait_head_, n, std::int32_t{-1});
    detail::resize_prefaulted(kind_, n);
    detail::resize_prefaulted(stream_of_, n);
    detail::resize_prefaulted(dep_begin_, n + 1);
    deps_.reserve(n * 2);  // an estimate: not prefaulted, pages it never uses stay unmapped
    // Weight gates (is_weight_gate) exist only in plans with LOADs: the arrays then.
    for (const auto& ops : plan_.ranks)
      for (const Op& op : ops)
        if (op.kind == OpKind::LOAD) gated_plan_ = true;
    if (gated_plan_) {
      detail::resize_prefaulted(gate_begin_, n + 1);
      detail::assign_prefaulted(seg_next_, n, std::int32_t{0});
      detail::assign_prefaulted(seg_time_, n, std::int64_t{kNotDone});
    }
    for (int r = 0; r < plan_.num_ranks(); ++r) {
      const auto& ops = plan_.ranks[static_cast<std::size_t>(r)];
      const int base = ix_.offset[static_cast<std::size_t>(r)];
      for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
        const Op& op = ops[static_cast<std::size_t>(i)];
        const int g = base + i;
        kind_[static_cast<std::size_t>(g)] = op.kind;
        stream_of_[static_cast<std::size_t>(g)] = static_cast<std::uint8_t>(stream_index(op));
        if (is_comm(op.kind)) {
          // Only comm ops have a partner or a batch (a compute-only plan has neither array).
          if (batch_.empty()) {
            detail::assign_prefaulted(batch_, n, std::int32_t{-1});
            detail::assign_prefaulted(partner_, n, std::int32_t{-1});
          }
          batch_[static_cast<std::size_t>(g)] = op.batch;
        }
        dep_begin_[static_cast<std::size_t>(g)] = static_cast<std::uint32_t>(deps_.size());
        if (gated_plan_) gate_begin_[static_cast<std::size_t>(g)] = static_cast<std::uint32_t>(gates_.size());
        collect_deps(op, r);
        if (op.ready_after < 1.0f && !op.deps.empty() && dep_begin_[static_cast<std::size_t>(g)] < deps_.size()) {
          if (ready_after_.empty()) detail::assign_prefaulted(ready_after_, n, 1.0f);
          ready_after_[static_cast<std::size_t>(g)] = std::max(0.0f, op.ready_after);
        }
        // A RECV's transfer time is its SEND's: the function is asked once per pair.
        if (op.kind != OpKind::RECV)
          dur_[static_cast<std::size_t>(g)] = std::max<std::int64_t>(0, duration_(op, r));
        if (detail::p2p_kind(op.kind)) {
          const auto [slot, key] = detail::slot_and_key(ix_, op, r);
          if (key < 0) continue;
          Slot other = kSlots;
          if (slot == detail::kSlotSendF) other = detail::kSlotRecvF;
          if (slot == detail::kSlotSendB) other = detail::kSlotRecvB;
          if (slot == detail::kSlotRecvF) other = detail::kSlotSendF;
          if (slot == detail::kSlotRecvB) other = detail::kSlotSendB;
          // Only the op filed in the table pairs; a duplicate stays unmatched.
          if (other != kSlots && ix_.cell(slot, key) == g) partner_[static_cast<std::size_t>(g)] = ix_.cell(other, key);
        }
      }
    }
    dep_begin_[static_cast<std::size_t>(n_)] = static_cast<std::uint32_t>(deps_.size());
    if (gated_plan_) {
      gate_begin_[static_cast<std::size_t>(n_)] = static_cast<std::uint32_t>(gates_.size());
      seg_end_.assign(gates_.size(), kNotDone);
    }
  }

  int gate_count(int g) const {
    if (!gated_plan_) return 0;
    return static_cast<int>(gate_begin_[static_cast<std::size_t>(g) + 1] - gate_begin_[static_cast<std::size_t>(g)]);
  }
  /// p2p latency of a cross-rank dependency with no SEND/RECV in the plan: the
  /// duration of a synthetic SEND of the producer's payload (zero-bubble's T_comm).
  /// Computed once per producer while collecting deps (a producer has one consumer
  /// rank: the rank of the next virtual stage for F, of the previous one for B), so
  /// the run loop reads an array and never looks an op up.
  void note_cross_lag(int producer, int producer_rank, int consumer_rank) {
    if (lag_.empty()) detail::assign_prefaulted(lag_, static_cast<std::size_t>(n_), std::int64_t{kNotDone});
    auto& cell = lag_[static_cast<std::size_t>(producer)];
    if (cell != kNotDone) return;
    const Op& prod = op_at(producer_rank, producer - ix_.offset[static_cast<std::size_t>(producer_rank)]);
    Op send;
    send.kind = OpKind::SEND;
    send.payload = prod.kind == OpKind::F ? OpKind::F : OpKind::B;
    send.mb = prod.mb;
    send.chunk = prod.chunk;
    send.slice = prod.slice;
    send.peer = consumer_rank;
    send.stream = Stream::P2P;
    cell = std::max<std::int64_t>(0, duration_(send, producer_rank));
  }

  bool valid_global(const OpRef& ref, int& g) const {
    if (ref.rank < 0 || ref.rank >= plan_.num_ranks()) return false;
    if (ref.index < 0 ||
        ref.index >= static_cast<int>(plan_.ranks[static_cast<std::size_t>(ref.rank)].size()))
      return false;
    g = ix_.offset[static_cast<std::size_t>(ref.rank)] + ref.index;
    return true;
  }

  /// Appends op's dependencies to deps_: explicit deps, then data dependencies
  /// (a cross-rank one through the RECV on this rank when there is one, else
  /// directly with the synthetic SEND's lag: bit 31 set), then a SEND's producer.
  void collect_deps(const Op& op, int rank) {
    for (const OpRef& ref : op.deps) {
      int d = 0;
      if (!valid_global(ref, d)) continue;
      // A compute op's LOADs gate its segments instead of its start.
      if (gated_plan_ && ref.rank == rank && is_weight_gate(op.kind, op_at(ref.rank, ref.index).kind))
        gates_.push_back(static_cast<std::uint32_t>(d));
      else
        deps_.push_back(static_cast<std::uint32_t>(d));
    }
    if (is_chunk_work(op.kind)) {
      const int lo = ix_.offset[static_cast<std::size_t>(rank)];
      const int hi = ix_.offset[static_cast<std::size_t>(rank) + 1];
      detail::for_each_data_dep(ix_, op, rank, [&](int prod, Slot prod_slot, int key, bool cross) {
        if (!cross) {
          deps_.push_back(static_cast<std::uint32_t>(prod));
          return;
        }
        // A compute-only plan has no RECVs: the dependency then carries the lag itself.
        int recv = ix_.cell(prod_slot == detail::kSlotF ? detail::kSlotRecvF : detail::kSlotRecvB, key);
        if (recv < lo || recv >= hi) recv = -1;
        if (recv >= 0) {
          deps_.push_back(static_cast<std::uint32_t>(recv));
          return;
        }
        note_cross_lag(prod, ix_.stages.rank_of[static_cast<std::size_t>(ix_.stage_of_key(key))], rank);
        deps_.push_back(static_cast<std::uint32_t>(prod) | kLagBit);
      });
    } else if (op.kind == OpKind::SEND) {
      // A SEND carries its producer's output: it cannot be posted before that op ends.
      const auto [slot, key] = detail::slot_and_key(ix_, op, rank);
      if (key >= 0) {
        const int prod = ix_.cell(op.payload == OpKind::F ? detail::kSlotF : detail::kSlotBwd, key);
        if (prod >= ix_.offset[static_cast<std::size_t>(rank)] &&
            prod < ix_.offset[static_cast<std::size_t>(rank) + 1])
          deps_.push_back(static_cast<std::uint32_t>(prod));
      }
    }
  }

  /// Earliest start allowed by op g's dependencies (on top of `ready`); false and
  /// `blocker` set if one of them has not completed yet.
  bool gather(int g, std::int64_t& ready, int& blocker) {
    const std::uint32_t* d = deps_.data() + dep_begin_[static_cast<std::size_t>(g)];
    const std::uint32_t* e = deps_.data() + dep_begin_[static_cast<std::size_t>(g) + 1];
    // A bucket ready part-way through its first dependency (Op::ready_after): that op
    // ran for a fixed duration, so the point is known once it ended.
    const float part = ready_after_.empty() ? 1.0f : ready_after_[static_cast<std::size_t>(g)];
    for (const std::uint32_t* first = d; d != e; ++d) {
      const int dep = static_cast<int>(*d & ~kLagBit);
      if (part < 1.0f && d == first && gate_count(dep) > 0) {
        // A gated op's point: the end of the segment ready_after names (a LOAD's window
        // waits for it while the op still runs), known as soon as that segment ended.
        const int k = gate_segment(part, gate_count(dep));
        if (seg_next_[static_cast<std::size_t>(dep)] <= k) {
          blocker = dep;
          return false;
        }
        ready = std::max(ready, seg_end_[gate_begin_[static_cast<std::size_t>(dep)] + static_cast<std::size_t>(k)]);
        continue;
      }
      std::int64_t end = timing_[static_cast<std::size_t>(dep)].end_ns;
      if (end == kNotDone) {
        blocker = dep;
        return false;
      }
      if (*d & kLagBit) end += lag_[static_cast<std::size_t>(dep)];
      if (part < 1.0f && d == first) {
        const std::int64_t start = timing_[static_cast<std::size_t>(dep)].start_ns;
        end = start + std::llround(static_cast<double>(part) * static_cast<double>(end - start));
      }
      ready = std::max(ready, end);
    }
    return true;
  }

  void push(int s) {
    if (queued_[static_cast<std::size_t>(s)]) return;
    queued_[static_cast<std::size_t>(s)] = 1;
    work_.push_back(s);
  }
  void park(int s, int on) {
    wait_next_[static_cast<std::size_t>(s)] = wait_head_[static_cast<std::size_t>(on)];
    wait_head_[static_cast<std::size_t>(on)] = s;
  }
  void wake(int g) {
    int s = wait_head_[static_cast<std::size_t>(g)];
    wait_head_[static_cast<std::size_t>(g)] = -1;
    while (s >= 0) {
      const int next = wait_next_[static_cast<std::size_t>(s)];
      wait_next_[static_cast<std::size_t>(s)] = -1;
      push(s);
      s = next;
    }
  }

  /// Once a comm op is posted: a collective runs for its duration; a SEND/RECV
  /// pair completes `duration(send)` after the later of the two posts.
  void try_complete(int g) {
    auto& t = timing_[static_cast<std::size_t>(g)];
    const OpKind kind = kind_[static_cast<std::size_t>(g)];
    if (!detail::p2p_kind(kind)) {
      t.end_ns = t.start_ns + dur_[static_cast<std::size_t>(g)];
      wake(g);
      return;
    }
    const int q = partner_[static_cast<std::size_t>(g)];
    if (q < 0) return;
    auto& tq = timing_[static_cast<std::size_t>(q)];
    if (tq.start_ns == kNotDone) return;
    const std::int64_t d = dur_[static_cast<std::size_t>(kind == OpKind::SEND ? g : q)];
    t.end_ns = tq.end_ns = std::max(t.start_ns, tq.start_ns) + d;
    wake(g);
    wake(q);
  }

  int batch_size(int s, int first) const {
    const int end = stream_begin_[static_cast<std::size_t>(s) + 1];
    const int batch = batch_[static_cast<std::size_t>(stream_ops_[static_cast<std::size_t>(first)])];
    int count = 1;
    if (batch < 0) return count;
    while (first + count < end) {
      const int next = stream_ops_[static_cast<std::size_t>(first + count)];
      if (!is_comm(kind_[static_cast<std::size_t>(next)]) || batch_[static_cast<std::size_t>(next)] != batch) break;
      ++count;
    }
    return count;
  }

  void advance(int s) {
    const int begin = stream_begin_[static_cast<std::size_t>(s)];
    const int end = stream_begin_[static_cast<std::size_t>(s) + 1];
    int& pos = pos_[static_cast<std::size_t>(s)];
    std::int64_t& now = time_[static_cast<std::size_t>(s)];
    while (begin + pos < end) {
      const int first = begin + pos;
      const int g = stream_ops_[static_cast<std::size_t>(first)];
      if (is_comm(kind_[static_cast<std::size_t>(g)])) {
        const int count = batch_size(s, first);
        if (timing_[static_cast<std::size_t>(g)].start_ns == kNotDone) {
          // The whole batch is posted at once, when every member's inputs are ready.
          std::int64_t ready = now;
          int blocker = -1;
          for (int k = 0; k < count; ++k) {
            const int m = stream_ops_[static_cast<std::size_t>(first + k)];
            if (!gather(m, ready, blocker)) {
              park(s, blocker);
              return;
            }
          }
          for (int k = 0; k < count; ++k)
            timing_[static_cast<std::size_t>(stream_ops_[static_cast<std::size_t>(first + k)])].start_ns =
                ready;
          for (int k = 0; k < count; ++k) {
            const int m = stream_ops_[static_cast<std::size_t>(first + k)];
            try_complete(m);
          }
        }
        std::int64_t done = now;
        for (int k = 0; k < count; ++k) {
          const int m = stream_ops_[static_cast<std::size_t>(first + k)];
          const std::int64_t e = timing_[static_cast<std::size_t>(m)].end_ns;
          if (e == kNotDone) {
            park(s, m);
            return;
          }
          done = std::max(done, e);
        }
        now = done;
        pos += count;
        continue;
      }
      if (gate_count(g) > 0) {
        if (!run_gated(s, g, now)) return;
        ++pos;
        continue;
      }
      std::int64_t ready = now;
      int blocker = -1;
      if (!gather(g, ready, blocker)) {
        park(s, blocker);
        return;
      }
      auto& t = timing_[static_cast<std::size_t>(g)];
      t.start_ns = ready;
      t.end_ns = ready + dur_[static_cast<std::size_t>(g)];
      now = t.end_ns;
      ++pos;
      if (wait_head_[static_cast<std::size_t>(g)] >= 0) wake(g);
    }
  }

  /// Runs gated op g (is_weight_gate) on stream s as far as its LOADs allow: its n
  /// segments of dur/n each start once the previous one ended and its LOAD is done; the
  /// op starts with segment 0. False (s parked) while a deps or a LOAD is missing.
  bool run_gated(int s, int g, std::int64_t& now) {
    const std::size_t gi = static_cast<std::size_t>(g);
    if (seg_time_[gi] == kNotDone) {
      std::int64_t ready = now;
      int blocker = -1;
      if (!gather(g, ready, blocker)) {
        park(s, blocker);
        return false;
      }
      seg_time_[gi] = ready;
    }
    const std::uint32_t b = gate_begin_[gi];
    const int n = gate_count(g);
    const std::int64_t dur = dur_[gi];
    auto& t = timing_[gi];
    for (int k = seg_next_[gi]; k < n; k = seg_next_[gi]) {
      const int load = static_cast<int>(gates_[b + static_cast<std::size_t>(k)]);
      const std::int64_t arrived = timing_[static_cast<std::size_t>(load)].end_ns;
      if (arrived == kNotDone) {
        park(s, load);
        return false;
      }
      const std::int64_t begin = std::max(seg_time_[gi], arrived);
      if (k == 0) t.start_ns = begin;
      // Integer split: the segments add up to the op's duration exactly.
      const std::int64_t len = dur * (k + 1) / n - dur * k / n;
      seg_time_[gi] = seg_end_[b + static_cast<std::size_t>(k)] = begin + len;
      seg_next_[gi] = k + 1;
      if (wait_head_[gi] >= 0) wake(g);  // a LOAD waiting for this block's release
    }
    t.end_ns = seg_time_[gi];
    now = t.end_ns;
    if (wait_head_[gi] >= 0) wake(g);
    return true;
  }

  /// Why stream s cannot move: the op it waits for, in words.
  std::string blocked_reason(int s) {
    const int rank = s / kStreams;
    const int base = ix_.offset[static_cast<std::size_t>(rank)];
    const int first = stream_begin_[static_cast<std::size_t>(s)] + pos_[static_cast<std::size_t>(s)];
    const int g = stream_ops_[static_cast<std::size_t>(first)];
    const Op& op = op_at(rank, g - base);
    std::string head = op_to_text(op);
    if (is_comm(op.kind) && timing_[static_cast<std::size_t>(g)].start_ns != kNotDone) {
      // Posted: waiting for a partner to post its side.
      const int count = batch_size(s, first);
      for (int k = 0; k < count; ++k) {
        const int m = stream_ops_[static_cast<std::size_t>(first + k)];
        if (timing_[static_cast<std::size_t>(m)].end_ns != kNotDone) continue;
        const Op& mop = op_at(rank, m - base);
        const int q = partner_[static_cast<std::size_t>(m)];
        if (q < 0)
          return fmt::format("rank {} blocked on {} (no matching {} on rank {})", rank,
                             op_to_text(mop), mop.kind == OpKind::SEND ? "RECV" : "SEND", mop.peer);
        const auto [qr, qi] = ix_.locate(q);
        return fmt::format("rank {} blocked on {} (peer rank {} is blocked on {})", rank,
                           op_to_text(mop), qr, peer_head(qr, q));
      }
    }
    std::int64_t ready = 0;
    int blocker = -1;
    gather(g, ready, blocker);
    if (blocker < 0 && gate_count(g) > 0 && seg_next_[static_cast<std::size_t>(g)] < gate_count(g))
      blocker = static_cast<int>(gates_[gate_begin_[static_cast<std::size_t>(g)] +
                                        static_cast<std::size_t>(seg_next_[static_cast<std::size_t>(g)])]);
    if (blocker < 0) return fmt::format("rank {} blocked on {}", rank, head);
    const auto [br, bi] = ix_.locate(blocker);
    const Op& bop = op_at(br, bi);
    if (br == rank)
      return fmt::format("rank {} blocked on {} (waits for {} on rank {})", rank, head,
                         op_to_text(bop), br);
    return fmt::format("rank {} blocked on {} (waits for {} on rank {}, which is blocked on {})",
                       rank, head, op_to_text(bop), br, peer_head(br, blocker));
  }

  /// The head of the stream on `rank` that holds op g, in text form.
  std::string peer_head(int rank, int g) const {
    const auto [r, i] = ix_.locate(g);
    const int s = r * kStreams + stream_index(op_at(r, i));
    const int first = stream_begin_[static_cast<std::size_t>(s)] + pos_[static_cast<std::size_t>(s)];
    if (first >= stream_begin_[static_cast<std::size_t>(s) + 1]) return "nothing";
    (void)rank;
    return op_to_text(op_at(r, stream_ops_[static_cast<std::size_t>(first)] - ix_.offset[static_cast<std::size_t>(r)]));
  }

  std::string deadlock_message() {
    std::string lines;
    int blocked = 0;
    for (int s = 0; s < static_cast<int>(pos_.size()); ++s) {
      if (stream_begin_[s] + pos_[static_cast<std::size_t>(s)] >= stream_begin_[s + 1]) continue;
      ++blocked;
      lines += "\n  " + blocked_reason(s);
    }
    return fmt::format("plan deadlocks under blocking send/recv ({} stream(s) blocked):{}", blocked,
                       lines);
  }

  const Plan& plan_;
  const DurationFn& duration_;
  PlanIndex own_ix_;
  const PlanIndex& ix_;
  int n_ = 0;
  std::vector<int> stream_begin_;
  std::vector<std::int32_t> stream_ops_;
  std::vector<int> pos_;
  std::vector<std::int64_t> time_;
  std::vector<std::int32_t> wait_next_;
  std::vector<char> queued_;
  std::vector<int> work_;
  std::vector<OpTiming> timing_;
  std::vector<std::int64_t> dur_;
  std::vector<std::int64_t> lag_;
  std::vector<float> ready_after_;  ///< [global] Op::ready_after; empty when every op's is 1
  std::vector<std::int32_t> partner_;  ///< [global] SEND ↔ RECV; empty without comm ops
  std::vector<std::int32_t> wait_head_;
  std::vector<std::uint8_t> stream_of_;  ///< [global] stream index, until build_streams()
  std::vector<OpKind> kind_;            ///< [global] the op's kind (hot loop reads no Op)
  std::vector<std::int32_t> batch_;     ///< [global] a comm op's batch id; empty without comm ops
  std::vector<std::uint32_t> dep_begin_;  ///< [global] CSR into deps_
  std::vector<std::uint32_t> deps_;     ///< global indices; kLagBit: add the synthetic SEND's lag
  // Weight gates (parameter offload); all empty in a plan without LOADs.
  bool gated_plan_ = false;
  std::vector<std::uint32_t> gate_begin_;  ///< [global] CSR into gates_
  std::vector<std::uint32_t> gates_;       ///< the LOADs gating each op's segments, in order
  std::vector<std::int64_t> seg_end_;      ///< [gate] end of the segment that LOAD gates
  std::vector<std::int32_t> seg_next_;     ///< [global] segments of a gated op run so far
  std::vector<std::int64_t> seg_time_;     ///< [global] end of its last run segment; kNotDone: not begun
};

}  // namespace

ReplayResult replay(const Plan& plan, const DurationFn& duration) {
  Engine engine(plan, duration, nullptr);
  return engine.run();
}

std::vector<OpTiming> replay_flat(const Plan& plan, const DurationFn& duration) {
  Engine engine(plan, duration, nullptr);
  engine.simulate();
  return engine.take_timing();
}

namespace detail {
ReplayResult replay_indexed(const Plan& plan, const PlanIndex& index, const DurationFn& duration,
                            bool want_timing) {
  Engine engine(plan, duration, &index);
  return engine.run(want_timing);
}

std::vector<OpTiming> replay_flat(const Plan& plan, const PlanIndex& index, const DurationFn& duration) {
  Engine engine(plan, duration, &index);
  engine.simulate();
  return engine.take_timing();
}
}  // namespace detail

}  // namespace tdpipe::ir
