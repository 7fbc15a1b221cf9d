// loopback_transport.hpp — internal to exec/cuda: several pipeline ranks in one
// process on one GPU (NCCL 2.28 cannot put two ranks on one device). Matching
// follows NCCL's rules (rendezvous.hpp); a matched pair is one device-to-device
// copy on the receiver's p2p stream, ordered after the sender's ready event, and
// both sides wait for its done event. Data-parallel replicas in the same process
// reduce by summing their buckets in replica order (bit-identical results).
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <cuda_runtime.h>

#include "device_context.hpp"
#include "tdpipe/exec/backend.hpp"
#include "tdpipe/exec/cuda/rendezvous.hpp"

namespace tdpipe::exec::cuda {

struct LoopbackSend {
  const void* ptr = nullptr;
  std::int64_t bytes = 0;
  cudaEvent_t ready = nullptr;
  std::string label;
};
struct LoopbackRecv {
  void* ptr = nullptr;
  std::int64_t bytes = 0;
  cudaStream_t stream = nullptr;
  int device = 0;
  std::string label;
};
using EventHandle = std::shared_ptr<CUevent_st>;

/// The in-process network of one loopback run.
class LoopbackFabric {
 public:
  explicit LoopbackFabric(RunControl& control);
  Rendezvous<LoopbackSend, LoopbackRecv, EventHandle>& p2p() { return p2p_; }
  RunControl& control() { return *control_; }

  /// What a data-parallel collective writes to each member (Transport's contracts).
  enum class Collective { AllReduce, ReduceScatter, AllGather, AllToAll };
  /// Runs `what` over `buffer` of the `data` replicas of pipeline rank `rank` (call
  /// `call` of that rank's members); blocks until every member arrived and the result
  /// is written. Sums run in replica order, so reduce-scatter equals all-reduce. Sums
  /// take fp32; the all-gather and the all-to-all (`buffer` → `recv`) any elements.
  void collective(Collective what, int rank, int replica, int data, long call, const Buffer& buffer,
                  const DeviceContext& ctx, const Buffer* recv = nullptr);
  /// fp16's overflow agreement: ORs `flags` over the `world` ranks that call it with the
  /// same `tag` (the step) and writes the result back to each; blocks until all arrived.
  void agree_overflow(int world, int tag, std::span<std::uint8_t> flags);
  /// Fails every pending exchange (a rank failed).
  void abort(const std::string& why);

 private:
  struct Group {
    std::vector<unsigned char*> ptrs, recvs;
    std::vector<EventHandle> arrivals;  // each member's dp stream when it arrived
    std::int64_t elements = -1;
    int arrived = 0;
    bool done = false;
    std::string error;
  };
  RunControl* control_;
  Rendezvous<LoopbackSend, LoopbackRecv, EventHandle> p2p_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::tuple<int, long>, Group> groups_;
  struct Agreement {
    std::vector<std::uint8_t> flags;
    int arrived = 0, left = 0;
    std::string error;
  };
  std::map<int, Agreement> agreements_;  // by tag
  std::string aborted_;
};

class LoopbackTransport final : public Transport {
 public:
  LoopbackTransport(LoopbackFabric& fabric, const DeviceContext& ctx, int replica, int rank, int stages, int data)
      : fabric_(&fabric), ctx_(&ctx), replica_(replica), rank_(rank), stages_(stages), data_(data) {}
  void prepare(std::span<P2POp> batch) override;
  void post(std::span<P2POp> batch) override;
  void all_reduce(const Buffer& buffer, int tag) override;
  void reduce_scatter(const Buffer& buffer, int tag) override;
  void all_gather(const Buffer& buffer, int tag) override;
  void all_to_all(const Buffer& send, const Buffer& recv, int tag) override;
  void agree_overflow(std::span<std::uint8_t> flags, int tag) override {
    fabric_->agree_overflow(stages_ * data_, tag, flags);
  }
  std::pair<int, int> dp_member() const override { return {replica_, data_}; }

 private:
  void run(LoopbackFabric::Collective what, const char* name, const Buffer& buffer, int tag,
           const Buffer* recv = nullptr);
  /// After a failure inside post(): abort the fabric and wait for this batch's copies.
  void drain(const std::vector<std::shared_ptr<RendezvousTicket<EventHandle>>>& tickets);
  LoopbackFabric* fabric_;
  const DeviceContext* ctx_;
  int replica_, rank_, stages_, data_;
  long calls_ = 0;
};

}  // namespace tdpipe::exec::cuda
