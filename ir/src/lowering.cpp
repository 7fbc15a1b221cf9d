// lowering.cpp — compute-only plan → plan with SEND/RECV, DP all-reduces and OPT.
//
// Only dependencies that cross ranks get a SEND/RECV pair; both carry the
// producer's (mb, chunk on the sending rank, slice). Explicit deps: a SEND → its
// producer, a compute op → the RECV carrying its input, an ALLREDUCE → the backward
// op that completes its bucket, OPT → its rank's ALLREDUCEs (or last backward).
//
// Order and batches (what makes blocking, NCCL-style transports deadlock-free for
// every schedule, not only 1F1B): the compute-only plan is replayed once with its
// own op costs (≥ 1 ns each; a synthetic scenario's p2p latency on cross-rank
// dependencies) and every transfer is stamped with the time its producer ends;
// each rank posts its SENDs and RECVs in that one global order. A SEND goes right
// after its producer; a RECV as late as possible before its consumer, but after no
// compute op that ends later than the transfer is ready (so, with the reference
// costs, no sender waits for a late RECV and the lowered plan's times equal the
// compute-only ones without latency), and never past the rank's next comm op. Comm
// ops that land between the same two compute ops Y, Z form one batch (on 1F1B's
// first rank exactly Megatron's send_forward_recv_backward pairs). Why it cannot
// deadlock: take the earliest unfinished transfer; everything its sender and
// receiver posted before it, and every input of its producer, is an earlier
// transfer, hence done; so both sides get posted and it completes.
//
// Data parallelism (plan.data > 1): each chunk's gradient is cut into buckets of
// at most bucket_bytes, chunks taken in the order their last W/BW runs (a bucket
// never spans two chunks, like Megatron's per-chunk gradient buffers). An
// ALLREDUCE is listed right before the compute op that follows its trigger.
#include "tdpipe/ir/lowering.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "plan_index.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "tdpipe/ir/replay.hpp"

namespace tdpipe::ir {
namespace {

bool is_backward(OpKind kind) { return kind == OpKind::B || kind == OpKind::BW || kind == OpKind::W; }

/// A cross-rank edge seen from one end: the other rank and the producer's ids.
struct Edge {
  OpKind payload = OpKind::F;
  int peer = -1;
  int mb = -1, chunk = 0, slice = 0;  ///< producer's, chunk on the producer's rank
  int producer_vs = -1;
};

class Lowerer {
 public:
  Lowerer(const Plan& plan, const LoweringOptions& options)
      : plan_(plan), options_(options), ix_(detail::build_index(plan)) {}

  Plan run() {
    const int ranks = plan_.num_ranks();
    collect_compute();
    plan_transfers();

    Plan out;
    out.schedule = plan_.schedule;
    out.stages = plan_.stages;
    out.microbatches = plan_.microbatches;
    out.chunks = plan_.chunks;
    out.slices = plan_.slices;
    out.data = plan_.data;
    out.lowered = true;
    out.stage_of = plan_.stage_of;
    out.slice_tokens = plan_.slice_tokens;
    out.scenario = plan_.scenario;
    out.ranks.resize(plan_.ranks.size());
    new_index_.resize(plan_.ranks.size());
    for (int r = 0; r < ranks; ++r) lower_rank(r, out.ranks[static_cast<std::size_t>(r)]);
    // Deps the compute-only plan carried referred to its own indices.
    for (const auto& [r, i, count] : remap_)
      for (int d = 0; d < count; ++d) {
        OpRef& ref = out.ranks[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)]
                         .deps[static_cast<std::size_t>(d)];
        if (ref.rank >= 0 && ref.rank < ranks && ref.index >= 0 &&
            ref.index < static_cast<int>(plan_.ranks[static_cast<std::size_t>(ref.rank)].size()))
          ref.index = new_index_[static_cast<std::size_t>(ref.rank)][static_cast<std::size_t>(ref.index)];
      }
    return out;
  }

 private:
  /// One cross-rank dependency: producer (rank from, old index) → consumer on rank to.
  struct Transfer {
    std::int64_t ready = 0;  ///< producer's end in the reference timeline
    int from = 0, producer = 0;
    int to = 0, consumer = -1;  ///< consumer's old index on `to`, −1 if the plan lacks it
    Edge edge;                  ///< as seen by the sender (peer = to)
    std::int64_t bytes = 0;     ///< options.p2p_bytes(producer)
  };

  /// The cross-rank output of a compute op on `rank`, if any.
  bool output_edge(const Op& op, int rank, Edge& e) const {
    const auto& st = ix_.stages;
    const int vs = st.stage_of(rank, op.chunk);
    if (vs < 0) return false;
    int to = -1;
    if (op.kind == OpKind::F && vs + 1 < st.virtual_stages()) to = vs + 1;
    if ((op.kind == OpKind::B || op.kind == OpKind::BW) && vs > 0) to = vs - 1;
    if (to < 0) return false;
    const int peer = st.rank_of[static_cast<std::size_t>(to)];
    if (peer < 0 || peer == rank) return false;
    e = {op.kind == OpKind::F ? OpKind::F : OpKind::B, peer, op.mb, op.chunk, op.slice, vs};
    return true;
  }

  std::int64_t bytes_of(const Op& producer) const {
    return options_.p2p_bytes ? options_.p2p_bytes(producer) : 0;
  }

  static void fill_comm_op(Op& op, OpKind kind, const Edge& e, int peer, std::int64_t bytes) {
    op.kind = kind;
    op.payload = e.payload;
    op.mb = e.mb;
    op.chunk = e.chunk;
    op.slice = e.slice;
    op.peer = peer;
    op.bytes = bytes;
    op.stream = Stream::P2P;
  }

  /// Per rank: compute ops in order (OPT aside) and each op's position among them.
  void collect_compute() {
    const int ranks = plan_.num_ranks();
    compute_.resize(static_cast<std::size_t>(ranks));
    position_.resize(static_cast<std::size_t>(ranks));
    given_opt_.assign(static_cast<std::size_t>(ranks), -1);
    for (int r = 0; r < ranks; ++r) {
      const auto& in = plan_.ranks[static_cast<std::size_t>(r)];
      auto& compute = compute_[static_cast<std::size_t>(r)];
      auto& position = position_[static_cast<std::size_t>(r)];
      compute.reserve(in.size());
      position.assign(in.size(), -1);
      for (int i = 0; i < static_cast<int>(in.size()); ++i) {
        const Op& op = in[static_cast<std::size_t>(i)];
        if (!is_compute(op.kind))
          throw Error(fmt::format("lower: rank {} op #{} {} is not a compute op; the input must be a "
                                  "compute-only plan (F/B/W/BW/OPT)",
                                  r, i, op_to_text(op)));
        if (op.kind == OpKind::OPT) {
          given_opt_[static_cast<std::size_t>(r)] = i;  // moved to the end
          continue;
        }
        position[static_cast<std::size_t>(i)] = static_cast<int>(compute.size());
        compute.push_back(i);
      }
    }
  }

  /// Stamps every cross-rank dependency with its producer's end in a replay of the
  /// compute-only plan and sorts them into the one global order all ranks follow.
  void plan_transfers() {
    ReplayResult timeline;
    try {
      // A synthetic scenario states its p2p latency: the reference then is the
      // zero-bubble paper's event timeline itself.
      const std::int64_t latency =
          plan_.scenario.synthetic ? std::llround(std::max(0.0, plan_.scenario.synthetic->p2p_latency_seconds) * 1e9)
                                   : 0;
      timeline = detail::replay_indexed(plan_, ix_, [latency](const Op& op, int) -> std::int64_t {
        if (op.kind == OpKind::SEND) return latency;
        if (!is_compute(op.kind)) return 0;
        // ≥ 1 ns: a consumer then always ends strictly after its producer.
        return std::max<std::int64_t>(1, std::llround(std::max(0.0, op.est_seconds) * 1e9));
      });
    } catch (const Error& e) {
      throw Error(fmt::format("lower: the compute-only order cannot run to the end: {}", e.what()));
    }
    ends_.resize(plan_.ranks.size());
    // At most one transfer per compute op: reserving avoids the doubling copies.
    std::size_t compute_ops = 0;
    for (const auto& c : compute_) compute_ops += c.size();
    transfers_.reserve(compute_ops);
    for (int r = 0; r < plan_.num_ranks(); ++r) {
      const auto& in = plan_.ranks[static_cast<std::size_t>(r)];
      auto& ends = ends_[static_cast<std::size_t>(r)];
      ends.reserve(compute_[static_cast<std::size_t>(r)].size());
      for (int i : compute_[static_cast<std::size_t>(r)])
        ends.push_back(timeline.timing[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)].end_ns);
      for (int i : compute_[static_cast<std::size_t>(r)]) {
        const Op& op = in[static_cast<std::size_t>(i)];
        Transfer t;
        if (!output_edge(op, r, t.edge)) continue;
        t.ready = timeline.timing[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)].end_ns;
        t.bytes = bytes_of(op);
        t.from = r;
        t.producer = i;
        t.to = t.edge.peer;
        const int consumer_vs = t.edge.payload == OpKind::F ? t.edge.producer_vs + 1 : t.edge.producer_vs - 1;
        const int g = ix_.find(t.edge.payload == OpKind::F ? detail::kSlotF : detail::kSlotBwd, op.mb,
                               consumer_vs, op.slice);
        if (g >= 0) {
          const auto [cr, ci] = ix_.locate(g);
          if (cr == t.to) t.consumer = ci;
        }
        transfers_.push_back(t);
      }
    }
    std::sort(transfers_.begin(), transfers_.end(), [](const Transfer& a, const Transfer& b) {
      if (a.ready != b.ready) return a.ready < b.ready;
      if (a.from != b.from) return a.from < b.from;
      return a.producer < b.producer;
    });
    // Per rank, its comm ops in the global order with what placing them needs, so
    // the per-rank passes below read one small sequential array.
    sequence_.resize(plan_.ranks.size());
    input_of_.resize(plan_.ranks.size());
    for (int k = 0; k < static_cast<int>(transfers_.size()); ++k) {
      const Transfer& t = transfers_[static_cast<std::size_t>(k)];
      const int send_bound = position_[static_cast<std::size_t>(t.from)][static_cast<std::size_t>(t.producer)];
      sequence_[static_cast<std::size_t>(t.from)].push_back({2 * k, send_bound, t.ready});
      auto& recv_seq = sequence_[static_cast<std::size_t>(t.to)];
      const int recv_bound =
          t.consumer >= 0 ? position_[static_cast<std::size_t>(t.to)][static_cast<std::size_t>(t.consumer)] : -1;
      if (t.consumer >= 0) {
        auto& inputs = input_of_[static_cast<std::size_t>(t.to)];
        if (inputs.empty()) inputs.assign(plan_.ranks[static_cast<std::size_t>(t.to)].size(), -1);
        inputs[static_cast<std::size_t>(t.consumer)] = static_cast<int>(recv_seq.size());
      }
      recv_seq.push_back({2 * k + 1, recv_bound, t.ready});
    }
  }

  /// Slot of each comm op of rank r (comm ops in slot s go right before compute op s):
  /// SENDs as early as possible, RECVs as late as possible, order kept.
  std::vector<int> slots(int r) const {
    const auto& seq = sequence_[static_cast<std::size_t>(r)];
    const int count = static_cast<int>(compute_[static_cast<std::size_t>(r)].size());
    std::vector<int> earliest(seq.size()), slot(seq.size());
    int floor = 0;
    for (std::size_t i = 0; i < seq.size(); ++i) {
      if (seq[i].id % 2 == 0) floor = std::max(floor, seq[i].bound + 1);
      earliest[i] = floor;
    }
    const auto& ends = ends_[static_cast<std::size_t>(r)];
    int ceiling = count;
    for (std::size_t i = seq.size(); i-- > 0;) {
      if (seq[i].id % 2 == 0) {
        slot[i] = earliest[i];
      } else {
        // Before the consumer, and posted no later than the transfer is ready in the
        // reference timeline (after the last compute op that ends by then), so that
        // the sender never waits on a late RECV.
        int latest = seq[i].bound >= 0 ? seq[i].bound : count;
        const int by_time =
            static_cast<int>(std::upper_bound(ends.begin(), ends.end(), seq[i].ready) - ends.begin());
        latest = std::min(latest, by_time);
        slot[i] = std::max(earliest[i], std::min(latest, ceiling));
      }
      ceiling = slot[i];
    }
    return slot;
  }

  /// DP buckets: the ALLREDUCEs to list after compute op k (position), per k.
  std::vector<std::vector<Op>> buckets(int r, int& last_backward) const {
    const auto& in = plan_.ranks[static_cast<std::size_t>(r)];
    const auto& compute = compute_[static_cast<std::size_t>(r)];
    std::vector<std::vector<Op>> after(compute.size());
    last_backward = -1;
    for (int k = 0; k < static_cast<int>(compute.size()); ++k)
      if (is_backward(in[static_cast<std::size_t>(compute[static_cast<std::size_t>(k)])].kind)) last_backward = k;
    if (plan_.data <= 1 || !options_.grad_bytes || last_backward < 0) return after;
    const int chunks = ix_.stages.chunks;
    std::vector<int> last_of_chunk(static_cast<std::size_t>(chunks), -1);
    for (int k = 0; k < static_cast<int>(compute.size()); ++k) {
      const Op& op = in[static_cast<std::size_t>(compute[static_cast<std::size_t>(k)])];
      if ((op.kind == OpKind::W || op.kind == OpKind::BW) && op.chunk >= 0 && op.chunk < chunks)
        last_of_chunk[static_cast<std::size_t>(op.chunk)] = k;
    }
    std::vector<int> order;
    for (int c = 0; c < chunks; ++c)
      if (last_of_chunk[static_cast<std::size_t>(c)] >= 0) order.push_back(c);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return last_of_chunk[static_cast<std::size_t>(a)] < last_of_chunk[static_cast<std::size_t>(b)];
    });
    const std::int64_t bucket = std::max<std::int64_t>(1, options_.bucket_bytes);
    int tag = 0;
    for (int c : order) {
      std::int64_t left = options_.grad_bytes(r, c);
      const int trigger = options_.overlap_dp ? last_of_chunk[static_cast<std::size_t>(c)] : last_backward;
      while (left > 0) {
        Op ar;
        ar.kind = OpKind::ALLREDUCE;
        ar.chunk = c;
        ar.tag = tag++;
        ar.bytes = std::min(left, bucket);
        ar.stream = Stream::DP;
        left -= ar.bytes;
        after[static_cast<std::size_t>(trigger)].push_back(std::move(ar));
      }
    }
    return after;
  }

  void lower_rank(int r, std::vector<Op>& out) {
    const auto& in = plan_.ranks[static_cast<std::size_t>(r)];
    const auto& compute = compute_[static_cast<std::size_t>(r)];
    const auto& seq = sequence_[static_cast<std::size_t>(r)];
    const auto& inputs = input_of_[static_cast<std::size_t>(r)];
    auto& new_index = new_index_[static_cast<std::size_t>(r)];
    new_index.assign(in.size(), -1);

    int last_backward = -1;
    std::vector<std::vector<Op>> after = buckets(r, last_backward);
    std::size_t dp_count = 0;
    for (const auto& a : after) dp_count += a.size();
    out.reserve(compute.size() + seq.size() + dp_count + 1);

    const std::vector<int> slot = slots(r);
    std::vector<int> recv_new(seq.size(), -1);  // [seq index] the RECV's new index
    std::size_t next = 0;  // next comm op of `seq`
    int batch_id = 0;
    std::vector<OpRef> allreduces;
    const int count = static_cast<int>(compute.size());
    for (int s = 0; s <= count; ++s) {
      std::size_t end = next;
      while (end < seq.size() && slot[end] == s) ++end;
      const int batch = end - next >= 2 ? batch_id++ : -1;
      // Within a batch the order is free (posted together): SENDs first, as Megatron lists them.
      for (int pass = 0; pass < 2; ++pass)
        for (std::size_t i = next; i < end; ++i) {
          const bool send = seq[i].id % 2 == 0;
          if (send != (pass == 0)) continue;
          const Transfer& t = transfers_[static_cast<std::size_t>(seq[i].id / 2)];
          if (!send) recv_new[i] = static_cast<int>(out.size());
          // Built in place: a lowered plan has millions of ops, each copy counts.
          Op& op = out.emplace_back();
          fill_comm_op(op, send ? OpKind::SEND : OpKind::RECV, t.edge, send ? t.to : t.from, t.bytes);
          op.batch = batch;
          if (send) op.deps.push_back({r, new_index[static_cast<std::size_t>(t.producer)]});
        }
      next = end;
      if (s > 0) {
        for (Op& ar : after[static_cast<std::size_t>(s - 1)]) {
          ar.deps.push_back({r, new_index[static_cast<std::size_t>(compute[static_cast<std::size_t>(s - 1)])]});
          allreduces.push_back({r, static_cast<int>(out.size())});
          out.push_back(std::move(ar));
        }
      }
      if (s == count) break;
      const int old = compute[static_cast<std::size_t>(s)];
      new_index[static_cast<std::size_t>(old)] = static_cast<int>(out.size());
      Op& op = out.emplace_back(in[static_cast<std::size_t>(old)]);
      if (!op.deps.empty())
        remap_.push_back({r, static_cast<int>(out.size()) - 1, static_cast<int>(op.deps.size())});
      if (!inputs.empty() && inputs[static_cast<std::size_t>(old)] >= 0) {
        const int recv = recv_new[static_cast<std::size_t>(inputs[static_cast<std::size_t>(old)])];
        if (recv >= 0) op.deps.push_back({r, recv});
      }
    }

    const int given = given_opt_[static_cast<std::size_t>(r)];
    if (options_.optimizer_step || given >= 0) {
      Op opt;
      if (given >= 0) {
        opt = in[static_cast<std::size_t>(given)];
        if (!opt.deps.empty())
          remap_.push_back({r, static_cast<int>(out.size()), static_cast<int>(opt.deps.size())});
        new_index[static_cast<std::size_t>(given)] = static_cast<int>(out.size());
      }
      opt.kind = OpKind::OPT;
      opt.mb = -1;
      opt.stream = Stream::Compute;
      if (options_.optimizer_seconds) opt.est_seconds = options_.optimizer_seconds(r);
      if (!allreduces.empty())
        opt.deps.insert(opt.deps.end(), allreduces.begin(), allreduces.end());
      else if (last_backward >= 0)
        opt.deps.push_back(
            {r, new_index[static_cast<std::size_t>(compute[static_cast<std::size_t>(last_backward)])]});
      out.push_back(std::move(opt));
    }
  }

  const Plan& plan_;
  const LoweringOptions& options_;
  detail::PlanIndex ix_;
  std::vector<std::vector<int>> compute_;   ///< [rank] old indices of compute ops (OPT aside)
  std::vector<std::vector<int>> position_;  ///< [rank][old index] → position in compute_, −1
  std::vector<int> given_opt_;              ///< [rank] old index of an OPT in the input, −1
  std::vector<Transfer> transfers_;         ///< in the global order
  std::vector<std::vector<std::int64_t>> ends_;  ///< [rank][position] end of compute op in the reference timeline
  struct CommItem {
    int id;              ///< 2k: SEND of transfer k, 2k+1: its RECV
    int bound;           ///< SEND: producer's position; RECV: consumer's position (−1 none)
    std::int64_t ready;  ///< the transfer's ready time
  };
  std::vector<std::vector<CommItem>> sequence_;  ///< [rank] comm ops in the global order
  std::vector<std::vector<int>> input_of_;  ///< [rank][old index] → index in sequence_ of its RECV, −1
  std::vector<std::vector<int>> new_index_;  ///< [rank][old index] → new index
  /// Copied ops (rank, new index, how many leading deps) whose deps need new indices.
  std::vector<std::tuple<int, int, int>> remap_;
};

}  // namespace

Plan lower(const Plan& compute_only, const LoweringOptions& options) {
  if (compute_only.lowered)
    throw Error("lower: the plan is already lowered (plan.lowered is true); lower the compute-only plan");
  return Lowerer(compute_only, options).run();
}

}  // namespace tdpipe::ir
