// loopback_transport.cpp — in-process SEND/RECV as event-ordered D2D copies, and
// the in-process data-parallel sum.
#include "loopback_transport.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include "check.hpp"
#include "device_memory.hpp"
#include "kernels.cuh"
#include "nvtx.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec::cuda {

namespace {

EventHandle make_event() {
  cudaEvent_t ev = nullptr;
  TDPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  return EventHandle(ev, [](cudaEvent_t e) { cudaEventDestroy(e); });
}

EventHandle copy_on_match(const LoopbackSend& s, const LoopbackRecv& r) {
  if (s.bytes != r.bytes)
    throw Error(s.label + " (" + std::to_string(s.bytes) + " bytes) was matched with " + r.label + " (" +
                std::to_string(r.bytes) + " bytes): the k-th SEND between two ranks must carry the tensor of "
                "the k-th RECV");
  TDPIPE_CUDA_CHECK(cudaSetDevice(r.device));
  EventHandle done = make_event();
  // The receiver's stream waits for the sender's data, copies, and marks the copy
  // done; the sender may reuse its buffer only after `done`.
  TDPIPE_CUDA_CHECK(cudaStreamWaitEvent(r.stream, s.ready, 0));
  TDPIPE_CUDA_CHECK(cudaMemcpyAsync(r.ptr, s.ptr, static_cast<std::size_t>(s.bytes), cudaMemcpyDeviceToDevice,
                                    r.stream));
  TDPIPE_CUDA_CHECK(cudaEventRecord(done.get(), r.stream));
  return done;
}

}  // namespace

LoopbackFabric::LoopbackFabric(RunControl& control) : control_(&control), p2p_(copy_on_match) {}

void LoopbackFabric::abort(const std::string& why) {
  p2p_.abort(why);
  {
    std::lock_guard lock(mu_);
    aborted_ = why;
  }
  cv_.notify_all();
}

void LoopbackFabric::collective(Collective what, int rank, int replica, int data, long call, const Buffer& buffer,
                                const DeviceContext& ctx, const Buffer* recv) {
  if (what == Collective::AllToAll) {
    if (recv == nullptr || recv->bytes() != buffer.bytes() || recv->dtype != buffer.dtype || buffer.elements % data != 0)
      throw Error("loopback all-to-all: send and receive buffers must be equal and hold one block per replica");
    if (data <= 1) {
      if (buffer.bytes() > 0)
        TDPIPE_CUDA_CHECK(cudaMemcpyAsync(recv->data.get(), buffer.data.get(), static_cast<std::size_t>(buffer.bytes()),
                                          cudaMemcpyDeviceToDevice, ctx.dp()));
      TDPIPE_CUDA_CHECK(cudaStreamSynchronize(ctx.dp()));
      return;
    }
  }
  if (data <= 1) return;
  const bool sums = what == Collective::AllReduce || what == Collective::ReduceScatter;
  if (sums && buffer.dtype != DType::F32) throw Error("loopback data-parallel reduction: expected fp32 buffers");
  const std::int64_t es = dtype_bytes(buffer.dtype);
  // This member's buffers are written by work ordered before its dp stream now (its
  // gradients' or OPT's event, Compute::grad_bucket / param_bucket): the member that does
  // the work waits for this point of every member's stream.
  EventHandle arrival = make_event();
  TDPIPE_CUDA_CHECK(cudaEventRecord(arrival.get(), ctx.dp()));
  std::unique_lock lock(mu_);
  Group& g = groups_[{rank, call}];
  if (g.ptrs.empty()) {
    g.ptrs.assign(static_cast<std::size_t>(data), nullptr);
    g.recvs.assign(static_cast<std::size_t>(data), nullptr);
  }
  if (g.elements >= 0 && g.elements != buffer.elements)
    g.error = "loopback collective of pipeline rank " + std::to_string(rank) + ": replica " +
              std::to_string(replica) + " has " + std::to_string(buffer.elements) +
              " elements, another replica " + std::to_string(g.elements);
  g.elements = buffer.elements;
  g.ptrs[static_cast<std::size_t>(replica)] = static_cast<unsigned char*>(buffer.data.get());
  if (recv != nullptr) g.recvs[static_cast<std::size_t>(replica)] = static_cast<unsigned char*>(recv->data.get());
  g.arrivals.push_back(arrival);
  if (++g.arrived == data && g.error.empty()) {
    // The last member does the work for all: a sum in replica order into scratch,
    // written back to all (all-reduce) or to each member's owned segment; or each
    // member's owned segment copied to the others (all-gather); or block j of member
    // i's send to block i of member j's receive (all-to-all).
    try {
      cudaStream_t s = ctx.dp();
      for (const EventHandle& ev : g.arrivals) TDPIPE_CUDA_CHECK(cudaStreamWaitEvent(s, ev.get(), 0));
      auto copy = [&](unsigned char* to, const unsigned char* from, std::int64_t n) {
        if (n > 0 && to != from)
          TDPIPE_CUDA_CHECK(cudaMemcpyAsync(to, from, static_cast<std::size_t>(n * es), cudaMemcpyDeviceToDevice, s));
      };
      auto at = [&](std::vector<unsigned char*>& v, int k, std::int64_t element) {
        return v[static_cast<std::size_t>(k)] + element * es;
      };
      auto segment = [&](int member) { return part_range(g.elements, owned_segment(member, data), data); };
      if (what == Collective::AllToAll) {
        const std::int64_t block = g.elements / data;
        for (int i = 0; i < data; ++i)
          for (int j = 0; j < data; ++j) copy(at(g.recvs, j, i * block), at(g.ptrs, i, j * block), block);
      } else if (what == Collective::AllGather) {
        for (int k = 0; k < data; ++k) {
          const auto [b, e] = segment(k);
          for (int j = 0; j < data; ++j)
            if (j != k) copy(at(g.ptrs, j, b), at(g.ptrs, k, b), e - b);
        }
      } else {
        DeviceMemory sum(static_cast<std::size_t>(g.elements) * sizeof(float), s);
        auto f = [&](int k) { return reinterpret_cast<float*>(g.ptrs[static_cast<std::size_t>(k)]); };
        copy(sum.as<unsigned char>(), g.ptrs[0], g.elements);
        for (int k = 1; k < data; ++k) kernels::add(sum.as<float>(), sum.as<float>(), f(k), g.elements, s);
        for (int k = 0; k < data; ++k) {
          const auto [b, e] = what == Collective::AllReduce ? std::pair<std::int64_t, std::int64_t>{0, g.elements}
                                                            : segment(k);
          copy(at(g.ptrs, k, b), sum.as<unsigned char>() + b * es, e - b);
        }
      }  // (scratch is freed in stream order)
      TDPIPE_CUDA_CHECK(cudaStreamSynchronize(s));
    } catch (const std::exception& e) {
      g.error = e.what();
    }
    g.done = true;
    cv_.notify_all();
  } else if (!g.error.empty()) {
    g.done = true;
    cv_.notify_all();
  }
  while (!g.done) {
    if (!aborted_.empty()) throw Error("loopback transport aborted: " + aborted_);
    if (control_->failed()) throw Aborted{};
    cv_.wait_for(lock, std::chrono::milliseconds(50));
  }
  std::string error = g.error;
  if (--g.arrived == 0) groups_.erase({rank, call});
  if (!error.empty()) throw Error(error);
}

void LoopbackFabric::agree_overflow(int world, int tag, std::span<std::uint8_t> flags) {
  if (world <= 1) return;
  std::unique_lock lock(mu_);
  Agreement& a = agreements_[tag];
  if (a.arrived == 0) a.flags.assign(flags.size(), 0);
  if (a.flags.size() != flags.size())
    a.error = "loopback overflow agreement of step " + std::to_string(tag) + ": a rank has " +
              std::to_string(flags.size()) + " slices' flags, another " + std::to_string(a.flags.size());
  for (std::size_t j = 0; j < flags.size() && j < a.flags.size(); ++j) a.flags[j] |= flags[j];
  if (++a.arrived == world) cv_.notify_all();
  while (a.arrived < world && a.error.empty()) {
    if (!aborted_.empty()) throw Error("loopback transport aborted: " + aborted_);
    if (control_->failed()) throw Aborted{};
    cv_.wait_for(lock, std::chrono::milliseconds(50));
  }
  const std::string error = a.error;
  if (error.empty()) std::copy(a.flags.begin(), a.flags.end(), flags.begin());
  if (++a.left == world || !error.empty()) {
    cv_.notify_all();
    if (a.left == world) agreements_.erase(tag);
  }
  if (!error.empty()) throw Error(error);
}

void LoopbackTransport::prepare(std::span<P2POp> batch) {
  ctx_->bind();
  // The tensors' producers may still run on the compute stream: this rank's p2p stream
  // waits for their fences (use_on), and post()'s ready event for a SEND sits on the p2p
  // stream (never on the compute stream, where it would also wait for kernels the
  // compute thread issues meanwhile and delay the copy for nothing).
  for (const P2POp& op : batch)
    if (op.kind == ir::OpKind::SEND) use_on(op.buffer, ctx_->p2p());
}

void LoopbackTransport::post(std::span<P2POp> batch) {
  ctx_->bind();
  const int self = replica_ * stages_ + rank_;
  NvtxRange range(std::string("r") + std::to_string(self) + " p2p batch of " + std::to_string(batch.size()));
  // Checked before anything is posted: a batch is posted whole or not at all.
  std::string labels;
  for (const P2POp& op : batch) {
    check_p2p_op(op, stages_);
    if (!op.buffer.data || op.buffer.bytes() <= 0) throw Error(op.label + ": empty buffer");
    labels += (labels.empty() ? "" : "+") + op.label;
  }
  prepare(batch);  // (again, if the interpreter did: a second wait for one event costs nothing)
  auto& rv = fabric_->p2p();
  using Ticket = std::shared_ptr<RendezvousTicket<EventHandle>>;
  std::vector<Ticket> tickets;
  std::vector<EventHandle> ready;
  for (P2POp& op : batch) {
    const int peer = replica_ * stages_ + op.peer;
    MessageKey key{op.key.payload, op.key.stage, op.key.mb, op.key.slice, op.buffer.bytes()};
    if (op.kind == ir::OpKind::SEND) {
      EventHandle ev = make_event();
      TDPIPE_CUDA_CHECK(cudaEventRecord(ev.get(), ctx_->p2p()));
      ready.push_back(ev);
      tickets.push_back(rv.post_send(self, peer, key,
                                     {op.buffer.data.get(), op.buffer.bytes(), ev.get(),
                                      "rank " + std::to_string(self) + " " + op.label}));
    } else {
      tickets.push_back(rv.post_recv(peer, self, key,
                                     {op.buffer.data.get(), op.buffer.bytes(), ctx_->p2p(), ctx_->device(),
                                      "rank " + std::to_string(self) + " " + op.label}));
    }
  }
  RunControl& control = fabric_->control();
  try {
    std::vector<EventHandle> done;
    for (auto& t : tickets) {
      for (;;) {
        if (control.failed()) throw Aborted{};
        if (auto r = t->try_wait(std::chrono::milliseconds(20))) {
          done.push_back(*r);
          break;
        }
      }
    }
    // Host-side wait: when post returns, the SEND buffers may be freed and the RECV
    // buffers read on another stream (backend.hpp: every call returns complete).
    for (auto& ev : done) wait_event(ev.get(), &control);
  } catch (const std::exception& e) {
    // The first failure names this rank and batch (the interpreter's own report of
    // it would lose the race against the "aborted" errors of the peers woken below).
    control.fail("rank " + std::to_string(self) + " (p2p stream) failed in " + labels + ": " + e.what());
    drain(tickets);
    throw;
  } catch (const Aborted&) {
    drain(tickets);
    throw;
  }
}

void LoopbackTransport::drain(const std::vector<std::shared_ptr<RendezvousTicket<EventHandle>>>& tickets) {
  // This rank is leaving the batch with a failure, and its caller frees the batch's
  // buffers next. Copies from/into them may be in flight, and a peer could still
  // match a pending post and start one: refuse every further match, let matches
  // being made finish, and wait (in the driver: a copy only waits for events that
  // were recorded before it, so it always completes) for the copies that started.
  const std::string why = fabric_->control().failed() ? fabric_->control().failure() : "a rank failed";
  fabric_->abort(why);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (const auto& t : tickets) {
    while (!t->done() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    try {
      if (auto ev = t->try_wait(std::chrono::milliseconds(0))) cudaEventSynchronize(ev->get());
    } catch (const std::exception&) {
      // failed or aborted before a copy started: nothing in flight
    }
  }
}

void LoopbackTransport::run(LoopbackFabric::Collective what, const char* name, const Buffer& buffer, int tag,
                            const Buffer* recv) {
  ctx_->bind();
  NvtxRange range(std::string("r") + std::to_string(replica_ * stages_ + rank_) + " " + name + "(b" +
                  std::to_string(tag) + ")");
  fabric_->collective(what, rank_, replica_, data_, calls_++, buffer, *ctx_, recv);
}

void LoopbackTransport::all_to_all(const Buffer& send, const Buffer& recv, int tag) {
  run(LoopbackFabric::Collective::AllToAll, "ALL_TO_ALL", send, tag, &recv);
}

void LoopbackTransport::all_reduce(const Buffer& buffer, int tag) {
  run(LoopbackFabric::Collective::AllReduce, "ALLREDUCE", buffer, tag);
}

void LoopbackTransport::reduce_scatter(const Buffer& buffer, int tag) {
  run(LoopbackFabric::Collective::ReduceScatter, "REDUCE_SCATTER", buffer, tag);
}

void LoopbackTransport::all_gather(const Buffer& buffer, int tag) {
  run(LoopbackFabric::Collective::AllGather, "ALL_GATHER", buffer, tag);
}

}  // namespace tdpipe::exec::cuda
