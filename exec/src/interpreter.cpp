// interpreter.cpp — one rank's lowered ops on host threads (one per stream, or the
// compute and p2p streams cooperating on one), waits on data (tensors present),
// explicit deps and gradient completeness; records events.
#include "tdpipe/exec/interpreter.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <optional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "tdpipe/exec/faults.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/plan_io.hpp"

namespace tdpipe::exec {
namespace {

using ir::Op;
using ir::OpKind;

// The op's text form (ir/plan_io.hpp), for events and errors.
std::string op_label(const Op& op) { return ir::op_to_text(op); }

std::string key_text(const TensorKey& k) {
  return fmt::format("{} of mb {} slice {} from virtual stage {}",
                     k.payload == OpKind::F ? "activation" : "gradient", k.mb, k.slice, k.stage);
}

struct Item {
  int first = 0, last = 0;  // ops [first, last) of the rank, posted together
};

// What the threads of a rank (or of a group of ranks on one thread) sleep on: a count
// of the changes they may be waiting for, and its condition variable (under
// control.mutex()).
struct Waker {
  std::atomic<std::uint64_t> wakes{0};
  std::condition_variable cv;
};

class RankRun {
 public:
  RankRun(const ir::Plan& plan, int rank, int trace_rank, int step, const Backend& backend,
          RunControl& control, Waker* shared = nullptr)
      : waker_(shared ? shared : &own_waker_),
        plan_(plan),
        ops_(plan.ranks.at(static_cast<std::size_t>(rank))),
        rank_(rank),
        trace_rank_(trace_rank),
        step_(step),
        backend_(backend),
        control_(control),
        done_(ops_.size(), 0),
        events_(ops_.size()) {
    const int chunks = static_cast<int>(plan.stage_of.at(static_cast<std::size_t>(rank)).size());
    grad_ops_.assign(static_cast<std::size_t>(chunks), {});
    reduce_count_.assign(static_cast<std::size_t>(chunks), 0);
    gather_count_.assign(static_cast<std::size_t>(chunks), 0);
    int all_reduces = 0, scatters = 0, compressed = 0;
    for (int i = 0; i < static_cast<int>(ops_.size()); ++i) {
      const Op& op = ops_[static_cast<std::size_t>(i)];
      const int s = static_cast<int>(op.stream);
      if (s < 0 || s >= ir::kStreamCount) throw Error(fmt::format("rank {}: op {} has stream {}", rank, i, s));
      auto& list = items_[static_cast<std::size_t>(s)];
      const bool joins = ir::is_p2p(op.kind) && op.batch >= 0 && !list.empty() &&
                         list.back().last == i && ir::is_p2p(ops_[static_cast<std::size_t>(i - 1)].kind) &&
                         ops_[static_cast<std::size_t>(i - 1)].batch == op.batch;
      if (joins)
        list.back().last = i + 1;
      else
        list.push_back({i, i + 1});
      if (op.kind == OpKind::W || op.kind == OpKind::BW || (op.kind == OpKind::B && !has_w(op))) {
        check_chunk(op, i);
        grad_ops_[static_cast<std::size_t>(op.chunk)].push_back(i);
      }
      if (ir::is_gradient_reduction(op.kind)) {
        check_chunk(op, i);
        reduce_index_[i] = reduce_count_[static_cast<std::size_t>(op.chunk)]++;
        reduce_ops_.push_back(i);
        (op.kind == OpKind::ALLREDUCE ? all_reduces : op.kind == OpKind::REDUCE_SCATTER ? scatters : compressed)++;
      }
      if (op.kind == OpKind::ALL_GATHER) {
        check_chunk(op, i);
        gather_index_[i] = gather_count_[static_cast<std::size_t>(op.chunk)]++;
      }
      if (op.kind == OpKind::OPT) opt_ = i;
      // Parameter offload: the LOADs gating this op's blocks, in the order it uses them.
      for (const ir::OpRef& d : op.deps)
        if (d.rank == rank && d.index >= 0 && d.index < static_cast<int>(ops_.size()) &&
            ir::is_weight_gate(op.kind, ops_[static_cast<std::size_t>(d.index)].kind)) {
          gates_[i].push_back(d.index);
          consumer_[d.index] = i;
        }
    }
    segments_.assign(ops_.size(), 0);
    if (std::any_of(ops_.begin(), ops_.end(), [](const Op& op) { return ir::is_serving(op.kind); })) find_token_inputs();
    if ((all_reduces > 0) + (scatters > 0) + (compressed > 0) > 1)
      throw Error(fmt::format("rank {}: the plan mixes ALLREDUCE, REDUCE_SCATTER and COMPRESSED_ALLREDUCE "
                              "buckets; a rank's optimizer is one of Adam (ALLREDUCE), sharded Adam "
                              "(REDUCE_SCATTER, OPT, ALL_GATHER) or 1-bit Adam (COMPRESSED_ALLREDUCE)", rank));
    // 1-bit Adam: Adam with plain all-reduces for the warm-up steps, then compressed.
    compressed_ = compressed > 0 && step >= plan.scenario.parallel.onebit_warmup_steps;
    if (compressed_ && plan.scenario.parallel.onebit_warmup_steps < 1)
      throw Error(fmt::format("rank {}: 1-bit Adam needs at least one warm-up step to freeze the variance "
                              "(parallel.onebit_warmup_steps = {})", rank, plan.scenario.parallel.onebit_warmup_steps));
    if (plan.data > 1)
      for (int c = 0; c < chunks; ++c) {
        const int reduces = reduce_count_[static_cast<std::size_t>(c)];
        if (reduces == 0)
          throw Error(fmt::format("rank {}: the plan has d = {} replicas but no ALLREDUCE, REDUCE_SCATTER or "
                                  "COMPRESSED_ALLREDUCE for chunk {}: its gradients would diverge", rank, plan.data, c));
        const int gathers = gather_count_[static_cast<std::size_t>(c)];
        if (scatters > 0 && opt_ >= 0 && gathers != reduces)
          throw Error(fmt::format("rank {}: chunk {} has {} REDUCE_SCATTER but {} ALL_GATHER buckets: after a "
                                  "sharded OPT every bucket's parameters must be gathered, or the replicas diverge",
                                  rank, c, reduces, gathers));
      }
    for (int c = 0; c < chunks; ++c)
      if (gather_count_[static_cast<std::size_t>(c)] > 0 && scatters == 0)
        throw Error(fmt::format("rank {}: ALL_GATHER of chunk {} without REDUCE_SCATTER buckets", rank, c));
    tail_done_.assign(static_cast<std::size_t>(chunks), -1);
    tail_total_.assign(static_cast<std::size_t>(chunks), 0);
    for (int c = 0; c < chunks; ++c) {
      const auto& g = grad_ops_[static_cast<std::size_t>(c)];
      if (!g.empty() && reduce_count_[static_cast<std::size_t>(c)] > 0) last_grad_[g.back()] = c;
    }
    if (scatters > 0) {
      sharded_ = true;
      const auto [member, members] = backend.transport->dp_member();
      shard_.member = member;
      shard_.members = members;
      shard_.buckets_per_chunk = reduce_count_;
    }
  }

  // Starts the step: the backend's, and the threads of the streams the rank's main
  // thread does not run (cooperative: the dp and copy streams; threaded: all but compute).
  void begin() {
    backend_.compute->begin_step(step_);
    agrees_ = !backend_.compute->overflow_flags().empty();
  }
  void start_threads() {
    for (int s = cooperative() ? 2 : 1; s < ir::kStreamCount; ++s)
      if (!items_[static_cast<std::size_t>(s)].empty()) threads_[static_cast<std::size_t>(s)] = std::thread([this, s] { worker(s); });
  }
  // Joins the stream threads and ends the step (Aborted if the run failed).
  RankStepResult end() {
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    if (control_.failed()) throw Aborted{};
    RankStepResult out;
    out.loss = backend_.compute->end_step();
    resolve_marks();
    out.events = std::move(events_);
    return out;
  }
  // Cooperative: the compute and p2p streams share the rank's thread (their batches
  // start without waiting); the dp and copy streams keep threads of their own.
  bool cooperative() const { return backend_.runtime == Runtime::cooperative && backend_.transport->can_start(); }
  // Can this rank share its thread with other ranks (run_rank_steps)? Not when it can
  // block on another rank inside an op: OPT's overflow agreement, an injected hang.
  void check_shareable() const {
    if (!cooperative())
      throw Error("ranks share a thread only in the cooperative runtime over a transport that starts batches");
    if (agrees_)
      throw Error("fp16 training agrees on overflow flags at OPT, a wait for every rank: give each rank a thread "
                  "of its own");
    if (backend_.faults)
      for (const FaultSpec& f : backend_.faults->specs())
        if (holds_thread(f.kind) && f.rank == trace_rank_)
          throw Error(fmt::format("an injected {} fault holds its rank's thread: give each rank a thread of its own",
                                  to_string(f.kind)));
  }

  RankStepResult run() {
    begin();
    start_threads();
    if (cooperative()) {
      RankRun* self = this;
      cooperate(&self, 1, *waker_);
    } else {
      worker(0);
    }
    return end();
  }

  // Cooperative: the compute and p2p streams of `n` ranks (sharing `waker`) in their
  // orders on this one thread. Each rank's turn starts its p2p stream's next batch once
  // it is ready (Transport::start: without waiting for the peer), tests the batch in
  // flight, and runs its compute stream's next op once it is ready; a running op takes
  // every rank's p2p turn between its layer blocks (ComputeOp::poll). With nothing to do
  // the thread spins briefly (yielding the core), then parks until a peer, another
  // stream or a retry's deadline wakes it. Each stream keeps its order and one batch in
  // flight, as with a thread per stream, so the plans that complete there complete here
  // (ranks sharing a thread must not block inside an op: check_shareable).
  static void cooperate(RankRun* const* group, std::size_t n, Waker& waker) {
    RunControl& control = group[0]->control_;
    // Called by the compute backend between a long op's layer blocks: the transfers keep
    // posting and completing while it runs, as on a device with a stream for each. An
    // error in another rank's turn is that rank's; the running op then stops (Aborted).
    const std::function<void()> poll = [&] {
      auto deadline = turn_deadline();
      for (std::size_t k = 0; k < n; ++k) {
        RankRun& r = *group[k];
        try {
          if (r.p2p_turn(deadline, true)) r.undescribe();  // what it waited for moved
        } catch (const Aborted&) {
          throw;
        } catch (const std::exception& e) {
          r.fail_in(r.coop_.current_stream, r.coop_.current, e);
          throw Aborted{};
        }
      }
    };
    std::vector<char> over(n, 0);  // the rank's streams finished, or it failed
    for (std::size_t k = 0; k < n; ++k) group[k]->poll_ = &poll;
    while (true) {
      if (control.failed()) break;
      const std::uint64_t seen = waker.wakes.load(std::memory_order_acquire);
      auto deadline = turn_deadline();
      bool moved = false, left = false;
      for (std::size_t k = 0; k < n; ++k) {
        if (over[k]) continue;
        RankRun& r = *group[k];
        try {
          moved |= r.coop_turn(deadline);
          over[k] = r.coop_finished();
          if (over[k]) r.undescribe();  // (its last transfer may have ended in another rank's poll)
        } catch (const Aborted&) {
          over[k] = 1;
        } catch (const std::exception& e) {
          r.fail_in(r.coop_.current_stream, r.coop_.current, e);
          over[k] = 1;
        }
        left |= !over[k];
      }
      if (!left) break;
      if (!moved) park(group, n, waker, seen, deadline);
    }
    for (std::size_t k = 0; k < n; ++k) {
      RankRun& r = *group[k];
      r.poll_ = nullptr;
      r.coop_.request.reset();  // withdraws a batch left in flight (the run is stopping)
      r.control_.set_waiting(r.trace_rank_, ir::Stream::Compute, "");
      r.control_.set_waiting(r.trace_rank_, ir::Stream::P2P, "");
    }
  }

 private:
  // Does the plan run a separate W for B's (mb, chunk, slice)? Without one, B alone
  // is the last gradient op (a plan may skip W on a chunk with no weights).
  bool has_w(const Op& b) const {
    for (const Op& o : ops_)
      if (o.kind == OpKind::W && o.mb == b.mb && o.chunk == b.chunk && o.slice == b.slice) return true;
    return false;
  }
  void check_chunk(const Op& op, int i) const {
    if (op.chunk < 0 || op.chunk >= static_cast<int>(grad_ops_.size()))
      throw Error(fmt::format("rank {} op {} {}: chunk {} but stage_of[{}] has {} chunks", rank_, i,
                              op_label(op), op.chunk, rank_, grad_ops_.size()));
  }
  int stage(int rank, int chunk) const { return stage_of(plan_, rank, chunk); }

  // What a compute op consumes from another virtual stage, if anything.
  std::optional<TensorKey> input_key(const Op& op) const {
    const int s = stage(rank_, op.chunk);
    if ((op.kind == OpKind::F || ir::is_serving(op.kind)) && s > 0) return TensorKey{OpKind::F, s - 1, op.mb, op.slice};
    if ((op.kind == OpKind::B || op.kind == OpKind::BW) && s < plan_.virtual_stages() - 1)
      return TensorKey{OpKind::B, s + 1, op.mb, op.slice};
    return std::nullopt;
  }
  std::optional<TensorKey> output_key(const Op& op) const {
    const int s = stage(rank_, op.chunk);
    if (op.kind == OpKind::F && s < plan_.virtual_stages() - 1) return TensorKey{OpKind::F, s, op.mb, op.slice};
    // Serving: every stage's output goes on, the last stage's (its sampled tokens) to stage 0.
    if (ir::is_serving(op.kind) && plan_.virtual_stages() > 1) return TensorKey{OpKind::F, s, op.mb, op.slice};
    if ((op.kind == OpKind::B || op.kind == OpKind::BW) && s > 0) return TensorKey{OpKind::B, s, op.mb, op.slice};
    return std::nullopt;
  }
  // The tensor a SEND/RECV carries: named by the producer's ids.
  TensorKey comm_key(const Op& op) const {
    if (op.payload != OpKind::F && op.payload != OpKind::B)
      throw Error(fmt::format("rank {}: {}: payload must be F or B", rank_, op_label(op)));
    const int producer = op.kind == OpKind::SEND ? rank_ : op.peer;
    if (producer < 0 || producer >= plan_.num_ranks())
      throw Error(fmt::format("rank {}: {}: peer {} is not a rank of the plan", rank_, op_label(op), op.peer));
    return TensorKey{op.payload, stage(producer, op.chunk), op.mb, op.slice};
  }

  // Serving: a PREFILL/DECODE's deps on RECVs of this rank other than its input's are the
  // token buffers it reads (ComputeOp::token_inputs), kept until their last reader ran; a
  // RECV that no op reads (the tokens of the last batches, which no batch follows) is
  // dropped as it arrives.
  void find_token_inputs() {
    std::set<TensorKey> read;
    for (int i = 0; i < static_cast<int>(ops_.size()); ++i) {
      const Op& op = ops_[static_cast<std::size_t>(i)];
      if (!ir::is_compute(op.kind) || op.kind == OpKind::OPT) continue;
      const auto in_key = input_key(op);
      if (in_key) read.insert(*in_key);
      if (!ir::is_serving(op.kind)) continue;
      for (const ir::OpRef& d : op.deps) {
        if (d.rank != rank_ || d.index < 0 || d.index >= static_cast<int>(ops_.size())) continue;
        const Op& dep = ops_[static_cast<std::size_t>(d.index)];
        if (dep.kind != OpKind::RECV || comm_key(dep) == in_key) continue;
        token_inputs_[i].push_back(d.index);
        token_last_reader_[d.index] = std::max(token_last_reader_[d.index], i);
        read.insert(comm_key(dep));
      }
    }
    for (int i = 0; i < static_cast<int>(ops_.size()); ++i) {
      const Op& op = ops_[static_cast<std::size_t>(i)];
      if (op.kind == OpKind::RECV && !read.count(comm_key(op))) unread_.insert(i);
    }
  }

  /// Have op's explicit deps (from the `from`-th on) ended? A compute op's LOADs are
  /// not waited for here: they gate its blocks (WeightGate).
  bool deps_done(const Op& op, std::size_t from = 0) const {
    for (std::size_t k = from; k < op.deps.size(); ++k) {
      const ir::OpRef& d = op.deps[k];
      // Cross-rank dependencies are carried by SEND/RECV once a plan is lowered.
      if (d.rank != rank_) continue;
      if (d.index < 0 || d.index >= static_cast<int>(done_.size())) return false;
      if (ir::is_weight_gate(op.kind, ops_[static_cast<std::size_t>(d.index)].kind)) continue;
      if (!done_[static_cast<std::size_t>(d.index)]) return false;
    }
    return true;
  }
  bool all_done(const std::vector<int>& list) const {
    for (int i : list)
      if (!done_[static_cast<std::size_t>(i)]) return false;
    return true;
  }

  std::string peer_text(int peer) const {
    return fmt::format("rank {}", trace_rank_ - rank_ + peer);
  }

  // Under control_.mutex(): wakes this rank's waiters (its stream threads, or its
  // cooperative thread) after a change they may be waiting for.
  void notify() {
    own_waker_.wakes.fetch_add(1, std::memory_order_release);
    own_waker_.cv.notify_all();
    if (waker_ != &own_waker_) {
      waker_->wakes.fetch_add(1, std::memory_order_release);
      waker_->cv.notify_all();
    }
  }
  // Sleeps until a notify() on `waker` after wake count `seen`, a failure, or `deadline`.
  static void sleep_until_woken(RunControl& control, Waker& waker, std::uint64_t seen,
                                std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lock(control.mutex());
    waker.cv.wait_until(lock, deadline,
                        [&] { return waker.wakes.load(std::memory_order_relaxed) != seen || control.failed(); });
  }
  // The latest time a waiting stream looks again (an abort, a transport's retry).
  static std::chrono::steady_clock::time_point turn_deadline() {
    return std::chrono::steady_clock::now() + std::chrono::milliseconds(RunControl::kAbortPollMs);
  }

  // Waits (under `lock`) until ready(); `what` names the wait, formatted only if a
  // watchdog report asks.
  template <class Ready>
  void wait_for(std::unique_lock<std::mutex>& lock, ir::Stream stream, RunControl::Describe what, Ready ready) {
    if (ready()) return;
    control_.set_waiting(trace_rank_, stream, std::move(what));
    control_.wait(lock, own_waker_.cv, ready);
    control_.set_waiting(trace_rank_, stream, RunControl::Describe{});
  }

  void record(int i, std::int64_t start, std::int64_t end) {
    const Op& op = ops_[static_cast<std::size_t>(i)];
    traces::TraceEvent e = traces::event_of(op, trace_rank_, start, end);
    e.peer = ir::is_p2p(op.kind) ? trace_rank_ - rank_ + op.peer : -1;  // peer's trace rank
    events_[static_cast<std::size_t>(i)] = std::move(e);
  }

  // Records the item's events (unless record_events is false: done already) and marks its ops done.
  void finish(const Item& item, std::int64_t start, std::int64_t end, std::int64_t layers_ns = -1,
              bool record_events = true) {
    for (int i = item.first; i < item.last && record_events; ++i) {
      record(i, start, end);
      events_[static_cast<std::size_t>(i)].layers_ns = layers_ns;
    }
    std::lock_guard lock(control_.mutex());
    for (int i = item.first; i < item.last; ++i) done_[static_cast<std::size_t>(i)] = 1;
    control_.progress();
    notify();  // only this rank's streams wait on its ops and tensors
  }

  // ---- what each op waits for (under control_.mutex()), and how a wait reads ----

  bool ready(const Item& item) const {
    const Op& op = ops_[static_cast<std::size_t>(item.first)];
    if (ir::is_compute(op.kind)) {
      const auto in_key = op.kind == OpKind::OPT ? std::nullopt : input_key(op);
      return deps_done(op) && (!in_key || tensors_.count(*in_key)) &&
             (op.kind != OpKind::OPT || all_done(reduce_ops_));
    }
    if (ir::is_p2p(op.kind)) {
      for (int i = item.first; i < item.last; ++i) {
        const Op& o = ops_[static_cast<std::size_t>(i)];
        if (!deps_done(o) || (o.kind == OpKind::SEND && !tensors_.count(comm_key(o)))) return false;
      }
      return true;
    }
    if (ir::is_gradient_reduction(op.kind))
      return bucket_ready(op, reduce_index_.at(item.first), reduce_count_[static_cast<std::size_t>(op.chunk)]);
    if (op.kind == OpKind::ALL_GATHER) return deps_done(op) && (opt_ < 0 || done_[static_cast<std::size_t>(opt_)]);
    if (op.kind == OpKind::LOAD || op.kind == OpKind::OFFLOAD) {
      const bool part = partial_copy(op);
      return deps_done(op, part ? 1 : 0) && (!part || released(op));
    }
    return deps_done(op);  // CKPT: activations stay in host memory
  }

  std::string batch_label(const Item& item) const {
    std::string label;
    for (int i = item.first; i < item.last; ++i)
      label += (label.empty() ? "" : "+") + op_label(ops_[static_cast<std::size_t>(i)]);
    return label;
  }

  // Reads only the plan: a watchdog report may call it while the stream goes on.
  std::string waiting_text(const Item& item) const {
    const Op& op = ops_[static_cast<std::size_t>(item.first)];
    if (ir::is_compute(op.kind)) {
      std::string what = fmt::format("{} waiting for", op_label(op));
      if (const auto in_key = op.kind == OpKind::OPT ? std::nullopt : input_key(op)) what += " the " + key_text(*in_key);
      if (!op.deps.empty()) what += " its deps";
      if (op.kind == OpKind::OPT) what += " every gradient reduction";
      return what;
    }
    if (ir::is_p2p(op.kind)) return batch_label(item) + " waiting for the tensors it sends / its deps";
    if (ir::is_gradient_reduction(op.kind))
      return fmt::format("{} waiting for the gradients of chunk {}", op_label(op), op.chunk);
    if (op.kind == OpKind::ALL_GATHER) return fmt::format("{} waiting for OPT", op_label(op));
    if (op.kind == OpKind::LOAD || op.kind == OpKind::OFFLOAD)
      return fmt::format("{} waiting for the block it replaces", op_label(op));
    return op_label(op) + " waiting for its deps";
  }

  std::string transport_text(const Item& item) const {
    std::string peers;
    for (int i = item.first; i < item.last; ++i)
      peers += (peers.empty() ? "" : ", ") + peer_text(ops_[static_cast<std::size_t>(i)].peer);
    return fmt::format("{} blocked in transport, waiting for peer {}", batch_label(item), peers);
  }

  // Runs a ready item to its end (a p2p batch through Transport::start, or post).
  void execute(const Item& item, ir::Stream stream) {
    const Op& op = ops_[static_cast<std::size_t>(item.first)];
    if (ir::is_compute(op.kind)) {
      run_compute(item.first, stream);
    } else if (ir::is_p2p(op.kind)) {
      Flight f = begin_batch(item, stream);
      control_.set_waiting(trace_rank_, stream, [this, &item] { return transport_text(item); });
      if (backend_.transport->can_start()) {
        // Started, then tested as it progresses: each pair ends on its own.
        const auto request = backend_.transport->start(f.batch, [this] { notify(); });
        while (true) {
          const std::uint64_t seen = own_waker_.wakes.load(std::memory_order_acquire);
          auto deadline = turn_deadline();
          if (advance(f, *request, deadline, stream)) break;
          sleep_until_woken(control_, own_waker_, seen, deadline);
        }
      } else {
        backend_.transport->post(f.batch);  // one NCCL group: it ends as a whole
        end_batch(f, backend_.clock->now_ns(stream));
      }
      control_.set_waiting(trace_rank_, stream, RunControl::Describe{});
    } else if (ir::is_gradient_reduction(op.kind)) {
      run_reduce(item.first, stream);
    } else if (op.kind == OpKind::ALL_GATHER) {
      run_gather(item.first, stream);
    } else if (op.kind == OpKind::LOAD || op.kind == OpKind::OFFLOAD) {
      run_copy(item.first, stream);
    } else {
      const std::int64_t t = backend_.clock->now_ns(stream);
      finish(item, t, t);
    }
  }

  void fail_in(ir::Stream stream, const Item* item, const std::exception& e) {
    control_.fail(fmt::format("rank {} ({} stream) failed in {}: {}", trace_rank_, ir::to_string(stream),
                              item ? op_label(ops_[static_cast<std::size_t>(item->first)]) : std::string(), e.what()),
                  dynamic_cast<const RankFault*>(&e) != nullptr);
  }

  // Threaded: a stream's items in order on its own thread, each waited for, then run.
  void worker(int s) {
    const auto stream = static_cast<ir::Stream>(s);
    const Item* current = nullptr;
    try {
      for (const Item& item : items_[static_cast<std::size_t>(s)]) {
        current = &item;
        if (backend_.faults && !backend_.faults->empty()) fault_point(ops_[static_cast<std::size_t>(item.first)], stream);
        {
          std::unique_lock lock(control_.mutex());
          wait_for(lock, stream, [this, &item] { return waiting_text(item); }, [&] { return ready(item); });
        }
        execute(item, stream);
      }
    } catch (const Aborted&) {
    } catch (const std::exception& e) {
      fail_in(stream, current, e);
    }
    control_.set_waiting(trace_rank_, stream, "");
  }

  // ---- the cooperative runtime (cooperate): one turn of a rank's compute and p2p streams ----

  // The p2p stream's turn: tests the batch in flight, starts the next one once ready
  // (and, between compute ops, runs a non-transfer item of the stream). True if it moved.
  bool p2p_turn(std::chrono::steady_clock::time_point& deadline, bool in_compute) {
    constexpr auto kP2P = ir::Stream::P2P;
    const auto& p2p = items_[static_cast<std::size_t>(kP2P)];
    Coop& c = coop_;
    // An error in here is the p2p stream's, with the item it was at (also inside a poll).
    const Item* const outer = c.current;
    const ir::Stream outer_stream = c.current_stream;
    auto at = [&](const Item* item) {
      c.current = item;
      c.current_stream = kP2P;
    };
    auto back = [&] {
      c.current = outer;
      c.current_stream = outer_stream;
    };
    bool moved = false;
    if (c.request) {
      at(&p2p[c.next_p2p]);
      const std::size_t ended = c.flight->ended;
      if (advance(*c.flight, *c.request, deadline, kP2P)) {
        c.request.reset();
        c.flight.reset();
        ++c.next_p2p;
        moved = true;
      } else if (c.flight->ended != ended) {
        moved = true;  // a RECV's consumer may be ready
      }
    }
    bool p2p_ready = false;
    {
      std::lock_guard lock(control_.mutex());
      p2p_ready = !c.request && c.next_p2p < p2p.size() && ready(p2p[c.next_p2p]);
    }
    const Item* item = p2p_ready ? &p2p[c.next_p2p] : nullptr;
    const bool transfer = item && ir::is_p2p(ops_[static_cast<std::size_t>(item->first)].kind);
    if (!item || (in_compute && !transfer)) {
      back();
      return moved;
    }
    at(item);
    if (backend_.faults && !backend_.faults->empty()) fault_point(ops_[static_cast<std::size_t>(item->first)], kP2P);
    if (transfer) {
      c.flight = begin_batch(*item, kP2P);
      c.request = backend_.transport->start(c.flight->batch, [this] { notify(); });  // called under control_.mutex()
    } else {
      execute(*item, kP2P);
      ++c.next_p2p;
    }
    back();
    return true;
  }

  // One turn of the rank: its p2p stream's, then its compute stream's next op if ready.
  // True if either moved.
  bool coop_turn(std::chrono::steady_clock::time_point& deadline) {
    constexpr auto kCompute = ir::Stream::Compute;
    const auto& compute = items_[static_cast<std::size_t>(kCompute)];
    const auto& p2p = items_[static_cast<std::size_t>(ir::Stream::P2P)];
    Coop& c = coop_;
    bool moved = p2p_turn(deadline, false);
    if (moved) undescribe();
    bool compute_ready = false;
    {
      std::lock_guard lock(control_.mutex());
      compute_ready = c.next_compute < compute.size() && ready(compute[c.next_compute]);
      // An OPT that agrees on overflow flags blocks until every rank reaches it: first
      // let the transfers before it end, so no peer waits for one of them meanwhile.
      if (compute_ready && agrees_ && compute[c.next_compute].first == opt_)
        compute_ready = c.next_p2p == p2p.size() || p2p[c.next_p2p].first > opt_;
    }
    if (!compute_ready) return moved;
    const Item& item = compute[c.next_compute];
    c.current = &item;
    c.current_stream = kCompute;
    if (backend_.faults && !backend_.faults->empty()) fault_point(ops_[static_cast<std::size_t>(item.first)], kCompute);
    if (ir::is_p2p(ops_[static_cast<std::size_t>(item.first)].kind))
      throw Error(fmt::format("rank {}: {} is on the compute stream; the lowering puts SEND and RECV on the "
                              "p2p stream", rank_, op_label(ops_[static_cast<std::size_t>(item.first)])));
    undescribe();
    execute(item, kCompute);
    ++c.next_compute;
    return true;
  }
  bool coop_finished() const {
    return coop_.next_compute == items_[static_cast<std::size_t>(ir::Stream::Compute)].size() &&
           coop_.next_p2p == items_[static_cast<std::size_t>(ir::Stream::P2P)].size();
  }

  // Nothing to do for any rank of the group since wake count `seen`: spin a little,
  // yielding the core (a peer's hand-off often comes within microseconds), then sleep
  // until woken or `deadline`, each rank saying what its streams wait for.
  static void park(RankRun* const* group, std::size_t n, Waker& waker, std::uint64_t seen,
                   std::chrono::steady_clock::time_point deadline) {
    constexpr auto kSpin = std::chrono::microseconds(50);
    const auto until = std::min(deadline, std::chrono::steady_clock::now() + kSpin);
    while (waker.wakes.load(std::memory_order_acquire) == seen && std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
    if (waker.wakes.load(std::memory_order_acquire) != seen) return;
    for (std::size_t k = 0; k < n; ++k) group[k]->describe();
    sleep_until_woken(group[0]->control_, waker, seen, deadline);
  }
  // Said once per wait, however many parks it takes (and kept across the spins between
  // them, so that a watchdog report never finds it blank): undescribe() clears it once
  // the rank moves.
  void describe() {
    if (described_ || coop_finished()) return;
    described_ = true;
    const auto& compute = items_[static_cast<std::size_t>(ir::Stream::Compute)];
    const auto& p2p = items_[static_cast<std::size_t>(ir::Stream::P2P)];
    const Item* c = coop_.next_compute < compute.size() ? &compute[coop_.next_compute] : nullptr;
    const Item* q = coop_.next_p2p < p2p.size() ? &p2p[coop_.next_p2p] : nullptr;
    const bool in_flight = coop_.request != nullptr;
    if (c) control_.set_waiting(trace_rank_, ir::Stream::Compute, [this, c] { return waiting_text(*c); });
    if (q)
      control_.set_waiting(trace_rank_, ir::Stream::P2P, [this, q, in_flight] {
        return in_flight ? transport_text(*q) : waiting_text(*q);
      });
  }
  void undescribe() {
    if (!described_) return;
    described_ = false;
    control_.set_waiting(trace_rank_, ir::Stream::Compute, RunControl::Describe{});
    control_.set_waiting(trace_rank_, ir::Stream::P2P, RunControl::Describe{});
  }

  // An injected kill or hang at `op` (or an earlier one on another stream of this rank):
  // the rank stops as a dead or frozen process does — no more ops, no more heartbeats —
  // and this thread waits until the others notice (Heartbeats) and the run is stopped.
  void fault_point(const Op& op, ir::Stream stream) {
    const FaultSpec* f = gone_ ? nullptr : backend_.faults->at_op(trace_rank_, step_, op_label(op));
    std::string what;
    if (f) {
      what = fmt::format("{} at {} of step {} (injected: {})", f->kind == FaultSpec::Kind::Kill ? "died" : "hung",
                         op_label(op), step_, f->text);
      {
        std::lock_guard lock(gone_mu_);
        if (gone_what_.empty()) gone_what_ = what;  // the first of the rank's streams to stop names it
      }
      gone_ = true;
      if (!backend_.heartbeats)  // nobody would notice: report it here
        throw RankFault(fmt::format("rank {} {}", trace_rank_, what));
      backend_.heartbeats->stop(trace_rank_);
    }
    if (!gone_) return;
    {
      std::lock_guard lock(gone_mu_);
      what = gone_what_;
    }
    control_.set_waiting(trace_rank_, stream, what);
    std::unique_lock lock(control_.mutex());
    control_.wait(lock, own_waker_.cv, [] { return false; });  // throws Aborted once the run is stopped
  }

  void run_compute(int i, ir::Stream stream) {
    const Op& op = ops_[static_cast<std::size_t>(i)];
    ComputeOp cop{op.kind, op.mb, op.chunk, op.slice, op.kind == OpKind::OPT ? -1 : stage(rank_, op.chunk),
                  op.kind == OpKind::OPT && sharded_ ? &shard_ : nullptr};
    if (op.kind == OpKind::OPT && compressed_) cop.variance_frozen_at = plan_.scenario.parallel.onebit_warmup_steps;
    // The chunk's last gradient op: its buckets may start as its gradients become final.
    GradProgress progress;
    if (op.kind != OpKind::B && last_grad_.count(i)) {
      progress = [this, c = op.chunk](std::int64_t tail, std::int64_t total) {
        std::lock_guard lock(control_.mutex());
        tail_done_[static_cast<std::size_t>(c)] = tail;
        tail_total_[static_cast<std::size_t>(c)] = total;
        notify();
      };
      cop.progress = &progress;
    }
    // Parameter offload: the backend waits for each block's LOAD as it reaches it.
    WeightGate gate;
    const auto gated = gates_.find(i);
    int acquired = 0;
    if (gated != gates_.end()) {
      const std::vector<int>& loads = gated->second;
      gate.acquire = [this, &op, &loads, &acquired, stream](int k, int chunk, int layer) {
        if (k < 0 || k >= static_cast<int>(loads.size()))
          throw Error(fmt::format("rank {}: {} asked for its block {} but the plan lists {} LOADs for it", rank_,
                                  op_label(op), k, loads.size()));
        const Op& load = ops_[static_cast<std::size_t>(loads[static_cast<std::size_t>(k)])];
        if (load.chunk != chunk || load.tag != layer)
          throw Error(fmt::format("rank {}: {} uses chunk {} layer {} as its block {}, but the plan's LOAD {} of it "
                                  "brings chunk {} layer {}", rank_, op_label(op), chunk, layer, k, k, load.chunk,
                                  load.tag));
        std::unique_lock lock(control_.mutex());
        wait_for(lock, stream, [&op, &load] { return fmt::format("{} waiting for {}", op_label(op), op_label(load)); },
                 [&] { return done_[static_cast<std::size_t>(loads[static_cast<std::size_t>(k)])] != 0; });
        acquired = k + 1;
      };
      gate.release = [this, i](int k) {
        std::lock_guard lock(control_.mutex());
        segments_[static_cast<std::size_t>(i)] = k + 1;
        notify();  // a copy waits for this block's slot
      };
      cop.gate = &gate;
    }
    if (op.kind != OpKind::OPT && stream == ir::Stream::Compute) cop.poll = poll_;
    Buffer input;
    if (const auto in_key = op.kind == OpKind::OPT ? std::nullopt : input_key(op)) {
      std::lock_guard lock(control_.mutex());
      auto it = tensors_.find(*in_key);
      input = std::move(it->second);
      tensors_.erase(it);
    }
    if (const auto tokens = token_inputs_.find(i); tokens != token_inputs_.end()) {
      std::lock_guard lock(control_.mutex());
      for (int d : tokens->second) {
        const Op& recv = ops_[static_cast<std::size_t>(d)];
        auto it = tensors_.find(comm_key(recv));
        if (it == tensors_.end())
          throw Error(fmt::format("rank {}: {} reads the tokens of {}, which its last reader took already", rank_,
                                  op_label(op), op_label(recv)));
        cop.token_inputs.emplace_back(recv.mb, it->second);
        if (token_last_reader_.at(d) == i) tensors_.erase(it);
      }
    }
    // fp16 training: OPT steps only if no rank's stores overflowed in any slice. The
    // agreement waits for every rank to reach its OPT: a wait, before OPT's interval.
    std::vector<std::uint8_t> overflow;
    if (op.kind == OpKind::OPT) overflow = backend_.compute->overflow_flags();
    if (!overflow.empty()) {
      control_.set_waiting(trace_rank_, stream,
                           fmt::format("{} waiting for every rank's overflow flags (fp16 loss scaling)", op_label(op)));
      backend_.transport->agree_overflow(overflow, step_);
      control_.set_waiting(trace_rank_, stream, "");
      cop.overflow = &overflow;
    }
    // An injected straggler: the op takes `slow` times as long (measured by now_ns,
    // which waits for a device backend's stream: only under fault injection).
    const double slow = backend_.faults ? backend_.faults->slow_factor(trace_rank_, step_) : 1;
    const std::int64_t slow_from = slow != 1 ? backend_.clock->now_ns(stream) : 0;
    const std::int64_t start = backend_.clock->mark(stream);
    control_.progress();
    Buffer out = backend_.compute->run(cop, std::move(input));
    if (slow != 1)
      std::this_thread::sleep_for(std::chrono::nanoseconds(
          static_cast<std::int64_t>(double(backend_.clock->now_ns(stream) - slow_from) * (slow - 1))));
    const std::int64_t end = backend_.clock->mark(stream);
    backend_.compute->issued(cop, out);
    if (gated != gates_.end() && acquired != static_cast<int>(gated->second.size()))
      throw Error(fmt::format("rank {}: {} used {} of the {} blocks its LOADs bring", rank_, op_label(op), acquired,
                              gated->second.size()));
    const std::int64_t layers_ns = backend_.compute->last_layers_ns();
    if (op.kind != OpKind::OPT) {
      if (const auto key = output_key(op); key && !out.empty()) {
        std::lock_guard lock(control_.mutex());
        tensors_[*key] = std::move(out);
      }
    }
    marked_.push_back({i, start, end, layers_ns});
    finish({i, i + 1}, start, end, -1, false);
  }

  // A compute op's Clock::marks, resolved after the step's last op (resolve_marks).
  struct Marked {
    int op = 0;
    std::int64_t start = 0, end = 0, layers_ns = -1;
  };
  // The compute ops' events from their marks (Clock::resolve waits for their work).
  void resolve_marks() {
    std::vector<std::int64_t> marks;
    marks.reserve(2 * marked_.size());
    for (const Marked& m : marked_) {
      marks.push_back(m.start);
      marks.push_back(m.end);
    }
    backend_.clock->resolve(marks);
    for (std::size_t k = 0; k < marked_.size(); ++k) {
      const Marked& m = marked_[k];
      const std::int64_t start = marks[2 * k], end = std::max(marks[2 * k + 1], start);
      record(m.op, start, end);
      events_[static_cast<std::size_t>(m.op)].layers_ns = m.layers_ns < 0 ? -1 : std::min(m.layers_ns, end - start);
    }
    marked_.clear();
  }

  // A p2p batch between its start and its end.
  struct Flight {
    Item item;
    std::vector<P2POp> batch;
    std::int64_t start = 0;
    std::vector<char> done;  // [op of the batch] ended (started batches: each on its own)
    std::size_t ended = 0;
  };

  // Where the cooperative runtime is in the rank's compute and p2p streams.
  struct Coop {
    std::size_t next_compute = 0, next_p2p = 0;
    std::optional<Flight> flight;           // the p2p stream's batch in flight
    std::unique_ptr<P2PRequest> request;    // and its transport request
    const Item* current = nullptr;          // the item an error is reported at
    ir::Stream current_stream = ir::Stream::Compute;
  };

  // A ready batch's ops: the SENDs' tensors, fresh RECV buffers; the batch starts now.
  Flight begin_batch(const Item& item, ir::Stream stream) {
    Flight f{item, {}, 0, {}, 0};
    f.batch.reserve(static_cast<std::size_t>(item.last - item.first));
    for (int i = item.first; i < item.last; ++i) {
      const Op& op = ops_[static_cast<std::size_t>(i)];
      P2POp p;
      p.kind = op.kind;
      p.peer = op.peer;
      p.key = comm_key(op);
      p.label = op_label(op);
      f.batch.push_back(std::move(p));
    }
    {
      std::lock_guard lock(control_.mutex());
      for (auto& p : f.batch)
        if (p.kind == OpKind::SEND) p.buffer = tensors_.at(p.key);
    }
    for (auto& p : f.batch)
      if (p.kind == OpKind::RECV) p.buffer = backend_.compute->allocate(p.key);
    backend_.transport->prepare(f.batch);  // (a device transport: after the SENDs' producers)
    f.start = backend_.clock->now_ns(stream);
    f.done.assign(f.batch.size(), 0);
    control_.progress();
    return f;
  }

  // Tests a started batch: each op that completed since ends at its own time (its
  // event, its tensor, its done flag), so a RECV's consumer starts without waiting for
  // the rest of the batch. True once all ended.
  bool advance(Flight& f, P2PRequest& request, std::chrono::steady_clock::time_point& deadline,
               ir::Stream stream) {
    const bool all = request.test(deadline);
    const auto now = std::chrono::steady_clock::now();
    const std::int64_t now_ns = backend_.clock->now_ns(stream);
    std::vector<std::size_t> fresh;
    for (std::size_t k = 0; k < f.batch.size(); ++k) {
      std::chrono::steady_clock::time_point at;
      if (f.done[k] || !request.op_done(k, at)) continue;
      f.done[k] = 1;
      ++f.ended;
      const std::int64_t end = now_ns - std::chrono::duration_cast<std::chrono::nanoseconds>(now - at).count();
      record(f.item.first + static_cast<int>(k), f.start, std::max(end, f.start));
      fresh.push_back(k);
    }
    if (!fresh.empty()) {
      std::lock_guard lock(control_.mutex());
      for (std::size_t k : fresh) {
        hand_over(f.item.first + static_cast<int>(k), f.batch[k]);
        done_[static_cast<std::size_t>(f.item.first) + k] = 1;
      }
      control_.progress();
      notify();
    }
    return all && f.ended == f.batch.size();
  }

  // Under control_.mutex(), transfer `i` that ended: a SEND's tensor goes, a RECV's
  // arrives (or, read by no op, is dropped).
  void hand_over(int i, P2POp& p) {
    if (p.kind == OpKind::SEND)
      tensors_.erase(p.key);
    else if (unread_.count(i))
      p.buffer = Buffer{};
    else
      tensors_[p.key] = std::move(p.buffer);
  }

  // The batch completed at `end` (Transport::post) as a whole.
  void end_batch(Flight& f, std::int64_t end) {
    {
      std::lock_guard lock(control_.mutex());
      for (std::size_t k = 0; k < f.batch.size(); ++k) hand_over(f.item.first + static_cast<int>(k), f.batch[k]);
    }
    finish(f.item, f.start, std::max(end, f.start));
  }

  // Bucket `index` of `count` of a chunk is its part count − 1 − index: bucket 0 holds the
  // chunk's last parameters, which the backward finishes first (Megatron's order).
  static int part_of(int index, int count) { return count - 1 - index; }

  // May this bucket start part-way through its first dependency? Only when the plan
  // says so (Op::ready_after < 1) and that dependency is its chunk's last gradient op.
  bool partial(const Op& op) const {
    if (op.ready_after >= 1.0f || op.deps.empty() || op.deps[0].rank != rank_) return false;
    const auto it = last_grad_.find(op.deps[0].index);
    return it != last_grad_.end() && it->second == op.chunk;
  }

  // Are bucket `index` of `count` of its chunk's gradients final, and its deps done?
  // Every gradient op of the chunk ended; or (partial) all but the last did and the last
  // has finished this bucket's part.
  bool bucket_ready(const Op& op, int index, int count) const {
    const bool part = partial(op);
    if (!deps_done(op, part ? 1 : 0)) return false;
    const auto c = static_cast<std::size_t>(op.chunk);
    const auto& grads = grad_ops_[c];
    if (all_done(grads)) return true;
    if (!part || tail_done_[c] < 0) return false;
    for (std::size_t k = 0; k + 1 < grads.size(); ++k)
      if (!done_[static_cast<std::size_t>(grads[k])]) return false;
    const std::int64_t first = part_range(tail_total_[c], part_of(index, count), count).first;
    return tail_done_[c] >= tail_total_[c] - first;
  }

  // ALLREDUCE, REDUCE_SCATTER or COMPRESSED_ALLREDUCE of a ready gradient bucket.
  void run_reduce(int i, ir::Stream stream) {
    const Op& op = ops_[static_cast<std::size_t>(i)];
    const int index = reduce_index_.at(i), count = reduce_count_[static_cast<std::size_t>(op.chunk)];
    Buffer bucket = backend_.compute->grad_bucket(op.chunk, part_of(index, count), count);
    control_.set_waiting(trace_rank_, stream, [&op] { return fmt::format("{} blocked in the data-parallel ring", op_label(op)); });
    const std::int64_t start = backend_.clock->now_ns(stream);
    control_.progress();
    std::int64_t payload = bucket.bytes();
    if (op.kind == OpKind::REDUCE_SCATTER) {
      backend_.transport->reduce_scatter(bucket, op.tag);
    } else if (op.kind == OpKind::ALLREDUCE || !compressed_) {
      backend_.transport->all_reduce(bucket, op.tag);  // (a warm-up step's COMPRESSED_ALLREDUCE)
    } else {
      // 1-bit Adam: the momentum's worker compression, the all-to-all of the segments to
      // their owners, the owner's average and re-compression, the all-gather, the decoding.
      const auto [member, members] = backend_.transport->dp_member();
      const int part = part_of(index, count);
      OnebitMessages m = backend_.compute->onebit_compress(op.chunk, part, count, members);
      backend_.transport->all_to_all(m.sent, m.received, op.tag);
      backend_.compute->onebit_serve(op.chunk, part, count, member, members, m);
      backend_.transport->all_gather(m.gathered, op.tag);
      backend_.compute->onebit_expand(op.chunk, part, count, members, m);
      payload = m.gathered.bytes();
    }
    const std::int64_t end = backend_.clock->now_ns(stream);
    control_.set_waiting(trace_rank_, stream, RunControl::Describe{});
    record(i, start, end);
    // What a compressed bucket really carried, in this backend: its packed message, or in
    // the warm-up its gradients (the plan's bytes are the message's; other collectives
    // keep the plan's).
    if (op.kind == OpKind::COMPRESSED_ALLREDUCE) events_[static_cast<std::size_t>(i)].bytes = payload;
    finish({i, i + 1}, start, end, -1, false);
  }

  // ALL_GATHER of a bucket's parameters, once this rank's (sharded) OPT stepped its part.
  void run_gather(int i, ir::Stream stream) {
    const Op& op = ops_[static_cast<std::size_t>(i)];
    const int count = gather_count_[static_cast<std::size_t>(op.chunk)];
    Buffer bucket = backend_.compute->param_bucket(op.chunk, part_of(gather_index_.at(i), count), count);
    control_.set_waiting(trace_rank_, stream, [&op] { return fmt::format("{} blocked in the data-parallel ring", op_label(op)); });
    const std::int64_t start = backend_.clock->now_ns(stream);
    control_.progress();
    backend_.transport->all_gather(bucket, op.tag);
    const std::int64_t end = backend_.clock->now_ns(stream);
    control_.set_waiting(trace_rank_, stream, RunControl::Describe{});
    finish({i, i + 1}, start, end);
  }

  // Has the gated op a copy's first dependency names (Op::ready_after) released the block
  // of its segment ir::gate_segment(ready_after, n) (or ended)?
  bool released(const Op& copy) const {
    const int dep = copy.deps[0].index;
    if (done_[static_cast<std::size_t>(dep)]) return true;
    const auto it = gates_.find(dep);
    if (it == gates_.end()) return false;
    return segments_[static_cast<std::size_t>(dep)] > ir::gate_segment(copy.ready_after, static_cast<int>(it->second.size()));
  }
  // Does the copy wait for only part of its first dependency (a block's release)?
  bool partial_copy(const Op& op) const {
    return op.ready_after < 1.0f && !op.deps.empty() && op.deps[0].rank == rank_ && op.deps[0].index >= 0 &&
           op.deps[0].index < static_cast<int>(ops_.size());
  }

  // LOAD / OFFLOAD of parameter offload, on the copy stream.
  void run_copy(int i, ir::Stream stream) {
    const Op& op = ops_[static_cast<std::size_t>(i)];
    const auto consumer = consumer_.find(i);
    const bool state = op.kind == OpKind::OFFLOAD ||
                       (consumer != consumer_.end() && ops_[static_cast<std::size_t>(consumer->second)].kind == OpKind::OPT);
    const std::int64_t start = backend_.clock->now_ns(stream);
    control_.progress();
    backend_.compute->copy(CopyOp{op.kind, op.chunk, op.tag, state});
    const std::int64_t end = backend_.clock->now_ns(stream);
    finish({i, i + 1}, start, end);
  }

  Waker own_waker_;  // what this rank's threads wait on (its ops, tensors, transfers)
  Waker* waker_;     // what its cooperative thread parks on: own_waker_, or its group's
  const ir::Plan& plan_;
  const std::vector<Op>& ops_;
  int rank_, trace_rank_, step_;
  std::atomic<bool> gone_{false};  // an injected kill or hang stopped this rank
  std::mutex gone_mu_;
  std::string gone_what_;          // how it stopped; guarded by gone_mu_
  Backend backend_;
  RunControl& control_;
  std::array<std::vector<Item>, ir::kStreamCount> items_;
  std::array<std::thread, ir::kStreamCount> threads_;  // streams with a thread of their own
  Coop coop_;                                   // cooperative: the compute and p2p streams
  const std::function<void()>* poll_ = nullptr;  // cooperative: the compute op's ComputeOp::poll
  bool described_ = false;                      // cooperative: park() said what the streams wait for
  std::vector<char> done_;                      // guarded by control_.mutex()
  std::map<TensorKey, Buffer> tensors_;         // guarded by control_.mutex()
  std::vector<std::vector<int>> grad_ops_;      // per chunk: its last gradient ops
  std::vector<int> reduce_count_;               // per chunk: its gradient reductions (ALLREDUCE, …)
  std::map<int, int> reduce_index_;             // op index → bucket index in its chunk
  std::vector<int> reduce_ops_;
  std::vector<int> gather_count_;               // per chunk: ALL_GATHER ops
  std::map<int, int> gather_index_;             // op index → bucket index in its chunk
  int opt_ = -1;                                // the OPT's index, if any
  bool agrees_ = false;                         // fp16: OPT agrees on overflow flags with every rank
  bool sharded_ = false;                        // REDUCE_SCATTER buckets: OPT steps shard_ only
  bool compressed_ = false;                     // COMPRESSED_ALLREDUCE buckets past the warm-up
  OptimizerShard shard_;
  std::map<int, int> last_grad_;                // op index → chunk whose last gradient op it is
  std::vector<std::int64_t> tail_done_;         // per chunk: GradProgress of that op (−1: none yet)
  std::vector<std::int64_t> tail_total_;        // guarded by control_.mutex()
  std::vector<traces::TraceEvent> events_;
  std::vector<Marked> marked_;  // the compute stream's thread, then end()
  std::map<int, std::vector<int>> token_inputs_;  // serving op → the RECVs of the token buffers it reads
  std::map<int, int> token_last_reader_;          // such a RECV → its last reader
  std::set<int> unread_;                          // RECVs whose tensor no op reads
  std::map<int, std::vector<int>> gates_;  // compute op → its LOADs, in use order
  std::map<int, int> consumer_;            // LOAD → the op it gates
  std::vector<int> segments_;              // per op: blocks released so far (guarded)
};

}  // namespace

int stage_of(const ir::Plan& plan, int rank, int chunk) {
  if (rank < 0 || rank >= static_cast<int>(plan.stage_of.size()))
    throw Error(fmt::format("plan.stage_of has no row for rank {}", rank));
  const auto& row = plan.stage_of[static_cast<std::size_t>(rank)];
  if (chunk < 0 || chunk >= static_cast<int>(row.size()))
    throw Error(fmt::format("plan.stage_of[{}] has no chunk {} (it has {})", rank, chunk, row.size()));
  const int s = row[static_cast<std::size_t>(chunk)];
  if (s < 0 || s >= plan.virtual_stages())
    throw Error(fmt::format("plan.stage_of[{}][{}] = {} is not a virtual stage (p·v = {})", rank,
                            chunk, s, plan.virtual_stages()));
  return s;
}

std::vector<RankStepResult> run_rank_steps(const ir::Plan& plan, const std::vector<RankSlot>& slots, int step,
                                           RunControl& control) {
  if (slots.empty()) return {};
  if (slots.size() == 1) return {run_rank_step(plan, slots[0].rank, slots[0].trace_rank, step, slots[0].backend, control)};
  Waker waker;
  std::vector<std::unique_ptr<RankRun>> runs;
  std::vector<RankRun*> group;
  std::size_t begun = 0, at = 0;  // ranks begun; the slot an error is at
  std::vector<RankStepResult> out;
  try {
    for (; at < slots.size(); ++at) {
      const RankSlot& s = slots[at];
      runs.push_back(std::make_unique<RankRun>(plan, s.rank, s.trace_rank, step, s.backend, control, &waker));
      group.push_back(runs.back().get());
    }
    for (at = 0; at < group.size(); ++at) {
      group[at]->begin();
      group[at]->check_shareable();  // before its stream threads start
      group[at]->start_threads();
      ++begun;
    }
  } catch (const std::exception& e) {
    control.fail(fmt::format("rank {}: {}", slots[at].trace_rank, e.what()));
  }
  try {
    if (!control.failed()) RankRun::cooperate(group.data(), group.size(), waker);
  } catch (const std::exception& e) {
    control.fail(fmt::format("ranks {} to {} (one thread): {}", slots.front().trace_rank, slots.back().trace_rank,
                             e.what()));
  }
  // Every rank begun joins its stream threads (they end once the run failed).
  for (std::size_t k = 0; k < begun; ++k) try {
      out.push_back(group[k]->end());
    } catch (const Aborted&) {
    } catch (const std::exception& e) {
      control.fail(fmt::format("rank {}: {}", slots[k].trace_rank, e.what()));
    }
  if (control.failed() || out.size() != slots.size()) throw Aborted{};
  return out;
}

RankStepResult run_rank_step(const ir::Plan& plan, int rank, int trace_rank, int step,
                             const Backend& backend, RunControl& control) {
  try {
    RankRun run(plan, rank, trace_rank, step, backend, control);
    return run.run();
  } catch (const Aborted&) {
    throw;
  } catch (const std::exception& e) {
    control.fail(fmt::format("rank {}: {}", trace_rank, e.what()));
    throw Aborted{};
  }
}

}  // namespace tdpipe::exec
