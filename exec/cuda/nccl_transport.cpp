// nccl_transport.cpp — grouped ncclSend/ncclRecv and ncclAllReduce, waited for
// without blocking in the driver so a failed peer cannot hang the process.
#include "nccl_transport.hpp"

#include <chrono>
#include <string>
#include <thread>

#include "check.hpp"
#include "device_memory.hpp"
#include "nvtx.hpp"
#include "tdpipe/exec/faults.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec::cuda {

void NcclTransport::wait(cudaStream_t stream, ncclComm_t comm) {
  for (int i = 0;; ++i) {
    cudaError_t status = cudaStreamQuery(stream);
    if (status != cudaSuccess && status != cudaErrorNotReady) TDPIPE_CUDA_CHECK(status);
    // The communicator's error is checked even once the stream is idle: an operation on
    // an aborted communicator may end without having moved its data.
    ncclResult_t async = ncclSuccess;
    TDPIPE_NCCL_CHECK(ncclCommGetAsyncError(comm, &async));
    // A peer that left (its communicator aborted, its process gone): recoverable by a
    // restart of every process from a checkpoint; other NCCL errors are not.
    if (async == ncclRemoteError && restartable_)
      throw RankFault(std::string("NCCL: ") + ncclGetErrorString(async) + " (a peer process failed or left)");
    if (async != ncclSuccess && async != ncclInProgress)
      throw Error(std::string("NCCL asynchronous error: ") + ncclGetErrorString(async) +
                  " (a peer process failed? set NCCL_DEBUG=INFO)");
    if (status == cudaSuccess) return;
    if (control_ != nullptr && control_->failed()) throw Aborted{};
    if (i > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    else std::this_thread::yield();
  }
}

void NcclTransport::prepare(std::span<P2POp> batch) {
  ctx_->bind();
  for (const P2POp& op : batch)
    if (op.kind == ir::OpKind::SEND) use_on(op.buffer, ctx_->p2p());  // after its producer's kernels
}

void NcclTransport::post(std::span<P2POp> batch) {
  ctx_->bind();
  NvtxRange range(std::string("r") + std::to_string(replica_ * stages_ + rank_) + " nccl batch of " + std::to_string(batch.size()));
  // Everything is checked before the group opens: a throw between ncclGroupStart
  // and ncclGroupEnd would leave the group open for every later NCCL call.
  for (const P2POp& op : batch) {
    check_p2p_op(op, stages_);
    if (op.buffer.dtype != DType::F32 && op.buffer.dtype != DType::BF16)
      throw Error(op.label + ": the CUDA backend moves fp32 or bf16 tensors");
    if (op.buffer.elements < 1 || !op.buffer.data)
      throw Error(op.label + ": empty buffer");
  }
  cudaStream_t s = ctx_->p2p();
  prepare(batch);  // (again, if the interpreter did: a second wait for one event costs nothing)
  TDPIPE_NCCL_CHECK(ncclGroupStart());
  try {
    for (P2POp& op : batch) {
      const int peer = replica_ * stages_ + op.peer;
      const auto n = static_cast<std::size_t>(op.buffer.elements);
      const ncclDataType_t type = op.buffer.dtype == DType::BF16 ? ncclBfloat16 : ncclFloat32;
      if (op.kind == ir::OpKind::SEND)
        TDPIPE_NCCL_CHECK(ncclSend(op.buffer.data.get(), n, type, peer, world_, s));
      else
        TDPIPE_NCCL_CHECK(ncclRecv(op.buffer.data.get(), n, type, peer, world_, s));
    }
  } catch (...) {
    ncclGroupEnd();
    throw;
  }
  TDPIPE_NCCL_CHECK(ncclGroupEnd());
  wait(s, world_);
}

void NcclTransport::all_reduce(const Buffer& buffer, int tag) {
  ctx_->bind();
  NvtxRange range(std::string("r") + std::to_string(replica_ * stages_ + rank_) + " ALLREDUCE(b" + std::to_string(tag) + ")");
  if (dp_ == nullptr) return;
  if (buffer.dtype != DType::F32) throw Error("NCCL all-reduce: expected fp32 gradients");
  TDPIPE_NCCL_CHECK(ncclAllReduce(buffer.data.get(), buffer.data.get(), static_cast<std::size_t>(buffer.elements),
                                  ncclFloat32, ncclSum, dp_, ctx_->dp()));
  wait(ctx_->dp(), dp_);
}

std::pair<int, int> NcclTransport::dp_member() const {
  if (dp_ == nullptr) return {0, 1};
  int members = 1, member = 0;
  TDPIPE_NCCL_CHECK(ncclCommCount(dp_, &members));
  TDPIPE_NCCL_CHECK(ncclCommUserRank(dp_, &member));
  return {member, members};
}

void NcclTransport::segments(const Buffer& buffer, int tag, bool reduce) {
  ctx_->bind();
  NvtxRange range(std::string("r") + std::to_string(replica_ * stages_ + rank_) +
                  (reduce ? " REDUCE_SCATTER(b" : " ALL_GATHER(b") + std::to_string(tag) + ")");
  if (dp_ == nullptr) return;
  // Sums take fp32; an all-gather also moves bytes (1-bit Adam's packed momentum).
  if (buffer.dtype != DType::F32 && (reduce || buffer.dtype != DType::U8))
    throw Error("NCCL data-parallel collective: expected fp32 buffers (or bytes to gather)");
  const ncclDataType_t type = buffer.dtype == DType::U8 ? ncclUint8 : ncclFloat32;
  const std::int64_t es = dtype_bytes(buffer.dtype);
  const int members = dp_member().second;
  auto* data = static_cast<unsigned char*>(buffer.data.get());
  TDPIPE_NCCL_CHECK(ncclGroupStart());
  try {
    for (int owner = 0; owner < members; ++owner) {
      const auto [b, e] = part_range(buffer.elements, owned_segment(owner, members), members);
      if (e == b) continue;
      if (reduce)
        TDPIPE_NCCL_CHECK(ncclReduce(data + b * es, data + b * es, static_cast<std::size_t>(e - b), type, ncclSum,
                                     owner, dp_, ctx_->dp()));
      else
        TDPIPE_NCCL_CHECK(ncclBroadcast(data + b * es, data + b * es, static_cast<std::size_t>(e - b), type, owner,
                                        dp_, ctx_->dp()));
    }
  } catch (...) {
    ncclGroupEnd();
    throw;
  }
  TDPIPE_NCCL_CHECK(ncclGroupEnd());
  wait(ctx_->dp(), dp_);
}

void NcclTransport::agree_overflow(std::span<std::uint8_t> flags, int tag) {
  if (flags.empty() || ctl_ == nullptr) return;  // (a world of one agrees with itself)
  ctx_->bind();
  std::vector<float> host(flags.begin(), flags.end());
  const std::size_t bytes = host.size() * sizeof(float);
  cudaStream_t s = ctx_->compute();
  DeviceMemory buf(bytes, s);
  TDPIPE_CUDA_CHECK(cudaMemcpyAsync(buf.get(), host.data(), bytes, cudaMemcpyHostToDevice, s));
  NvtxRange range("overflow flags of step " + std::to_string(tag));
  TDPIPE_NCCL_CHECK(ncclAllReduce(buf.get(), buf.get(), host.size(), ncclFloat32, ncclMax, ctl_, s));
  wait(s, ctl_);
  TDPIPE_CUDA_CHECK(cudaMemcpyAsync(host.data(), buf.get(), bytes, cudaMemcpyDeviceToHost, s));
  TDPIPE_CUDA_CHECK(cudaStreamSynchronize(s));
  for (std::size_t j = 0; j < flags.size(); ++j) flags[j] = host[j] > 0.f ? 1 : 0;
}

void NcclTransport::all_to_all(const Buffer& send, const Buffer& recv, int tag) {
  ctx_->bind();
  NvtxRange range(std::string("r") + std::to_string(replica_ * stages_ + rank_) + " ALL_TO_ALL(b" +
                  std::to_string(tag) + ")");
  const auto [member, members] = dp_member();
  if (send.empty() || recv.empty() || send.bytes() != recv.bytes() || send.bytes() % members != 0)
    throw Error("NCCL all-to-all: send and receive buffers must be equal and hold one block per replica");
  const std::int64_t block = send.bytes() / members;
  const auto* from = static_cast<const unsigned char*>(send.data.get());
  auto* to = static_cast<unsigned char*>(recv.data.get());
  cudaStream_t s = ctx_->dp();
  if (block > 0)
    TDPIPE_CUDA_CHECK(cudaMemcpyAsync(to + member * block, from + member * block, static_cast<std::size_t>(block),
                                      cudaMemcpyDeviceToDevice, s));
  if (dp_ == nullptr) {
    wait_stream(s, control_);
    return;
  }
  // NCCL's all-to-all: one group of sends and receives with every other member.
  TDPIPE_NCCL_CHECK(ncclGroupStart());
  try {
    for (int j = 0; j < members && block > 0; ++j) {
      if (j == member) continue;
      TDPIPE_NCCL_CHECK(ncclSend(from + j * block, static_cast<std::size_t>(block), ncclUint8, j, dp_, s));
      TDPIPE_NCCL_CHECK(ncclRecv(to + j * block, static_cast<std::size_t>(block), ncclUint8, j, dp_, s));
    }
  } catch (...) {
    ncclGroupEnd();
    throw;
  }
  TDPIPE_NCCL_CHECK(ncclGroupEnd());
  wait(s, dp_);
}

void NcclTransport::reduce_scatter(const Buffer& buffer, int tag) { segments(buffer, tag, true); }

void NcclTransport::all_gather(const Buffer& buffer, int tag) { segments(buffer, tag, false); }

void NcclTransport::warm_up(const std::set<int>& pipeline_peers, const std::vector<Buffer>& dp_buckets,
                            bool sharded, bool compressed) {
  ctx_->bind();
  cudaStream_t s = ctx_->p2p();
  const int n = static_cast<int>(pipeline_peers.size());
  DeviceMemory buf(static_cast<std::size_t>(2 * n + 1) * sizeof(float), s, true);
  TDPIPE_NCCL_CHECK(ncclGroupStart());
  try {
    int i = 0;
    for (int peer : pipeline_peers) {
      const int w = replica_ * stages_ + peer;
      TDPIPE_NCCL_CHECK(ncclSend(buf.as<float>() + 2 * i, 1, ncclFloat32, w, world_, s));
      TDPIPE_NCCL_CHECK(ncclRecv(buf.as<float>() + 2 * i + 1, 1, ncclFloat32, w, world_, s));
      ++i;
    }
  } catch (...) {
    ncclGroupEnd();
    throw;
  }
  TDPIPE_NCCL_CHECK(ncclGroupEnd());
  wait(s, world_);
  if (dp_ != nullptr) {
    TDPIPE_NCCL_CHECK(ncclAllReduce(buf.as<float>() + 2 * n, buf.as<float>() + 2 * n, 1, ncclFloat32, ncclSum, dp_,
                                    ctx_->dp()));
    wait(ctx_->dp(), dp_);
    // The buckets' own sizes (their contents are gradients that begin_step zeroes).
    for (const Buffer& b : dp_buckets) {
      if (b.dtype != DType::F32 || b.elements < 1) throw Error("NCCL warm-up: expected non-empty fp32 gradient buckets");
      if (sharded) {  // the plan's own calls: reduce and broadcast chains per segment
        segments(b, -1, true);
        segments(b, -1, false);
        continue;
      }
      TDPIPE_NCCL_CHECK(ncclAllReduce(b.data.get(), b.data.get(), static_cast<std::size_t>(b.elements), ncclFloat32,
                                      ncclSum, dp_, ctx_->dp()));
      wait(ctx_->dp(), dp_);
    }
    // 1-bit Adam's compressed steps send to every replica and broadcast bytes: connect
    // those too (the warm-up steps only all-reduce).
    if (compressed) {
      const int members = dp_member().second;
      Buffer send = device_bytes(members, ctx_->dp()), recv = device_bytes(members, ctx_->dp());
      all_to_all(send, recv, -1);
      all_gather(recv, -1);
    }
  }
}

}  // namespace tdpipe::exec::cuda
