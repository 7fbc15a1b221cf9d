// test_op_graphs.cpp — CUDA graphs on the emulated GPU: the emulation refuses what a
// GPU refuses during capture and keeps a memory node's address and lifetime as CUDA
// does; and with --cuda-graphs a replayed op issues nothing of its own — its kernels
// reach the stream only inside its graph's launch.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <map>
#include <vector>

#include <cuda_runtime.h>

#include "cuda_compute.hpp"
#include "device_context.hpp"
#include "kernels.cuh"
#include "loopback_transport.hpp"
#include "tdpipe/exec/cuda/timeline.hpp"
#include "tdpipe/exec/interpreter.hpp"
#include "tdpipe/exec/launch_common.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "../gpu/gpu_test_util.hpp"

namespace {
using namespace tdpipe;
using namespace tdpipe::exec;
using namespace tdpipe::exec::cuda;

std::vector<float> download(const float* p, std::size_t n, cudaStream_t stream) {
  std::vector<float> host(n);
  REQUIRE(cudaMemcpyAsync(host.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  return host;
}

// Forwards to a CudaCompute and counts, around each op, what the host put on the compute
// stream itself (emu::work_items) and the graphs it launched there.
struct Counting final : Compute {
  CudaCompute& inner;
  cudaStream_t stream;
  struct Seen {
    std::uint64_t items = 0, launches = 0;
  };
  std::map<std::string, Seen> ops;  // this step's, by op name
  Counting(CudaCompute& c, cudaStream_t s) : inner(c), stream(s) {}
  void begin_step(int step) override {
    ops.clear();
    inner.begin_step(step);
  }
  Buffer run(const ComputeOp& op, Buffer input) override {
    const std::uint64_t items = emu::work_items(stream), launches = emu::graph_launches(stream);
    Buffer out = inner.run(op, std::move(input));
    if (op.kind != ir::OpKind::OPT) {
      ir::Op named;
      named.kind = op.kind;
      named.mb = op.mb;
      named.chunk = op.chunk;
      named.slice = op.slice;
      ops[trace_name(named)] = {emu::work_items(stream) - items, emu::graph_launches(stream) - launches};
    }
    return out;
  }
  void issued(const ComputeOp& op, const Buffer& out) override { inner.issued(op, out); }
  Buffer allocate(const TensorKey& key) override { return inner.allocate(key); }
  Buffer grad_bucket(int chunk, int index, int count) override { return inner.grad_bucket(chunk, index, count); }
  Buffer param_bucket(int chunk, int index, int count) override { return inner.param_bucket(chunk, index, count); }
  double end_step() override { return inner.end_step(); }
};

}  // namespace

TEST_CASE("emulated GPU graphs: a captured kernel replays at each launch, a memory node keeps its address and is "
          "NaN again at each launch, and a launch before its last allocation is freed is refused",
          "[emulated][graphs]") {
  DeviceContext ctx(0);
  cudaStream_t s = ctx.compute();
  const std::size_t n = 64;
  float *a = nullptr, *out = nullptr;
  REQUIRE(cudaMallocAsync(reinterpret_cast<void**>(&a), n * sizeof(float), s) == cudaSuccess);
  std::vector<float> ramp(n);
  for (std::size_t i = 0; i < n; ++i) ramp[i] = static_cast<float>(i);
  REQUIRE(cudaMemcpyAsync(a, ramp.data(), n * sizeof(float), cudaMemcpyHostToDevice, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);

  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  cudaStreamCaptureStatus status{};
  REQUIRE(cudaStreamIsCapturing(s, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusActive);
  float* scratch = nullptr;
  REQUIRE(cudaMallocAsync(reinterpret_cast<void**>(&out), n * sizeof(float), s) == cudaSuccess);
  REQUIRE(cudaMallocAsync(reinterpret_cast<void**>(&scratch), n * sizeof(float), s) == cudaSuccess);
  kernels::add(scratch, a, a, static_cast<std::int64_t>(n), s);  // 2a
  kernels::add(out, scratch, a, static_cast<std::int64_t>(n), s);  // 3a
  REQUIRE(cudaFreeAsync(scratch, s) == cudaSuccess);               // a free node
  const std::uint64_t items = emu::work_items(s);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  CHECK(emu::work_items(s) == items);  // captured, not run
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  cudaGraphExec_t twice = nullptr;
  CHECK(cudaGraphInstantiate(&twice, graph, 0) == cudaErrorInvalidValue);  // memory nodes: one at a time
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);

  for (int launch = 0; launch < 3; ++launch) {
    INFO("launch " << launch);
    // Before it runs, `out` is not written: the launch's memory node makes it NaN again.
    REQUIRE(cudaMemsetAsync(out, 0, n * sizeof(float), s) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    const std::vector<float> got = download(out, n, s);
    for (std::size_t i = 0; i < n; ++i) REQUIRE(got[i] == 3.f * static_cast<float>(i));
    // `out` is still held: launching again first is what CUDA refuses.
    CHECK(cudaGraphLaunch(exec, s) == cudaErrorInvalidValue);
    cudaGetLastError();
    REQUIRE(cudaFreeAsync(out, s) == cudaSuccess);
    CHECK(std::isnan(download(out, 1, s)[0]));  // freed: NaN
  }
  CHECK(cudaFreeAsync(out, s) == cudaErrorInvalidValue);  // not held: a double free
  cudaGetLastError();
  CHECK(emu::graph_launches(s) == 3);
  REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  REQUIRE(cudaFreeAsync(a, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
}

TEST_CASE("emulated GPU graphs: what a GPU refuses during capture invalidates it, and an external event record is a "
          "node recorded at each launch",
          "[emulated][graphs]") {
  DeviceContext ctx(0);
  cudaStream_t s = ctx.compute(), other = ctx.p2p();
  float* plain = nullptr;
  REQUIRE(cudaMallocAsync(reinterpret_cast<void**>(&plain), 16, s) == cudaSuccess);
  cudaEvent_t ev = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess);
  float host[4] = {};
  const std::vector<std::pair<const char*, std::function<cudaError_t()>>> refused = {
      {"a host wait", [&] { return cudaStreamSynchronize(s); }},
      {"a query", [&] { return cudaStreamQuery(s); }},
      {"a plain event record", [&] { return cudaEventRecord(ev, s); }},
      {"an event wait", [&] { return cudaStreamWaitEvent(s, ev, 0); }},
      {"a pageable copy", [&] { return cudaMemcpyAsync(plain, host, sizeof host, cudaMemcpyHostToDevice, s); }},
      {"a free of memory no graph allocated", [&] { return cudaFreeAsync(plain, s); }},
  };
  for (const auto& [what, call] : refused) {
    INFO(what);
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    CHECK(call() == cudaErrorStreamCaptureUnsupported);
    cudaGetLastError();
    cudaGraph_t g = nullptr;
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
    CHECK(g == nullptr);
    cudaGetLastError();
  }
  cudaGraph_t none = nullptr;
  CHECK(cudaStreamEndCapture(s, &none) == cudaErrorIllegalState);  // not capturing
  cudaGetLastError();

  // A record node: another stream that waits for the event after a launch waits for the
  // node, i.e. for the kernel before it in the graph.
  const std::size_t n = 32;
  float *x = nullptr, *y = nullptr;
  REQUIRE(cudaMallocAsync(reinterpret_cast<void**>(&x), n * sizeof(float), s) == cudaSuccess);
  REQUIRE(cudaMallocAsync(reinterpret_cast<void**>(&y), n * sizeof(float), other) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(x, 0, n * sizeof(float), s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(other) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  kernels::scale(x, 0.f, static_cast<std::int64_t>(n), s);
  const std::vector<float> ones(n, 1.f);
  float* one = nullptr;
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&one), n * sizeof(float)) == cudaSuccess);
  std::copy(ones.begin(), ones.end(), one);
  REQUIRE(cudaMemcpyAsync(x, one, n * sizeof(float), cudaMemcpyHostToDevice, s) == cudaSuccess);  // pinned: a node
  REQUIRE(cudaEventRecordWithFlags(ev, s, cudaEventRecordExternal) == cudaSuccess);
  cudaGraph_t g = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &g) == cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, g, 0) == cudaSuccess);
  for (int launch = 0; launch < 3; ++launch) {
    REQUIRE(cudaMemsetAsync(x, 0, n * sizeof(float), s) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(other, ev, 0) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(y, x, n * sizeof(float), cudaMemcpyDeviceToDevice, other) == cudaSuccess);
    CHECK(download(y, n, other) == ones);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  cudaFreeHost(one);
  cudaFreeAsync(x, s);
  cudaFreeAsync(y, other);
  cudaFreeAsync(plain, s);
  cudaEventDestroy(ev);
  cudaStreamSynchronize(s);
  cudaStreamSynchronize(other);
}

TEST_CASE("CUDA graphs: after the first step each F, B and W is one graph launch and issues nothing of its own, "
          "with the step's loss unchanged",
          "[emulated][graphs]") {
  // One stage, so every op is the rank's own and has no input: nothing but its graph may
  // reach the compute stream during the op (an op whose kernel escaped the gate would
  // show here as a work item — and, run twice, as a wrong loss).
  for (const std::string schedule : {"1f1b", "zb-h1"}) {
    INFO(schedule);
    const ir::Plan plan = planner::build_plan(test::tiny_scenario(1, 1, 4), schedule, 1).lowered;
    std::vector<double> losses[2];
    for (const bool graphs : {false, true}) {
      cpu::TrainOptions train = test::train_options(3);
      train.cuda_graphs = graphs;
      const cpu::GptConfig config = cpu::model_config(plan, train);
      const cpu::Corpus corpus = cpu::training_corpus(train);
      DeviceContext ctx(0);
      RunControl control;
      CudaCompute compute(config, plan, 0, 0, corpus, train, ctx, &control);
      Counting counting(compute, ctx.compute());
      LoopbackFabric fabric(control);
      LoopbackTransport transport(fabric, ctx, 0, 0, 1, 1);
      cudaEvent_t origin = nullptr;
      REQUIRE(cudaEventCreate(&origin) == cudaSuccess);
      CudaClock clock(ctx, origin);
      Backend backend{&counting, &transport, &clock};
      for (int step = 0; step < 3; ++step) {
        REQUIRE(cudaEventRecord(origin, ctx.compute()) == cudaSuccess);
        const RankStepResult r = run_rank_step(plan, 0, 0, step, backend, control);
        losses[graphs].push_back(r.loss);
        REQUIRE(!counting.ops.empty());
        for (const auto& [name, seen] : counting.ops) {
          INFO("step " << step << " " << name << ": " << seen.items << " work items, " << seen.launches
                       << " graph launches");
          if (!graphs) {
            CHECK(seen.launches == 0);
            CHECK(seen.items > 0);
          } else {
            CHECK(seen.launches == 1);
            if (step > 0) CHECK(seen.items == 0);  // a replay: the launch is all
          }
        }
      }
      if (graphs) {
        CHECK(compute.op_graphs()->captured() == static_cast<std::int64_t>(counting.ops.size()));
        CHECK(compute.op_graphs()->replayed() == 2 * static_cast<std::int64_t>(counting.ops.size()));
      } else {
        CHECK(compute.op_graphs() == nullptr);
      }
      cudaEventDestroy(origin);
    }
    CHECK(losses[1] == losses[0]);
  }
}
