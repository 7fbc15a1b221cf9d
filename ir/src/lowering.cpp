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
// never spans two chunks, like Megatron's per-chunk gradient buffers), each chunk's
// buckets from its last parameters to its first (the order backward finishes them).
// An ALLREDUCE is listed right before the compute op that follows its trigger and,
// with overlap_dp, may start part-way through it (Op::ready_after: the share of the
// chunk's gradient bytes its buckets up to this one hold). With a
// sharded optimizer (ZeRO-1) each bucket is a REDUCE_SCATTER there instead, and an
// ALL_GATHER of the bucket's updated parameters follows OPT (same tag, bytes, chunk).
//
// Parameter offload (offload_blocks): each rank's copy stream gets one LOAD per layer
// block each weight-reading op (F, B, BW; W reads activations only) uses, in the order
// the compute stream reaches them, and OPT's state LOAD/OFFLOAD per block. The op lists
// its LOADs as deps, which gate its segments (is_weight_gate); a LOAD's first dep, with
// ready_after, is the release of the block `offload_window` loads earlier. Weights are
// read-only until OPT, so a released weight block is dropped, not copied back.
#include "tdpipe/ir/lowering.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "plan_index.hpp"
#include "prefault.hpp"
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
    out.stage_layers = plan_.stage_layers;
    out.memory_budget_bytes = plan_.memory_budget_bytes;
    out.scenario = plan_.scenario;
    out.ranks.resize(plan_.ranks.size());
    new_index_.resize(plan_.ranks.size());
    // The output's key range is the input's only where the plan states m and S; a
    // compute-only plan with duplicate ops is left to the validator's own index.
    reindex_ = reindex_ && ix_.duplicates.empty() && plan_.microbatches > 0 && plan_.slices > 0;
    if (reindex_) new_offset_.assign(static_cast<std::size_t>(ranks) + 1, 0);
    for (int r = 0; r < ranks; ++r) {
      lower_rank(r, out.ranks[static_cast<std::size_t>(r)]);
      if (reindex_) reindex(r, out.ranks[static_cast<std::size_t>(r)]);
      // Only rank r reads these (its sends were copied into its receivers' lists):
      // the peak is at the last rank, with the whole output built.
      std::vector<int>().swap(sends_[static_cast<std::size_t>(r)]);
      std::vector<Incoming>().swap(incoming_[static_cast<std::size_t>(r)]);
    }
    // Deps the compute-only plan carried referred to its own indices.
    for (const auto& [r, i, count] : remap_)
      for (int d = 0; d < count; ++d) {
        OpRef& ref = out.ranks[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)]
                         .deps[static_cast<std::size_t>(d)];
        if (ref.rank >= 0 && ref.rank < ranks && ref.index >= 0 &&
            ref.index < static_cast<int>(plan_.ranks[static_cast<std::size_t>(ref.rank)].size()))
          ref.index = new_index_[static_cast<std::size_t>(ref.rank)][static_cast<std::size_t>(ref.index)];
      }
    if (!options_.overlap_p2p) block_on_transfers(out);
    if (reindex_) ix_.offset = std::move(new_offset_);
    return out;
  }

  /// overlap_p2p false: each compute op waits for the SENDs posted since the previous
  /// compute op of its rank (a RECV already gates the op that consumes it; one posted
  /// ahead for a later op gates that op, as Megatron receives just in time).
  static void block_on_transfers(Plan& out) {
    std::vector<int> pending;
    for (int r = 0; r < out.num_ranks(); ++r) {
      auto& ops = out.ranks[static_cast<std::size_t>(r)];
      pending.clear();
      for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
        Op& op = ops[static_cast<std::size_t>(i)];
        if (op.kind == OpKind::SEND) {
          pending.push_back(i);
        } else if (is_compute(op.kind)) {
          for (int p : pending) {
            const OpRef ref{r, p};
            if (std::find(op.deps.begin(), op.deps.end(), ref) == op.deps.end()) op.deps.push_back(ref);
          }
          pending.clear();
        }
      }
    }
  }

  /// Makes run() leave the output's index (as detail::build_index builds it) in
  /// place of the input's, for the validator; index_kept() says whether it did.
  void keep_index() { reindex_ = true; }
  bool index_kept() const { return reindex_; }
  detail::PlanIndex take_index() { return std::move(ix_); }

 private:
  static constexpr int kSendItem = -2;
  /// One comm op of the rank being lowered (one rank's at a time, the buffer reused):
  /// bounds and ready times are read from position_ and ends_ when needed; the
  /// producer's ids and bytes are noted when the item is made (the producer op is
  /// in cache then, and long out of it when the comm op is written).
  struct CommItem {
    int peer;      ///< SEND: the receiving rank; RECV: the sending rank
    int producer;  ///< the producer's old index on the sending rank
    int consumer;  ///< RECV: the consumer's old index on this rank, −1 none; SEND: kSendItem
    Edge edge;     ///< the producer's ids (output_edge)
    std::int64_t bytes;  ///< bytes_of(producer)
    bool is_send() const { return consumer == kSendItem; }
  };

  /// A transfer by its producer: position `pos` among rank `from`'s compute ops.
  struct Incoming {
    int from, pos;
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

  /// The reference timeline's cost of a compute op: ≥ 1 ns, so that a consumer
  /// always ends strictly after its producer.
  static std::int64_t reference_ns(const Op& op) {
    return std::max<std::int64_t>(1, std::llround(std::max(0.0, op.est_seconds) * 1e9));
  }

  /// Stamps every cross-rank dependency with its producer's end in a replay of the
  /// compute-only plan (ends_) and lists each rank's outgoing transfers (sends_) and,
  /// per receiving rank, the same transfers seen from there (incoming_). The one
  /// global order all ranks follow is transfers sorted by (ready, sending rank,
  /// producer index); build_sequence() gives it, one rank at a time.
  ///
  /// Why no global sort: a rank's compute ops run one after another, so along its
  /// compute order the ends (ready times) never decrease while the producer index
  /// grows; each rank's transfers are already in the global order, and a rank's
  /// part of it is a merge of a few sorted runs (its own sends, one run per rank
  /// sending to it). No array of all transfers exists (it was 56 MB at p = 64,
  /// m = 1024, v = 4, and its sort a quarter of lower's time). A plan whose ends
  /// do decrease somewhere (compute ops put on several streams by hand) sorts each
  /// rank's transfers instead (sorted_ false).
  void plan_transfers() {
    std::vector<std::int64_t> timeline;  // end by global index
    // A synthetic scenario states its p2p latency: the reference then is the
    // zero-bubble paper's event timeline itself.
    const std::int64_t latency =
        plan_.scenario.synthetic ? std::llround(std::max(0.0, plan_.scenario.synthetic->p2p_latency_seconds) * 1e9)
                                 : 0;
    {
      std::vector<OpTiming> timing;
      try {
        timing = detail::replay_flat(plan_, ix_, [latency](const Op& op, int) -> std::int64_t {
          if (op.kind == OpKind::SEND) return latency;
          if (!is_compute(op.kind)) return 0;
          return reference_ns(op);
        });
      } catch (const Error& e) {
        throw Error(fmt::format("lower: the compute-only order cannot run to the end: {}", e.what()));
      }
      timeline.resize(timing.size());
      for (std::size_t g = 0; g < timing.size(); ++g) timeline[g] = timing[g].end_ns;
    }
    const int ranks = plan_.num_ranks();
    ends_.resize(plan_.ranks.size());
    // Per rank, the positions of compute ops that feed another rank (its transfers in
    // producer order), and per receiving rank the same transfers seen from there.
    sends_.resize(plan_.ranks.size());
    incoming_.resize(plan_.ranks.size());
    std::vector<std::size_t> recv_count(plan_.ranks.size(), 0);
    for (int r = 0; r < ranks; ++r) {
      const auto& in = plan_.ranks[static_cast<std::size_t>(r)];
      const auto& compute = compute_[static_cast<std::size_t>(r)];
      const std::int64_t* timing = timeline.data() + ix_.offset[static_cast<std::size_t>(r)];
      auto& ends = ends_[static_cast<std::size_t>(r)];
      ends.reserve(compute.size());
      for (int i : compute) ends.push_back(timing[i]);
      auto& out = sends_[static_cast<std::size_t>(r)];
      for (int pos = 0; pos < static_cast<int>(compute.size()); ++pos) {
        Edge e;
        if (!output_edge(in[static_cast<std::size_t>(compute[static_cast<std::size_t>(pos)])], r, e)) continue;
        if (!out.empty() && ends[static_cast<std::size_t>(pos)] < ends[static_cast<std::size_t>(out.back())])
          sorted_ = false;
        out.push_back(pos);
        ++recv_count[static_cast<std::size_t>(e.peer)];
      }
    }
    std::vector<std::int64_t>().swap(timeline);
    // Each receiver's list sized once (grown by doubling, the freed blocks would stay
    // resident at the peak).
    for (int r = 0; r < ranks; ++r)
      incoming_[static_cast<std::size_t>(r)].reserve(recv_count[static_cast<std::size_t>(r)]);
    // Senders in rank order: each receiver's list is one run per sender, each run in
    // that sender's order.
    for (int r = 0; r < ranks; ++r) {
      const auto& in = plan_.ranks[static_cast<std::size_t>(r)];
      const auto& compute = compute_[static_cast<std::size_t>(r)];
      for (int pos : sends_[static_cast<std::size_t>(r)]) {
        Edge e;
        output_edge(in[static_cast<std::size_t>(compute[static_cast<std::size_t>(pos)])], r, e);
        incoming_[static_cast<std::size_t>(e.peer)].push_back({r, pos});
      }
    }
  }

  /// Rank r's comm ops in the global order (into seq_, and input_of_: consumer's old
  /// index → its RECV's index in seq_). The global order restricted to one rank is
  /// the merge of the rank's own transfers with those it receives, run by sender:
  /// each is sorted already (see plan_transfers), so a small k-way merge gives it;
  /// where a rank's ends are not sorted, a sort of the rank's transfers does.
  void build_sequence(int r) {
    struct Run {
      int from;
      const Incoming* begin;
      const Incoming* end;
    };
    const auto& own = sends_[static_cast<std::size_t>(r)];
    const auto& inc = incoming_[static_cast<std::size_t>(r)];
    own_buf_.clear();
    own_buf_.reserve(own.size());
    for (int pos : own) own_buf_.push_back({r, pos});
    std::vector<Run> runs;
    if (!own_buf_.empty()) runs.push_back({r, own_buf_.data(), own_buf_.data() + own_buf_.size()});
    for (std::size_t i = 0; i < inc.size();) {
      std::size_t j = i;
      while (j < inc.size() && inc[j].from == inc[i].from) ++j;
      runs.push_back({inc[i].from, inc.data() + i, inc.data() + j});
      i = j;
    }
    auto ready = [&](const Incoming& t) {
      return ends_[static_cast<std::size_t>(t.from)][static_cast<std::size_t>(t.pos)];
    };
    seq_.clear();
    seq_.reserve(own.size() + inc.size());
    input_of_.assign(plan_.ranks[static_cast<std::size_t>(r)].size(), -1);
    if (sorted_) {
      // A rank hears from at most two ranks per chunk (the owners of the stages
      // before and after), so the smallest head is found by a scan; ties go to the
      // lower sending rank.
      head_.resize(runs.size());
      for (std::size_t k = 0; k < runs.size(); ++k) head_[k] = ready(*runs[k].begin);
      std::size_t live = runs.size();
      while (live > 0) {
        std::size_t best = runs.size();
        for (std::size_t k = 0; k < runs.size(); ++k) {
          if (runs[k].begin == runs[k].end) continue;
          if (best == runs.size() || head_[k] < head_[best] ||
              (head_[k] == head_[best] && runs[k].from < runs[best].from))
            best = k;
        }
        Run& run = runs[best];
        append_item(r, *run.begin++);
        if (run.begin != run.end) head_[best] = ready(*run.begin);
        else --live;
      }
    } else {
      std::vector<Incoming> all(own_buf_.begin(), own_buf_.end());
      all.insert(all.end(), inc.begin(), inc.end());
      std::sort(all.begin(), all.end(), [&](const Incoming& a, const Incoming& b) {
        const std::int64_t ra = ready(a), rb = ready(b);
        if (ra != rb) return ra < rb;
        if (a.from != b.from) return a.from < b.from;
        return a.pos < b.pos;  // same rank: position order is producer order
      });
      for (const Incoming& t : all) append_item(r, t);
    }
  }

  /// Appends transfer t (producer at position t.pos on rank t.from) to rank r's
  /// sequence: its SEND if r sends it, else its RECV.
  void append_item(int r, const Incoming& t) {
    const int producer = compute_[static_cast<std::size_t>(t.from)][static_cast<std::size_t>(t.pos)];
    const Op& op = plan_.ranks[static_cast<std::size_t>(t.from)][static_cast<std::size_t>(producer)];
    Edge e;
    output_edge(op, t.from, e);
    if (t.from == r) {
      seq_.push_back({e.peer, producer, kSendItem, e, bytes_of(op)});
      return;
    }
    int consumer = -1;
    const int consumer_vs = e.payload == OpKind::F ? e.producer_vs + 1 : e.producer_vs - 1;
    const int g = ix_.find(e.payload == OpKind::F ? detail::kSlotF : detail::kSlotBwd, op.mb, consumer_vs, op.slice);
    if (g >= ix_.offset[static_cast<std::size_t>(r)] && g < ix_.offset[static_cast<std::size_t>(r) + 1])
      consumer = g - ix_.offset[static_cast<std::size_t>(r)];
    if (consumer >= 0) input_of_[static_cast<std::size_t>(consumer)] = static_cast<int>(seq_.size());
    seq_.push_back({t.from, producer, consumer, e, bytes_of(op)});
  }

  /// Where comm item `c` of rank r may go: a SEND after its producer (position),
  /// a RECV before its consumer (position, −1 none); and when its data is ready.
  int bound_of(int r, const CommItem& c) const {
    if (c.is_send()) return position_[static_cast<std::size_t>(r)][static_cast<std::size_t>(c.producer)];
    return c.consumer >= 0 ? position_[static_cast<std::size_t>(r)][static_cast<std::size_t>(c.consumer)] : -1;
  }
  std::int64_t ready_of(int r, const CommItem& c) const {
    const int from = c.is_send() ? r : c.peer;
    const int pos = position_[static_cast<std::size_t>(from)][static_cast<std::size_t>(c.producer)];
    return ends_[static_cast<std::size_t>(from)][static_cast<std::size_t>(pos)];
  }

  /// Slot of each comm op of rank r (comm ops in slot s go right before compute op s):
  /// SENDs as early as possible, RECVs as late as possible, order kept.
  std::vector<int> slots(int r) const {
    const auto& seq = seq_;
    const int count = static_cast<int>(compute_[static_cast<std::size_t>(r)].size());
    std::vector<int> earliest(seq.size()), slot(seq.size());
    const auto& ends = ends_[static_cast<std::size_t>(r)];
    // A RECV's "by time" bound is the number of this rank's compute ops that end by
    // its transfer's ready time (upper_bound over ends). Ends grow along the rank's
    // order and ready times along the global order, so one forward pointer finds
    // them all; where either does not hold, the binary search.
    const bool ends_sorted = std::is_sorted(ends.begin(), ends.end());
    int floor = 0;
    int pointer = 0;
    std::int64_t last_ready = std::numeric_limits<std::int64_t>::min();
    for (std::size_t i = 0; i < seq.size(); ++i) {
      if (seq[i].is_send()) {
        floor = std::max(floor, bound_of(r, seq[i]) + 1);
      } else {
        const std::int64_t ready = ready_of(r, seq[i]);
        if (ends_sorted && ready >= last_ready) {
          while (pointer < count && ends[static_cast<std::size_t>(pointer)] <= ready) ++pointer;
          slot[i] = pointer;
          last_ready = ready;
        } else {
          slot[i] = static_cast<int>(std::upper_bound(ends.begin(), ends.end(), ready) - ends.begin());
        }
      }
      earliest[i] = floor;
    }
    int ceiling = count;
    for (std::size_t i = seq.size(); i-- > 0;) {
      if (seq[i].is_send()) {
        slot[i] = earliest[i];
      } else {
        // Before the consumer, and posted no later than the transfer is ready in the
        // reference timeline (after the last compute op that ends by then), so that
        // the sender never waits on a late RECV.
        const int bound = bound_of(r, seq[i]);
        int latest = bound >= 0 ? bound : count;
        const int by_time = slot[i];
        latest = std::min(latest, by_time);
        slot[i] = std::max(earliest[i], std::min(latest, ceiling));
      }
      ceiling = slot[i];
    }
    return slot;
  }

  /// DP buckets: the ALLREDUCEs to list after compute op k (position), per k; empty
  /// (no list at all) without DP reduction.
  std::vector<std::vector<Op>> buckets(int r, int& last_backward) const {
    const auto& in = plan_.ranks[static_cast<std::size_t>(r)];
    const auto& compute = compute_[static_cast<std::size_t>(r)];
    std::vector<std::vector<Op>> after;
    last_backward = -1;
    for (int k = 0; k < static_cast<int>(compute.size()); ++k)
      if (is_backward(in[static_cast<std::size_t>(compute[static_cast<std::size_t>(k)])].kind)) last_backward = k;
    if (plan_.data <= 1 || !options_.grad_bytes || last_backward < 0) return after;
    if (options_.shard_optimizer && options_.compress_element_bytes > 0)
      throw Error("lowering: 1-bit Adam's compressed all-reduce and a sharded optimizer (ZeRO-1) exclude each other");
    after.resize(compute.size());
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
      const std::int64_t total = options_.grad_bytes(r, c);
      std::int64_t left = total;
      const int trigger = options_.overlap_dp ? last_of_chunk[static_cast<std::size_t>(c)] : last_backward;
      while (left > 0) {
        Op ar;
        ar.kind = options_.shard_optimizer ? OpKind::REDUCE_SCATTER : OpKind::ALLREDUCE;
        ar.chunk = c;
        ar.tag = tag++;
        ar.bytes = std::min(left, bucket);
        ar.stream = Stream::DP;
        left -= ar.bytes;
        if (options_.compress_element_bytes > 0) {
          const std::int64_t e = options_.compress_element_bytes;
          const std::int64_t elements = (ar.bytes + e - 1) / e;
          ar.kind = OpKind::COMPRESSED_ALLREDUCE;
          ar.bytes = compressed_bucket_bytes(elements, plan_.data);
          if (options_.compress_seconds) ar.est_seconds = options_.compress_seconds(r, elements);
        }
        // Overlapped: the backward produces the chunk's gradients from its last
        // parameters to its first, at a steady rate through the trigger op; the bucket
        // that ends them is ready that far in.
        if (options_.overlap_dp && left > 0)
          ar.ready_after = static_cast<float>(static_cast<double>(total - left) / static_cast<double>(total));
        after[static_cast<std::size_t>(trigger)].push_back(std::move(ar));
      }
    }
    return after;
  }

  /// Rank r is lowered: its entries of ix_ become the output's. Nothing reads rank r's
  /// compute cells after this (append_item looks up consumers on the rank being
  /// lowered only, and they are filed under that rank's stages), so they are cleared
  /// and the rank's output ops filed as build_index files them, with the output's
  /// global indices. The SEND/RECV cells were empty (the input has compute ops only).
  void reindex(int r, const std::vector<Op>& out) {
    const int per_stage = ix_.microbatches * ix_.slices;
    for (int c = 0; c < ix_.stages.chunks; ++c) {
      const int vs = ix_.stages.stage_of(r, c);
      if (vs < 0) continue;
      for (int k = vs * per_stage; k < (vs + 1) * per_stage; ++k)
        for (int slot : {detail::kSlotF, detail::kSlotBwd, detail::kSlotW}) ix_.cell(slot, k) = -1;
    }
    const int base = new_offset_[static_cast<std::size_t>(r)];
    new_offset_[static_cast<std::size_t>(r) + 1] = base + static_cast<int>(out.size());
    detail::file_ops(ix_, out, r, base);
  }

  void lower_rank(int r, std::vector<Op>& out) {
    const auto& in = plan_.ranks[static_cast<std::size_t>(r)];
    const auto& compute = compute_[static_cast<std::size_t>(r)];
    build_sequence(r);
    const auto& seq = seq_;
    const auto& inputs = input_of_;
    auto& new_index = new_index_[static_cast<std::size_t>(r)];
    new_index.assign(in.size(), -1);

    int last_backward = -1;
    std::vector<std::vector<Op>> after = buckets(r, last_backward);
    std::size_t dp_count = 0;
    for (const auto& a : after) dp_count += a.size();
    detail::reserve_prefaulted(out, compute.size() + seq.size() + dp_count * (options_.shard_optimizer ? 2 : 1) + 1);

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
          const CommItem& c = seq[i];
          const bool send = c.is_send();
          if (send != (pass == 0)) continue;
          if (!send) recv_new[i] = static_cast<int>(out.size());
          // Built in place: a lowered plan has millions of ops, each copy counts.
          Op& op = out.emplace_back();
          fill_comm_op(op, send ? OpKind::SEND : OpKind::RECV, c.edge, c.peer, c.bytes);
          op.batch = batch;
          if (send) op.deps.push_back({r, new_index[static_cast<std::size_t>(c.producer)]});
        }
      next = end;
      if (s > 0 && !after.empty()) {
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
      const int opt_index = static_cast<int>(out.size());
      out.push_back(std::move(opt));
      if (options_.shard_optimizer) {
        const std::size_t scattered = allreduces.size();
        for (std::size_t k = 0; k < scattered; ++k) {
          Op ag = out[static_cast<std::size_t>(allreduces[k].index)];
          ag.kind = OpKind::ALL_GATHER;
          ag.ready_after = 1.0f;  // after OPT, whole
          ag.deps.clear();
          ag.deps.push_back({r, opt_index});
          out.push_back(std::move(ag));
        }
      }
    }
    add_parameter_copies(r, out);
  }

  /// Appends rank r's LOAD/OFFLOAD ops (parameter offload) after its other ops and lists
  /// each weight-reading op's LOADs, in use order, among its deps.
  void add_parameter_copies(int r, std::vector<Op>& out) const {
    if (!options_.offload_blocks) return;
    const int window = std::max(1, options_.offload_window);
    const int ratio = std::max(0, options_.offload_state_ratio);
    std::vector<std::vector<std::int64_t>> blocks(static_cast<std::size_t>(ix_.stages.chunks));
    bool any = false;
    for (int c = 0; c < ix_.stages.chunks; ++c) {
      if (ix_.stages.stage_of(r, c) < 0) continue;
      blocks[static_cast<std::size_t>(c)] = options_.offload_blocks(r, c);
      any = any || !blocks[static_cast<std::size_t>(c)].empty();
    }
    if (!any) return;
    const auto seconds = [&](std::int64_t bytes) {
      return options_.copy_seconds ? options_.copy_seconds(r, bytes) : 0.0;
    };
    const int ops = static_cast<int>(out.size());
    std::vector<Op> copies;
    // The release of each LOAD so far (its consumer's segment end, or the OFFLOAD that
    // writes it back): the dependency the LOAD `window` places later waits for.
    struct Release {
      OpRef at;
      float ready_after;
    };
    std::vector<Release> released;  // [load ordinal on this rank]
    const auto load = [&](int consumer, int chunk, int layer, std::int64_t bytes) {
      Op l;
      l.kind = OpKind::LOAD;
      l.stream = Stream::Copy;
      l.mb = out[static_cast<std::size_t>(consumer)].mb;
      l.chunk = chunk;
      l.slice = out[static_cast<std::size_t>(consumer)].slice;
      l.tag = layer;
      l.bytes = bytes;
      l.est_seconds = seconds(bytes);
      if (released.size() >= static_cast<std::size_t>(window)) {
        const Release& free = released[released.size() - static_cast<std::size_t>(window)];
        l.deps.push_back(free.at);
        l.ready_after = free.ready_after;
      }
      out[static_cast<std::size_t>(consumer)].deps.push_back({r, ops + static_cast<int>(copies.size())});
      copies.push_back(std::move(l));
      released.push_back({{r, consumer}, 1.0f});  // the caller says when it frees
      return released.size() - 1;
    };
    // The end of segment s of n: the release of the block used in it.
    const auto segment_end = [](int s, int n) {
      return s + 1 == n ? 1.0f : static_cast<float>(s + 1) / static_cast<float>(n);
    };
    for (int i = 0; i < ops; ++i) {
      const Op& op = out[static_cast<std::size_t>(i)];
      if (op.stream != Stream::Compute) continue;
      if (op.kind == OpKind::F || op.kind == OpKind::B || op.kind == OpKind::BW) {
        if (op.chunk < 0 || op.chunk >= ix_.stages.chunks) continue;
        const auto& b = blocks[static_cast<std::size_t>(op.chunk)];
        const int n = static_cast<int>(b.size());
        for (int s = 0; s < n; ++s) {
          const int layer = op.kind == OpKind::F ? s : n - 1 - s;
          const std::size_t k = load(i, op.chunk, layer, b[static_cast<std::size_t>(layer)]);
          released[k].ready_after = segment_end(s, n);
        }
      } else if (op.kind == OpKind::OPT && ratio > 0) {
        // The optimizer state of every offloaded block, chunk by chunk, in layer order;
        // a block's slot frees when its OFFLOAD (state + updated weights) is done.
        std::vector<std::pair<int, int>> order;  // (chunk, layer)
        for (int c = 0; c < ix_.stages.chunks; ++c)
          for (int l = 0; l < static_cast<int>(blocks[static_cast<std::size_t>(c)].size()); ++l) order.push_back({c, l});
        const int n = static_cast<int>(order.size());
        std::vector<std::size_t> ordinal(order.size());
        int written = 0;  // OFFLOADs placed so far
        const auto offload = [&] {
          const auto [c, l] = order[static_cast<std::size_t>(written)];
          Op o;
          o.kind = OpKind::OFFLOAD;
          o.stream = Stream::Copy;
          o.chunk = c;
          o.tag = l;
          o.bytes = blocks[static_cast<std::size_t>(c)][static_cast<std::size_t>(l)] * (ratio + 1);
          o.est_seconds = seconds(o.bytes);
          o.deps.push_back({r, i});
          o.ready_after = segment_end(written, n);
          released[ordinal[static_cast<std::size_t>(written)]] = {{r, ops + static_cast<int>(copies.size())}, 1.0f};
          copies.push_back(std::move(o));
          ++written;
        };
        for (int s = 0; s < n; ++s) {
          if (s >= window) offload();  // frees the slot this LOAD takes
          const auto [c, l] = order[static_cast<std::size_t>(s)];
          ordinal[static_cast<std::size_t>(s)] =
              load(i, c, l, blocks[static_cast<std::size_t>(c)][static_cast<std::size_t>(l)] * ratio);
        }
        while (written < n) offload();
      }
    }
    out.insert(out.end(), std::make_move_iterator(copies.begin()), std::make_move_iterator(copies.end()));
  }

  const Plan& plan_;
  const LoweringOptions& options_;
  detail::PlanIndex ix_;
  std::vector<std::vector<int>> compute_;   ///< [rank] old indices of compute ops (OPT aside)
  std::vector<std::vector<int>> position_;  ///< [rank][old index] → position in compute_, −1
  std::vector<int> given_opt_;              ///< [rank] old index of an OPT in the input, −1
  std::vector<std::vector<std::int64_t>> ends_;  ///< [rank][position] end of compute op in the reference timeline

  std::vector<std::vector<int>> sends_;          ///< [rank] positions of compute ops that feed another rank
  std::vector<std::vector<Incoming>> incoming_;  ///< [rank] transfers it receives, run by sender
  bool sorted_ = true;                           ///< every rank's ends grow along its sends_
  // The rank being lowered (buffers reused from rank to rank).
  std::vector<Incoming> own_buf_;
  std::vector<std::int64_t> head_;  ///< ready time of each run's next transfer
  std::vector<CommItem> seq_;   ///< its comm ops in the global order
  std::vector<int> input_of_;   ///< [old index] → index in seq_ of the RECV feeding it, −1
  std::vector<std::vector<int>> new_index_;  ///< [rank][old index] → new index
  /// Copied ops (rank, new index, how many leading deps) whose deps need new indices.
  std::vector<std::tuple<int, int, int>> remap_;
  bool reindex_ = false;          ///< turn ix_ into the output's index (keep_index)
  std::vector<int> new_offset_;   ///< the output's PlanIndex::offset, while reindexing
};

}  // namespace

Plan lower(const Plan& compute_only, const LoweringOptions& options) {
  if (compute_only.lowered)
    throw Error("lower: the plan is already lowered (plan.lowered is true); lower the compute-only plan");
  return Lowerer(compute_only, options).run();
}

LoweredPlan lower_validated(const Plan& compute_only, const LoweringOptions& options,
                            const ValidateOptions& checks) {
  if (compute_only.lowered)
    throw Error("lower: the plan is already lowered (plan.lowered is true); lower the compute-only plan");
  LoweredPlan out;
  detail::PlanIndex index;
  bool kept = false;
  {  // the lowerer's tables go before the validator's are built
    Lowerer lowerer(compute_only, options);
    lowerer.keep_index();
    out.plan = lowerer.run();
    kept = lowerer.index_kept();
    if (kept) index = lowerer.take_index();
  }
  out.report = kept ? detail::validate_indexed(out.plan, std::move(index), checks) : validate(out.plan, checks);
  return out;
}

}  // namespace tdpipe::ir
