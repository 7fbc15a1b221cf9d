// rendezvous.hpp — the loopback transport's matching logic: SENDs and RECVs of
// ranks that live in one process (threads driving stages on one GPU) meet here.
// It has NCCL's semantics on purpose, so an order that would deadlock NCCL
// deadlocks (and is reported) here too: messages of one directed pair (src → dst)
// match strictly in posting order, both sides must agree on what is moved
// (payload, producer stage, micro-batch, slice, bytes), and a post returns at once — a
// batch is posted first, then waited for, like one ncclGroupStart/End.
//
// The side that completes a match runs `on_match` (for CUDA: make the receiver's
// stream wait for the sender's ready event, copy device to device, record a done
// event) and both sides receive its result. Plain C++ and a template over that
// result, so the ordering is unit-tested on CPU with plain values.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/op.hpp"

namespace tdpipe::exec::cuda {

/// What a SEND/RECV pair must agree on.
struct MessageKey {
  ir::OpKind payload = ir::OpKind::F;  ///< F = activation, B = input gradient
  int stage = 0, mb = -1, slice = 0;   ///< the producer: virtual stage, micro-batch, slice
  std::int64_t bytes = 0;
  friend bool operator==(const MessageKey&, const MessageKey&) = default;
};

/// "activation of mb 3 slice 1 (4096 B)".
std::string describe(const MessageKey& key);

/// One posted SEND or RECV; wait() blocks until it is matched and `on_match` ran.
template <class Result>
class RendezvousTicket {
 public:
  /// Blocks until matched; throws tdpipe::Error on mismatch, abort or timeout.
  Result wait(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return result_.has_value() || !error_.empty(); }))
      throw Error("loopback transport: rank " + std::to_string(rank_) + " waited " +
                  std::to_string(timeout.count()) + " ms for " + what_ +
                  " — no matching op was posted (the plan's order deadlocks, or the peer failed)");
    if (!error_.empty()) throw Error(error_);
    return *result_;
  }
  /// Waits up to `slice`: the result, nullopt if still unmatched; throws on mismatch or abort.
  std::optional<Result> try_wait(std::chrono::milliseconds slice) {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, slice, [&] { return result_.has_value() || !error_.empty(); });
    if (!error_.empty()) throw Error(error_);
    return result_;
  }
  bool done() const {
    std::lock_guard lock(mutex_);
    return result_.has_value() || !error_.empty();
  }
  const std::string& what() const { return what_; }

  // Used by Rendezvous.
  RendezvousTicket(int rank, std::string what) : rank_(rank), what_(std::move(what)) {}
  void complete(Result r) {
    { std::lock_guard lock(mutex_); result_ = std::move(r); }
    cv_.notify_all();
  }
  void fail(std::string message) {
    { std::lock_guard lock(mutex_); if (!result_) error_ = std::move(message); }
    cv_.notify_all();
  }

 private:
  int rank_;
  std::string what_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::optional<Result> result_;
  std::string error_;
};

/// Matches SEND and RECV posts of in-process ranks. `SendSide`/`RecvSide` carry
/// what `on_match` needs (for CUDA: buffer pointer, stream, ready event).
template <class SendSide, class RecvSide, class Result>
class Rendezvous {
 public:
  using Ticket = std::shared_ptr<RendezvousTicket<Result>>;
  using MatchFn = std::function<Result(const SendSide&, const RecvSide&)>;

  explicit Rendezvous(MatchFn on_match) : on_match_(std::move(on_match)) {}

  /// Posts a SEND of `key` from `src` to `dst`; never blocks.
  Ticket post_send(int src, int dst, const MessageKey& key, SendSide side) {
    auto ticket = std::make_shared<RendezvousTicket<Result>>(
        src, "SEND " + describe(key) + " to rank " + std::to_string(dst));
    post(src, dst, key, ticket, std::optional<SendSide>(std::move(side)), std::nullopt, true);
    return ticket;
  }
  /// Posts a RECV of `key` on `dst` from `src`; never blocks.
  Ticket post_recv(int src, int dst, const MessageKey& key, RecvSide side) {
    auto ticket = std::make_shared<RendezvousTicket<Result>>(
        dst, "RECV " + describe(key) + " from rank " + std::to_string(src));
    post(src, dst, key, ticket, std::nullopt, std::optional<RecvSide>(std::move(side)), false);
    return ticket;
  }
  /// Fails every pending post (another rank failed: nobody may hang).
  void abort(const std::string& why) {
    std::map<std::pair<int, int>, Pair> pairs;
    {
      std::lock_guard lock(mutex_);
      aborted_ = why;
      pairs.swap(pairs_);
    }
    for (auto& [k, p] : pairs) {
      for (auto& s : p.sends) s.ticket->fail("loopback transport aborted: " + why);
      for (auto& r : p.recvs) r.ticket->fail("loopback transport aborted: " + why);
    }
  }
  /// Posts not yet matched, one line each ("rank 0: SEND … to rank 1"), for watchdog messages.
  std::vector<std::string> pending() const {
    std::lock_guard lock(mutex_);
    std::vector<std::string> out;
    for (auto& [k, p] : pairs_) {
      for (auto& s : p.sends) out.push_back("rank " + std::to_string(k.first) + ": " + s.ticket->what());
      for (auto& r : p.recvs) out.push_back("rank " + std::to_string(k.second) + ": " + r.ticket->what());
    }
    return out;
  }

 private:
  struct PendingSend { MessageKey key; SendSide side; Ticket ticket; };
  struct PendingRecv { MessageKey key; RecvSide side; Ticket ticket; };
  struct Pair { std::deque<PendingSend> sends; std::deque<PendingRecv> recvs; };

  void post(int src, int dst, const MessageKey& key, const Ticket& ticket,
            std::optional<SendSide> send, std::optional<RecvSide> recv, bool is_send) {
    std::optional<PendingSend> s;
    std::optional<PendingRecv> r;
    {
      std::lock_guard lock(mutex_);
      if (!aborted_.empty()) {
        ticket->fail("loopback transport aborted: " + aborted_);
        return;
      }
      Pair& pair = pairs_[{src, dst}];
      if (is_send) {
        if (pair.recvs.empty()) { pair.sends.push_back({key, std::move(*send), ticket}); return; }
        r = std::move(pair.recvs.front());
        pair.recvs.pop_front();
        s = PendingSend{key, std::move(*send), ticket};
      } else {
        if (pair.sends.empty()) { pair.recvs.push_back({key, std::move(*recv), ticket}); return; }
        s = std::move(pair.sends.front());
        pair.sends.pop_front();
        r = PendingRecv{key, std::move(*recv), ticket};
      }
    }
    if (!(s->key == r->key)) {
      // NCCL would silently pair these two (and corrupt data or hang): name both.
      std::string msg = "loopback transport: order mismatch between rank " + std::to_string(src) +
                        " and rank " + std::to_string(dst) + ": rank " + std::to_string(src) +
                        " sends " + describe(s->key) + " while rank " + std::to_string(dst) +
                        " expects " + describe(r->key) + " next";
      s->ticket->fail(msg);
      r->ticket->fail(msg);
      return;
    }
    try {
      Result result = on_match_(s->side, r->side);
      s->ticket->complete(result);
      r->ticket->complete(std::move(result));
    } catch (const std::exception& e) {
      s->ticket->fail(e.what());
      r->ticket->fail(e.what());
    }
  }

  MatchFn on_match_;
  mutable std::mutex mutex_;
  std::map<std::pair<int, int>, Pair> pairs_;
  std::string aborted_;
};

inline std::string describe(const MessageKey& key) {
  std::string s = key.payload == ir::OpKind::F ? "activation" : "gradient";
  s += " of mb " + std::to_string(key.mb);
  if (key.stage != 0) s += " stage " + std::to_string(key.stage);
  if (key.slice != 0) s += " slice " + std::to_string(key.slice);
  s += " (" + std::to_string(key.bytes) + " B)";
  return s;
}

}  // namespace tdpipe::exec::cuda
