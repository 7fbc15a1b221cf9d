// op_graphs.cpp — per-op CUDA graphs: capture, replay, and what an op's host code does
// while its graph is captured or replayed (op_graphs.hpp).
#include "op_graphs.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_set>

#include "check.hpp"

namespace tdpipe::exec::cuda {

namespace {

// Graph allocations not yet freed, process-wide (a free may come from any rank's thread);
// `any_owned`: some op was ever captured, else a free need not look.
std::atomic<bool> any_owned{false};
std::mutex owned_mu;
std::unordered_set<void*>& owned() {
  static auto* s = new std::unordered_set<void*>;
  return *s;
}
bool is_owned(void* p) {
  std::lock_guard lock(owned_mu);
  return owned().count(p) > 0;
}
void disown(void* p) {
  if (!any_owned.load(std::memory_order_relaxed)) return;
  std::lock_guard lock(owned_mu);
  owned().erase(p);
}

// The op this thread is capturing (capture) or replaying.
struct Scope {
  bool capture = false;
  cudaStream_t stream = nullptr;
  std::vector<std::pair<void*, std::size_t>>* allocs = nullptr;
  std::size_t next = 0;  // replay: the next recorded allocation
  std::vector<std::pair<void*, cudaStream_t>> deferred;  // frees after the launch
  std::vector<std::function<void()>> after;               // host calls after the launch
};
thread_local Scope* current = nullptr;

// A destructor's free must not throw: report and go on (the context is broken anyway).
void free_async(void* p, cudaStream_t stream) noexcept {
  const cudaError_t status = cudaFreeAsync(p, stream);
  if (status != cudaSuccess) std::fprintf(stderr, "tdpipe: cudaFreeAsync failed: %s\n", cudaGetErrorString(status));
}

// The graph's memory nodes get their memory at instantiation or launch: where the
// device is full, the same advice as device_memory.cpp's message.
void check_graph(cudaError_t status, const char* doing, const std::string& name) {
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw Error(std::string("GPU out of memory ") + doing + " the CUDA graph of " + name +
                " (its memory nodes: what the op allocates): lower micro_batch, seq or layers, use a schedule that "
                "keeps fewer micro-batches in flight, or run with --cuda-graphs off");
  }
  TDPIPE_CUDA_CHECK(status);
}

}  // namespace

bool issuing() { return current == nullptr || current->capture; }

bool graph_allocate(std::size_t bytes, cudaStream_t stream, void** out) {
  Scope* s = current;
  if (s == nullptr || stream != s->stream) return false;
  if (s->capture) {
    TDPIPE_CUDA_CHECK(cudaMallocAsync(out, bytes, stream));  // a memory node of the graph
    s->allocs->emplace_back(*out, bytes);
  } else {
    if (s->next >= s->allocs->size() || (*s->allocs)[s->next].second != bytes)
      throw Error("CUDA graph replay: the op allocated " + std::to_string(bytes) + " bytes as its allocation " +
                  std::to_string(s->next + 1) + ", which its capture did not (" +
                  std::to_string(s->allocs->size()) + " allocations); run without --cuda-graphs and report it");
    *out = (*s->allocs)[s->next++].first;
  }
  std::lock_guard lock(owned_mu);
  owned().insert(*out);
  any_owned.store(true, std::memory_order_relaxed);
  return true;
}

void free_device(void* p, cudaStream_t stream) noexcept {
  Scope* s = current;
  if (s == nullptr) {
    disown(p);
    free_async(p, stream);
    return;
  }
  if (stream == s->stream && is_owned(p)) {
    disown(p);
    if (s->capture) free_async(p, stream);  // a free node (the graph that allocated it may be another op's)
    return;
  }
  s->deferred.emplace_back(p, stream);
}

void record_event(cudaEvent_t event, cudaStream_t stream) {
  Scope* s = current;
  if (s == nullptr || stream != s->stream) {
    TDPIPE_CUDA_CHECK(cudaEventRecord(event, stream));
    return;
  }
  if (s->capture) TDPIPE_CUDA_CHECK(cudaEventRecordWithFlags(event, stream, cudaEventRecordExternal));
}

void after_launch(std::function<void()> f) {
  if (current == nullptr)
    f();
  else
    current->after.push_back(std::move(f));
}

OpGraphs::~OpGraphs() {
  for (auto& [key, e] : entries_)
    if (e.exec) cudaGraphExecDestroy(e.exec);
}

void OpGraphs::run(const Key& key, std::vector<std::uint64_t> signature, const std::function<void()>& body,
                   const std::string& name) {
  Entry& e = entries_[key];
  const bool replay = e.exec != nullptr && !fresh_ && e.signature == signature;
  if (!replay) {
    if (e.exec) TDPIPE_CUDA_CHECK(cudaGraphExecDestroy(e.exec));
    e = Entry{};
    e.signature = std::move(signature);
  }
  Scope scope;
  scope.capture = !replay;
  scope.stream = stream_;
  scope.allocs = &e.allocs;
  // Ends the scope on every path; the deferred frees and host calls only once launched.
  struct Leave {
    Scope& s;
    ~Leave() {
      current = nullptr;
      for (auto& [p, stream] : s.deferred) {
        disown(p);
        free_async(p, stream);
      }
    }
  } leave{scope};
  current = &scope;
  if (replay) {
    body();  // host side only: its device work is the graph's
    if (scope.next != e.allocs.size())
      throw Error("CUDA graph replay of " + name + ": the op allocated " + std::to_string(scope.next) +
                  " buffers, its capture " + std::to_string(e.allocs.size()) + "; run without --cuda-graphs");
    ++replayed_;
  } else {
    fresh_ = true;
    TDPIPE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t graph = nullptr;
    try {
      body();
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      e = Entry{};
      throw;
    }
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    if (ended != cudaSuccess) {
      e = Entry{};
      throw Error(std::string("CUDA graph capture of ") + name + " failed (" + cudaGetErrorName(ended) + ": " +
                  cudaGetErrorString(ended) + "): the op does something a graph cannot hold; run without --cuda-graphs");
    }
    const cudaError_t made = cudaGraphInstantiate(&e.exec, graph, 0);
    cudaGraphDestroy(graph);
    if (made != cudaSuccess) {
      e = Entry{};
      check_graph(made, "instantiating", name);
    }
    ++captured_;
  }
  check_graph(cudaGraphLaunch(e.exec, stream_), "launching", name);
  current = nullptr;
  std::vector<std::function<void()>> after = std::move(scope.after);
  for (auto& f : after) f();
}

}  // namespace tdpipe::exec::cuda
