// op_graphs.hpp — internal to exec/cuda: CUDA graphs per compute op (TrainOptions::
// cuda_graphs, `tdpipe exec --cuda-graphs on`).
//
// An op (F, B, BW or W of one micro-batch, chunk and slice) is captured into a graph the
// first step it runs and replayed every later step. What it allocates on its stream
// during capture becomes the graph's memory nodes: the same addresses at every launch,
// so the ops after it, captured against those addresses, stay valid. A replay still
// runs the op's host code — the stage's bookkeeping of saved activations, what it frees,
// its progress calls — with its device work gated off (issuing() is false): every
// kernel, GEMM, copy and memset an op issues is written `if (issuing()) …`, device
// memory comes back at the addresses the capture recorded, and the graph launch does
// the work. So the host pays one launch per op instead of one per kernel.
//
// A graph is valid while what it baked in holds: its signature (the input's address,
// host values such as fp16's loss scales) and every address the ops before it in the
// step produced. Hence: an op whose signature changed is captured again, and so is
// every op after it in that step, since it may read what that op allocated anew. (A
// step of a rank runs all its ops with graphs or none: CudaCompute.) Frees of memory no graph allocated, and the
// host calls an op makes about progress (after_launch), wait until its graph is
// launched. A RECV's buffer is one persistent slot per tensor (CudaCompute::allocate),
// so an op's input address is stable from step to step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

namespace tdpipe::exec::cuda {

/// False while the calling thread's op replays its graph: its device work is in the graph.
bool issuing();
/// Memory for `bytes` on `stream` inside an op's capture or replay (a memory node; on
/// replay, the address the capture got). False when no op on `stream` is being captured
/// or replayed on this thread: allocate as usual.
bool graph_allocate(std::size_t bytes, cudaStream_t stream, void** out);
/// Frees device memory `p` in order on `stream` (its last user), reporting a failure
/// (never throws: deleters call it). Inside an op's capture or replay: a graph's memory
/// on that stream is freed by the graph (a free node), any other once the graph is
/// launched.
void free_device(void* p, cudaStream_t stream) noexcept;
/// Records `event` on `stream` behind the work so far: a record node during capture,
/// nothing during replay (the node records it), else cudaEventRecord.
void record_event(cudaEvent_t event, cudaStream_t stream);
/// Runs `f` now, or once the op being captured or replayed on this thread is launched.
void after_launch(std::function<void()> f);

/// The graphs of one rank's compute ops on its compute stream.
class OpGraphs {
 public:
  /// (kind, micro-batch, chunk, slice) of a compute op.
  using Key = std::tuple<int, int, int, int>;
  explicit OpGraphs(cudaStream_t stream) : stream_(stream) {}
  ~OpGraphs();
  OpGraphs(const OpGraphs&) = delete;
  OpGraphs& operator=(const OpGraphs&) = delete;

  /// A new step: no op of it has been captured yet.
  void begin_step() { fresh_ = false; }
  /// Issues op `key` on the stream: replays its graph if `signature` is the one it was
  /// captured with and no op before it this step was captured, else captures `body`
  /// (which issues the op's work on the stream and may throw) and launches the graph.
  /// `name` names the op in errors.
  void run(const Key& key, std::vector<std::uint64_t> signature, const std::function<void()>& body,
           const std::string& name);
  /// Ops captured and replayed so far (every step's).
  std::int64_t captured() const { return captured_; }
  std::int64_t replayed() const { return replayed_; }

 private:
  struct Entry {
    cudaGraphExec_t exec = nullptr;
    std::vector<std::uint64_t> signature;
    std::vector<std::pair<void*, std::size_t>> allocs;  ///< its memory nodes, in the op's order
  };
  cudaStream_t stream_;
  std::map<Key, Entry> entries_;
  bool fresh_ = false;  ///< an op of this step was captured
  std::int64_t captured_ = 0, replayed_ = 0;
};

}  // namespace tdpipe::exec::cuda
