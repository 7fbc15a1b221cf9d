// validate.cpp — rejects broken plans before anything runs; reports memory.
//
// Checks run in phases (shape, fields, coverage, order, SEND/RECV pairing,
// deadlock); the first phase with problems throws one tdpipe::Error listing them
// (up to kListed, then a count), each naming the rank, the op's position and its
// text form. Memory: walking each rank's ops in order, an F adds one in-flight
// activation and its mem_bytes, a B/BW removes one; every compute op's mem_bytes
// (negative for B/BW/W that free) is summed; the peaks are reported.
#include "tdpipe/ir/validate.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "plan_index.hpp"
#include "prefault.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "tdpipe/ir/replay.hpp"

namespace tdpipe::ir {
namespace {

constexpr std::size_t kListed = 12;

class Checker {
 public:
  Checker(const Plan& plan, const ValidateOptions& options) : plan_(plan), options_(options) {}
  /// With the plan's index already built (ir::lower builds its output's as it goes).
  Checker(const Plan& plan, const ValidateOptions& options, detail::PlanIndex index)
      : plan_(plan), options_(options), ix_(std::move(index)), have_index_(true) {}

  ValidationReport run() {
    check_shape();
    flush("plan shape");
    if (!have_index_) ix_ = detail::build_index(plan_);
    check_fields();
    flush("op fields");
    if (plan_.serve) {
      check_serving();
      flush("serving ops");
      if (options_.check_deadlock)
        detail::replay_indexed(plan_, ix_, [](const Op&, int) -> std::int64_t { return 1; }, false);
      return memory();
    }
    check_coverage();
    flush("compute ops");
    check_order();
    flush("op order");
    if (has_p2p()) {
      check_p2p();
      flush("SEND/RECV");
    }
    // Unit durations: the question is only whether every op can complete.
    if (options_.check_deadlock)
      detail::replay_indexed(plan_, ix_, [](const Op&, int) -> std::int64_t { return 1; }, false);
    return memory();
  }

 private:
  const Op& op(int g) const {
    const auto [r, i] = ix_.locate(g);
    return plan_.ranks[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
  }
  /// "rank 1 op #5 F3.c1"
  std::string where(int g) const {
    const auto [r, i] = ix_.locate(g);
    return fmt::format("rank {} op #{} {}", r, i, op_to_text(op(g)));
  }
  int rank_of(int g) const { return ix_.locate(g).first; }

  void problem(std::string text) {
    ++count_;
    if (problems_.size() < kListed) problems_.push_back(std::move(text));
  }
  void flush(const char* phase) {
    if (problems_.empty()) return;
    std::string msg = fmt::format("invalid plan{}: {} problem(s) with {}:",
                                  plan_.schedule.empty() ? "" : " (" + plan_.schedule + ")", count_, phase);
    for (const auto& p : problems_) msg += "\n  " + p;
    if (count_ > problems_.size()) msg += fmt::format("\n  … and {} more", count_ - problems_.size());
    throw Error(msg);
  }

  void check_shape() {
    const int p = plan_.num_ranks();
    if (p == 0) problem("the plan has no ranks");
    if (plan_.stages != 0 && plan_.stages != p)
      problem(fmt::format("plan.stages is {} but the plan lists {} rank(s)", plan_.stages, p));
    if (plan_.microbatches < 1) problem(fmt::format("plan.microbatches is {}; expected ≥ 1", plan_.microbatches));
    if (plan_.chunks < 1) problem(fmt::format("plan.chunks is {}; expected ≥ 1", plan_.chunks));
    if (plan_.slices < 1) problem(fmt::format("plan.slices is {}; expected ≥ 1", plan_.slices));
    if (plan_.stage_of.empty() || p == 0 || plan_.chunks < 1) return;
    if (static_cast<int>(plan_.stage_of.size()) != p) {
      problem(fmt::format("stage_of has {} row(s); expected one per rank ({})", plan_.stage_of.size(), p));
      return;
    }
    const int stages = p * plan_.chunks;
    std::vector<std::pair<int, int>> owner(static_cast<std::size_t>(stages), {-1, -1});
    for (int r = 0; r < p; ++r) {
      const auto& row = plan_.stage_of[static_cast<std::size_t>(r)];
      if (static_cast<int>(row.size()) != plan_.chunks) {
        problem(fmt::format("stage_of[{}] has {} entries; expected one per chunk ({})", r, row.size(),
                            plan_.chunks));
        continue;
      }
      for (int c = 0; c < plan_.chunks; ++c) {
        const int vs = row[static_cast<std::size_t>(c)];
        if (vs < 0 || vs >= stages) {
          problem(fmt::format("stage_of[{}][{}] = {}; expected a virtual stage in 0..{}", r, c, vs, stages - 1));
          continue;
        }
        auto& o = owner[static_cast<std::size_t>(vs)];
        if (o.first >= 0)
          problem(fmt::format("virtual stage {} is run by rank {} chunk {} and by rank {} chunk {}", vs,
                              o.first, o.second, r, c));
        else
          o = {r, c};
      }
    }
    for (int vs = 0; vs < stages; ++vs)
      if (owner[static_cast<std::size_t>(vs)].first < 0)
        problem(fmt::format("virtual stage {} is run by no rank's chunk (stage_of)", vs));
  }

  /// SEND/RECV fields the pairing check compares, per (key, payload), gathered here in
  /// op order: check_p2p then reads small arrays in key order instead of ops spread
  /// over the whole plan (a lowered plan is 125 MB at p = 64, m = 1024, v = 4).
  void note_transfer(const Op& o, int rank, int g) {
    const auto [slot, key] = detail::slot_and_key(ix_, o, rank);
    if (key < 0 || ix_.cell(slot, key) != g) return;  // duplicates are reported on their own
    const std::size_t at = static_cast<std::size_t>(key) * 2 +
                           (slot == detail::kSlotSendB || slot == detail::kSlotRecvB ? 1 : 0);
    if (send_peer_.empty()) {
      const std::size_t n = static_cast<std::size_t>(ix_.keys()) * 2;
      detail::assign_prefaulted(send_peer_, n, -1);
      detail::assign_prefaulted(send_bytes_, n, std::int64_t{0});
      detail::assign_prefaulted(recv_bytes_, n, std::int64_t{0});
    }
    if (slot == detail::kSlotSendF || slot == detail::kSlotSendB) {
      send_peer_[at] = o.peer;
      send_bytes_[at] = o.bytes;
    } else {
      recv_bytes_[at] = o.bytes;
    }
  }

  std::map<std::pair<int, int>, int> gates_of_;  ///< (rank, LOAD's index) → ops it gates

  /// The kind of the op `d` names; CKPT (neither compute nor LOAD) when there is none.
  OpKind dep_kind(const OpRef& d) const {
    if (d.rank < 0 || d.rank >= plan_.num_ranks() || d.index < 0 ||
        d.index >= static_cast<int>(plan_.ranks[static_cast<std::size_t>(d.rank)].size()))
      return OpKind::CKPT;
    return plan_.ranks[static_cast<std::size_t>(d.rank)][static_cast<std::size_t>(d.index)].kind;
  }

  void check_fields() {
    const int p = plan_.num_ranks();
    report_.ranks.assign(plan_.ranks.size(), RankMemory{});
    for (int r = 0; r < p; ++r) {
      const auto& ops = plan_.ranks[static_cast<std::size_t>(r)];
      const int base = ix_.offset[static_cast<std::size_t>(r)];
      RankMemory& mem = report_.ranks[static_cast<std::size_t>(r)];
      int inflight = 0;
      double bytes = 0;
      for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
        const Op& o = ops[static_cast<std::size_t>(i)];
        const int g = base + i;
        note_memory(o, mem, inflight, bytes);
        const bool ids = is_chunk_work(o.kind) || detail::p2p_kind(o.kind);
        if (ids) {
          if (o.mb < 0 || o.mb >= plan_.microbatches)
            problem(fmt::format("{}: micro-batch {} outside 0..{} (plan.microbatches = {})", where(g), o.mb,
                                plan_.microbatches - 1, plan_.microbatches));
          if (o.chunk < 0 || o.chunk >= plan_.chunks)
            problem(fmt::format("{}: chunk {} outside 0..{} (plan.chunks = {})", where(g), o.chunk,
                                plan_.chunks - 1, plan_.chunks));
          if (o.slice < 0 || o.slice >= plan_.slices)
            problem(fmt::format("{}: slice {} outside 0..{} (plan.slices = {})", where(g), o.slice,
                                plan_.slices - 1, plan_.slices));
        }
        if (detail::p2p_kind(o.kind)) {
          note_transfer(o, r, g);
          if (o.payload != OpKind::F && o.payload != OpKind::B)
            problem(fmt::format("{}: payload {}; expected F (activation) or B (gradient)", where(g),
                                to_string(o.payload)));
          if (o.peer < 0 || o.peer >= p || o.peer == r)
            problem(fmt::format("{}: peer {}; expected another rank in 0..{}", where(g), o.peer, p - 1));
        }
        // Every engine times an op by it (a compressed all-reduce: its kernels); 9e9 s keeps
        // every time inside int64 ns.
        if (!(o.est_seconds >= 0 && o.est_seconds <= 9e9))
          problem(fmt::format("{}: est_seconds {}; expected a duration from 0 to 9e9 s", where(g), o.est_seconds));
        if (o.ready_after != 1.0f) {
          if (!(o.ready_after >= 0.0f && o.ready_after < 1.0f))
            problem(fmt::format("{}: ready_after {}; expected a fraction from 0 to 1", where(g), o.ready_after));
          else if (o.kind == OpKind::LOAD || o.kind == OpKind::OFFLOAD) {
            if (o.deps.empty() || o.deps.front().rank != r || !is_compute(dep_kind(o.deps.front())))
              problem(fmt::format("{}: ready_after {} applies to a copy's first dependency, a compute op on its "
                                  "own rank (the segment that releases its block)",
                                  where(g), o.ready_after));
          } else if (!detail::collective_kind(o.kind) || o.deps.empty() || o.deps.front().rank != r)
            problem(fmt::format("{}: ready_after {} applies to a collective's first dependency on its own rank "
                                "(the chunk's last backward op)",
                                where(g), o.ready_after));
        }
        // Host ↔ device copies run on the copy stream, and only they do.
        if ((o.kind == OpKind::LOAD || o.kind == OpKind::OFFLOAD) != (o.stream == Stream::Copy))
          problem(fmt::format("{}: a {} op on the {} stream; LOAD and OFFLOAD run on the copy stream, and only they",
                              where(g), to_string(o.kind), to_string(o.stream)));
        if (o.kind == OpKind::LOAD && o.bytes <= 0)
          problem(fmt::format("{}: LOAD of {} bytes; expected the block's bytes (> 0)", where(g), o.bytes));
        for (const OpRef& d : o.deps) {
          const bool ok = d.rank >= 0 && d.rank < p && d.index >= 0 &&
                          d.index < static_cast<int>(plan_.ranks[static_cast<std::size_t>(d.rank)].size());
          if (!ok)
            problem(fmt::format("{}: depends on rank {} op #{}, which does not exist", where(g), d.rank, d.index));
          else if (d.rank == r && d.index == i)
            problem(fmt::format("{}: depends on itself", where(g)));
          else if (d.rank != r && is_weight_gate(o.kind, dep_kind(d)))
            problem(fmt::format("{}: waits for a LOAD on rank {}; a LOAD brings weights to its own rank's device",
                                where(g), d.rank));
          else if (is_weight_gate(o.kind, dep_kind(d)))
            ++gates_of_[{r, d.index}];
        }
      }
    }
    // A LOAD brings a block for one op: one that no op uses would stay on the device.
    for (int r = 0; r < p; ++r) {
      const auto& ops = plan_.ranks[static_cast<std::size_t>(r)];
      for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
        if (ops[static_cast<std::size_t>(i)].kind != OpKind::LOAD) continue;
        const auto it = gates_of_.find({r, i});
        const int uses = it == gates_of_.end() ? 0 : it->second;
        if (uses != 1)
          problem(fmt::format("{}: a LOAD gates {} ops; expected the one F, B, BW or OPT of its rank that lists it",
                              where(ix_.offset[static_cast<std::size_t>(r)] + i), uses));
      }
    }
  }

  Op expected(OpKind kind, int mb, int vs, int s) const {
    Op o;
    o.kind = kind;
    o.mb = mb;
    o.chunk = ix_.stages.chunk_of[static_cast<std::size_t>(vs)];
    o.slice = s;
    return o;
  }

  void check_coverage() {
    for (const auto& d : ix_.duplicates) {
      if (d.slot > detail::kSlotW) continue;  // SEND/RECV duplicates: check_p2p
      const Op& a = op(d.first);
      const Op& b = op(d.second);
      if (a.kind != b.kind)
        problem(fmt::format("{} and {}: a backward is either one BW or one B plus one W", where(d.first),
                            where(d.second)));
      else
        problem(fmt::format("duplicate {}: {} and {}", op_to_text(a), where(d.first), where(d.second)));
    }
    const int m = plan_.microbatches, V = ix_.stages.virtual_stages(), S = plan_.slices;
    for (int vs = 0; vs < V; ++vs)
      for (int mb = 0; mb < m; ++mb) {
        const int r = ix_.stages.rank_of[static_cast<std::size_t>(vs)];
        if (r < 0) continue;
        for (int s = 0; s < S; ++s) {
          const int f = ix_.find(detail::kSlotF, mb, vs, s);
          const int b = ix_.find(detail::kSlotBwd, mb, vs, s);
          const int w = ix_.find(detail::kSlotW, mb, vs, s);
          auto detail_of = [&] { return fmt::format("micro-batch {}, virtual stage {}, slice {}", mb, vs, s); };
          if (f < 0)
            problem(fmt::format("missing {} on rank {} ({})", op_to_text(expected(OpKind::F, mb, vs, s)), r,
                                detail_of()));
          if (b < 0) {
            if (w >= 0)
              problem(fmt::format("missing {} on rank {}: {} has no input-gradient op before it",
                                  op_to_text(expected(OpKind::B, mb, vs, s)), r, where(w)));
            else
              problem(fmt::format("missing {} (or B and W) on rank {} ({})",
                                  op_to_text(expected(OpKind::BW, mb, vs, s)), r, detail_of()));
          } else if (op(b).kind == OpKind::B && w < 0) {
            problem(fmt::format("missing {} on rank {} ({} computes the input gradient only)",
                                op_to_text(expected(OpKind::W, mb, vs, s)), r, where(b)));
          } else if (op(b).kind == OpKind::BW && w >= 0) {
            problem(fmt::format("{} and {}: a fused BW already computes the weight gradient", where(b), where(w)));
          }
        }
      }
  }

  /// `later` must come after `earlier` on one rank; both global indices.
  void need_before(int earlier, int later, const char* why) {
    // Global indices grow with the rank, so `earlier < later` settles the common case
    // without finding either op's rank.
    if (earlier < 0 || later < 0 || earlier < later || rank_of(earlier) != rank_of(later)) return;
    const auto [r, i] = ix_.locate(later);
    const auto [r2, i2] = ix_.locate(earlier);
    problem(fmt::format("rank {}: {} (op #{}) comes before {} (op #{}); {}", r, op_to_text(op(later)), i,
                        op_to_text(op(earlier)), i2, why));
    (void)r2;
  }

  void check_order() {
    const int m = plan_.microbatches, V = ix_.stages.virtual_stages(), S = plan_.slices;
    for (int vs = 0; vs < V; ++vs)
      for (int mb = 0; mb < m; ++mb)
        for (int s = 0; s < S; ++s) {
          const int f = ix_.find(detail::kSlotF, mb, vs, s);
          const int b = ix_.find(detail::kSlotBwd, mb, vs, s);
          const int w = ix_.find(detail::kSlotW, mb, vs, s);
          need_before(f, b, "a backward needs its forward's activations");
          need_before(b, w, "W needs the output gradient its B received");
          if (s > 0) {
            need_before(ix_.find(detail::kSlotF, mb, vs, s - 1), f, "slices of a micro-batch run forward in order");
            need_before(b, ix_.find(detail::kSlotBwd, mb, vs, s - 1), "backward runs slices in reverse order");
          }
        }
  }

  /// A serving plan: every rank runs every batch of the table once, as PREFILL when the
  /// batch has a prompt and DECODE otherwise, in the table's order; its KV bytes stay
  /// within the rank's capacity; the k-th SEND from a to b and the k-th RECV on b from a
  /// carry the same batch, payload and bytes (the engines pair them so).
  void check_serving() {
    const ServePlan& sv = *plan_.serve;
    const int p = plan_.num_ranks();
    const int batches = static_cast<int>(sv.batches.size());
    if (plan_.microbatches != batches)
      problem(fmt::format("plan.microbatches is {}; a serving plan's is its batch count, {}", plan_.microbatches,
                          batches));
    if (plan_.chunks != 1 || plan_.slices != 1)
      problem(fmt::format("a serving plan has one chunk and one slice per rank (got v = {}, S = {})", plan_.chunks,
                          plan_.slices));
    for (const char* what : {"kv_bytes_per_token", "kv_capacity_bytes"}) {
      const auto& v = std::string(what) == "kv_bytes_per_token" ? sv.kv_bytes_per_token : sv.kv_capacity_bytes;
      if (static_cast<int>(v.size()) != p)
        problem(fmt::format("plan.serve.{} has {} entries for {} ranks; expected one per rank", what, v.size(), p));
    }
    std::map<std::pair<int, int>, std::vector<int>> sends, recvs;  // (from, to) → global indices in order
    for (int r = 0; r < p; ++r) {
      const auto& ops = plan_.ranks[static_cast<std::size_t>(r)];
      const int base = ix_.offset[static_cast<std::size_t>(r)];
      int next = 0;
      for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
        const Op& o = ops[static_cast<std::size_t>(i)];
        const int g = base + i;
        if (is_p2p(o.kind)) {
          (o.kind == OpKind::SEND ? sends[{r, o.peer}] : recvs[{o.peer, r}]).push_back(g);
          continue;
        }
        if (!is_serving(o.kind)) {
          problem(fmt::format("{}: a serving plan runs PREFILL, DECODE, SEND and RECV only", where(g)));
          continue;
        }
        if (o.mb != next) {
          problem(fmt::format("{}: batch {} where batch {} comes next; every rank runs the table's batches once, "
                              "in order", where(g), o.mb, next));
          next = o.mb;
        }
        ++next;
        if (o.mb < 0 || o.mb >= batches) continue;
        const bool prefill = sv.batches[static_cast<std::size_t>(o.mb)].has_prefill();
        if ((o.kind == OpKind::PREFILL) != prefill)
          problem(fmt::format("{}: batch {} holds {}; expected {}", where(g), o.mb,
                              prefill ? "a prompt" : "no prompt", prefill ? "PREFILL" : "DECODE"));
        if (r < static_cast<int>(sv.kv_capacity_bytes.size()) &&
            static_cast<double>(o.bytes) > sv.kv_capacity_bytes[static_cast<std::size_t>(r)] * (1 + 1e-9) + 1)
          problem(fmt::format("{}: the KV cache holds {} bytes after it, over the rank's capacity of {:.0f} bytes",
                              where(g), o.bytes, sv.kv_capacity_bytes[static_cast<std::size_t>(r)]));
      }
      if (next != batches)
        problem(fmt::format("rank {}: runs batches 0..{} of {}; every rank runs every batch", r, next - 1, batches));
    }
    for (const auto& [pair, list] : sends) {
      const auto it = recvs.find(pair);
      const std::size_t matched = it == recvs.end() ? 0 : it->second.size();
      if (matched != list.size())
        problem(fmt::format("{} SEND(s) from rank {} to rank {} but {} RECV(s); each SEND needs its RECV",
                            list.size(), pair.first, pair.second, matched));
      for (std::size_t k = 0; k < std::min(matched, list.size()); ++k) {
        const Op& a = op(list[k]);
        const Op& b = op(it->second[k]);
        if (a.mb != b.mb || a.payload != b.payload || a.bytes != b.bytes)
          problem(fmt::format("{} is paired with {} (the {}th transfer from rank {} to rank {}); they differ in "
                              "batch, payload or bytes", where(list[k]), where(it->second[k]), k, pair.first,
                              pair.second));
      }
    }
    for (const auto& [pair, list] : recvs)
      if (!sends.count(pair))
        problem(fmt::format("{}: no SEND from rank {} to rank {}", where(list.front()), pair.first, pair.second));
    if (problems_.empty()) check_serving_table();
  }

  /// The serving table against itself and the ops: each request's items continue its
  /// cache (or restart it from position 0 once dropped), produce its output tokens once
  /// each in order and all of them; a preempted request held a cache; every
  /// PREFILL/DECODE's bytes are the KV the table implies (blocks after the batch, before
  /// its finished requests are freed); on rank 0 of a pipeline each batch waits for the
  /// tokens of its requests' previous batch (a RECV from the last rank).
  void check_serving_table() {
    const ServePlan& sv = *plan_.serve;
    const int p = plan_.num_ranks();
    const std::size_t n = sv.requests.size();
    std::vector<long long> held(n, 0);
    std::vector<int> done(n, 0), prev(n, -1);
    std::vector<int> seen_in(n, -1);
    std::vector<long long> blocks_after;
    std::vector<std::vector<int>> needs(sv.batches.size());  // batch → previous batches of its requests
    long long blocks = 0;
    auto fail = [&](int j, const std::string& what) {
      problem(fmt::format("plan.serve.batches[{}]: {}", j, what));
    };
    for (int j = 0; j < static_cast<int>(sv.batches.size()); ++j) {
      const ServeBatch& b = sv.batches[static_cast<std::size_t>(j)];
      for (int r : b.preempted) {
        if (r < 0 || static_cast<std::size_t>(r) >= n || held[static_cast<std::size_t>(r)] == 0) {
          fail(j, fmt::format("request {} is preempted but holds no KV cache", r));
          continue;
        }
        blocks -= kv_blocks(held[static_cast<std::size_t>(r)], sv.block_tokens);
        held[static_cast<std::size_t>(r)] = 0;
      }
      for (const ServeItem& i : b.items) {
        const std::size_t r = static_cast<std::size_t>(i.request);
        if (i.request < 0 || r >= n) {
          fail(j, fmt::format("request {} outside 0..{}", i.request, n - 1));
          continue;
        }
        const Request& q = sv.requests[r];
        if (seen_in[r] == j) fail(j, fmt::format("request {} twice in one batch", i.request));
        seen_in[r] = j;
        if (done[r] >= q.output) fail(j, fmt::format("request {} after its last output token", i.request));
        if (i.position != held[r] && !(i.position == 0 && held[r] == 0))
          fail(j, fmt::format("request {} at position {}, but its cache holds {} tokens", i.request, i.position,
                              held[r]));
        if (i.position + i.tokens - q.prompt != done[r])
          fail(j, fmt::format("request {}'s item produces output token {}; token {} comes next", i.request,
                              i.position + i.tokens - q.prompt, done[r]));
        blocks += kv_blocks(i.position + i.tokens, sv.block_tokens) - kv_blocks(held[r], sv.block_tokens);
        held[r] = i.position + i.tokens;
        ++done[r];
        if (prev[r] >= 0) needs[static_cast<std::size_t>(j)].push_back(prev[r]);
        prev[r] = j;
      }
      blocks_after.push_back(blocks);
      for (const ServeItem& i : b.items) {
        const std::size_t r = static_cast<std::size_t>(i.request);
        if (r < n && done[r] == sv.requests[r].output) {
          blocks -= kv_blocks(held[r], sv.block_tokens);
          held[r] = 0;
        }
      }
    }
    for (std::size_t r = 0; r < n; ++r)
      if (done[r] != sv.requests[r].output)
        problem(fmt::format("plan.serve: request {} produces {} of its {} output tokens", r, done[r],
                            sv.requests[r].output));
    if (!problems_.empty()) return;
    for (int r = 0; r < p; ++r) {
      const auto& ops = plan_.ranks[static_cast<std::size_t>(r)];
      std::vector<int> token_recv(sv.batches.size(), -1);  // rank 0: batch → its token RECV
      for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
        const Op& o = ops[static_cast<std::size_t>(i)];
        if (r == 0 && o.kind == OpKind::RECV && o.peer == p - 1 && o.mb >= 0 &&
            o.mb < static_cast<int>(sv.batches.size()))
          token_recv[static_cast<std::size_t>(o.mb)] = i;
      }
      const double per_block = sv.kv_bytes_per_token[static_cast<std::size_t>(r)] * sv.block_tokens;
      for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
        const Op& o = ops[static_cast<std::size_t>(i)];
        if (!is_serving(o.kind)) continue;
        const std::size_t j = static_cast<std::size_t>(o.mb);
        const auto expected = static_cast<std::int64_t>(std::llround(static_cast<double>(blocks_after[j]) * per_block));
        if (o.bytes != expected)
          problem(fmt::format("{}: KV bytes {}; the serving table implies {} ({} blocks of {} tokens)",
                              where(ix_.offset[static_cast<std::size_t>(r)] + i), o.bytes, expected, blocks_after[j],
                              sv.block_tokens));
        if (r != 0 || p == 1) continue;
        for (int b : needs[j]) {
          const int recv = token_recv[static_cast<std::size_t>(b)];
          const bool waits = recv >= 0 && std::any_of(o.deps.begin(), o.deps.end(), [&](const OpRef& d) {
            return d.rank == 0 && d.index == recv;
          });
          if (!waits)
            problem(fmt::format("{}: does not wait for the tokens of batch {} (a RECV from rank {} among its deps), "
                                "which its requests need",
                                where(ix_.offset[0] + i), b, p - 1));
        }
      }
    }
  }

  bool has_p2p() const {
    for (const auto& ops : plan_.ranks)
      for (const Op& o : ops)
        if (is_p2p(o.kind)) return true;
    return plan_.lowered;
  }

  static Op comm(OpKind kind, const Op& producer, OpKind payload, int peer) {
    Op o;
    o.kind = kind;
    o.payload = payload;
    o.mb = producer.mb;
    o.chunk = producer.chunk;
    o.slice = producer.slice;
    o.peer = peer;
    o.stream = Stream::P2P;
    return o;
  }

  void check_p2p() {
    const auto& st = ix_.stages;
    for (const auto& d : ix_.duplicates)
      if (d.slot > detail::kSlotW)
        problem(fmt::format("duplicate {}: {} and {}", op_to_text(op(d.first)), where(d.first), where(d.second)));
    const int V = st.virtual_stages();
    const int keys = ix_.keys();
    // Every cross-rank data dependency needs its SEND on the producer's rank and its RECV on the consumer's.
    // An op filed under key k in a compute or SEND slot is on the rank that runs k's
    // virtual stage (build_index files it by its own rank's stage), so only a RECV
    // (filed by its peer's stage) needs locate().
    auto key_rank = [&](int k) { return st.rank_of[static_cast<std::size_t>(ix_.stage_of_key(k))]; };
    for (int k = 0; k < keys; ++k) {
      const int vs = ix_.stage_of_key(k);
      for (int which = 0; which < 2; ++which) {
        const bool fwd = which == 0;
        const int prod = ix_.cell(fwd ? detail::kSlotF : detail::kSlotBwd, k);
        const int send = ix_.cell(fwd ? detail::kSlotSendF : detail::kSlotSendB, k);
        const int recv = ix_.cell(fwd ? detail::kSlotRecvF : detail::kSlotRecvB, k);
        const int to = fwd ? vs + 1 : vs - 1;
        const int here = key_rank(k);
        const bool cross = prod >= 0 && to >= 0 && to < V && st.rank_of[static_cast<std::size_t>(to)] != here;
        if (cross) {
          const int from_rank = here;
          const int to_rank = st.rank_of[static_cast<std::size_t>(to)];
          const OpKind payload = fwd ? OpKind::F : OpKind::B;
          // Texts only when there is something to report.
          auto s_text = [&] { return op_to_text(comm(OpKind::SEND, op(prod), payload, to_rank)); };
          auto r_text = [&] { return op_to_text(comm(OpKind::RECV, op(prod), payload, from_rank)); };
          if (send < 0 && recv < 0)
            problem(fmt::format("{} feeds virtual stage {} on rank {} but neither {} on rank {} nor {} on rank {} "
                                "exists",
                                where(prod), to, to_rank, s_text(), from_rank, r_text(), to_rank));
          else if (send < 0)
            problem(fmt::format("{} has no matching {} on rank {}", where(recv), s_text(), from_rank));
          else if (recv < 0)
            problem(fmt::format("{} has no matching {} on rank {}", where(send), r_text(), to_rank));
          else {
            // Gathered by note_transfer (send and recv are the ops filed here).
            const std::size_t at = static_cast<std::size_t>(k) * 2 + (fwd ? 0 : 1);
            const int send_peer = send_peer_[at];
            // The RECV is almost always where it belongs: a range test, not locate().
            const int recv_rank = recv >= ix_.offset[static_cast<std::size_t>(to_rank)] &&
                                          recv < ix_.offset[static_cast<std::size_t>(to_rank) + 1]
                                      ? to_rank
                                      : rank_of(recv);
            // A SEND filed under this key is on the producer's rank by construction
            // (key_rank), so only its peer can be wrong.
            if (send_peer != to_rank)
              problem(fmt::format("{} goes to rank {} but the consumer (virtual stage {}) runs on rank {}",
                                  where(send), send_peer, to, to_rank));
            if (recv_rank != to_rank)
              problem(fmt::format("{}: the consumer (virtual stage {}) runs on rank {}, so the RECV belongs there",
                                  where(recv), to, to_rank));
            if (send_bytes_[at] != recv_bytes_[at])
              problem(fmt::format("{} carries {} bytes but {} expects {}", where(send), send_bytes_[at], where(recv),
                                  recv_bytes_[at]));
          }
          continue;
        }
        // No cross-rank dependency here: any SEND/RECV filed under this key is stray.
        for (int g : {send, recv}) {
          if (g < 0) continue;
          if (prod < 0)
            problem(fmt::format("{}: no {} produces what it carries", where(g),
                                op_to_text(expected(fwd ? OpKind::F : OpKind::BW, ix_.mb_of_key(k), vs,
                                                    ix_.slice_of_key(k)))));
          else
            problem(fmt::format("{}: {} and its consumer (virtual stage {}) are on one rank or the consumer does "
                                "not exist; no transfer is needed",
                                where(g), where(prod), to));
        }
      }
    }
  }

  /// The memory report, walked in check_fields' pass over the ops (one pass over a
  /// plan of millions of ops instead of two); returned only once every check passed.
  void note_memory(const Op& o, RankMemory& mem, int& inflight, double& bytes) const {
    if (!detail::compute_kind(o.kind)) return;
    if (o.kind == OpKind::F) ++inflight;
    if (o.kind == OpKind::B || o.kind == OpKind::BW) --inflight;
    bytes += o.mem_bytes;
    mem.peak_inflight = std::max(mem.peak_inflight, inflight);
    mem.peak_activation_bytes = std::max(mem.peak_activation_bytes, bytes);
  }
  ValidationReport memory() {
    const auto& budget = plan_.memory_budget_bytes;
    if (!budget.empty() && budget.size() != report_.ranks.size())
      throw Error(fmt::format("plan.memory_budget_bytes has {} entries for {} ranks; expected one per rank",
                              budget.size(), report_.ranks.size()));
    for (std::size_t r = 0; r < budget.size(); ++r) {
      RankMemory& m = report_.ranks[r];
      m.budget_bytes = budget[r];
      if (m.peak_activation_bytes > budget[r] * (1 + 1e-9) + 1e-6)
        throw Error(fmt::format("rank {}: peak activation memory {:.4g} bytes exceeds the plan's memory budget of "
                                "{:.4g} bytes",
                                r, m.peak_activation_bytes, budget[r]));
    }
    return std::move(report_);
  }

  const Plan& plan_;
  const ValidateOptions& options_;
  detail::PlanIndex ix_;
  bool have_index_ = false;
  std::vector<std::string> problems_;
  ValidationReport report_;  ///< filled by check_fields
  std::vector<int> send_peer_;                ///< [key·2 + (payload B)] peer of the SEND filed there
  std::vector<std::int64_t> send_bytes_;      ///< … its bytes
  std::vector<std::int64_t> recv_bytes_;      ///< … bytes of the RECV filed there
  std::size_t count_ = 0;
};

}  // namespace

ValidationReport validate(const Plan& plan) { return Checker(plan, ValidateOptions{}).run(); }

ValidationReport validate(const Plan& plan, const ValidateOptions& options) { return Checker(plan, options).run(); }

namespace detail {
ValidationReport validate_indexed(const Plan& plan, PlanIndex index, const ValidateOptions& options) {
  return Checker(plan, options, std::move(index)).run();
}
}  // namespace detail

}  // namespace tdpipe::ir
