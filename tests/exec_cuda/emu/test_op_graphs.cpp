// test_op_graphs.cpp — CUDA graphs on the emulated GPU: the emulation refuses what a
// GPU refuses during capture and keeps a memory node's address and lifetime as CUDA
// does; and with --cuda-graphs a replayed op issues nothing of its own — its kernels
// reach the stream only inside its graph's launch.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "cuda_compute.hpp"
#include "device_context.hpp"
#include "device_memory.hpp"
#include "kernels.cuh"
#include "op_graphs.hpp"
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

  const std::uint64_t items = emu::work_items(s);
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

TEST_CASE("OpGraphs: an op whose signature changed is captured again, and so is every op after it in the step, "
          "which may read what it allocated anew",
          "[emulated][graphs]") {
  // Op 1 allocates and fills a buffer (from pinned memory the host rewrites each step);
  // op 2 doubles it into its own. Step 2 changes op 1's signature only: op 2, captured
  // against op 1's old allocation, must be captured again — a replay would read the old
  // graph's memory, freed (NaN) at the end of step 1.
  DeviceContext ctx(0);
  cudaStream_t s = ctx.compute();
  const std::int64_t n = 16;
  float* host = nullptr;
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&host), n * sizeof(float)) == cudaSuccess);
  std::vector<std::int64_t> captured, replayed;
  {
    OpGraphs graphs(s);
    for (int step = 0; step < 4; ++step) {
      INFO("step " << step);
      std::fill(host, host + n, static_cast<float>(step + 1));
      graphs.begin_step();
      Buffer a, b;
      graphs.run({0, 0, 0, 0}, {step < 2 ? 1u : 2u}, [&] {
        a = device_buffer(n, s);
        if (issuing()) REQUIRE(cudaMemcpyAsync(a.data.get(), host, n * sizeof(float), cudaMemcpyHostToDevice, s) == 0);
      }, "op 1");
      graphs.run({1, 0, 0, 0}, {}, [&] {
        b = device_buffer(n, s);
        if (issuing()) kernels::add(b.as<float>(), a.as<float>(), a.as<float>(), n, s);
      }, "op 2");
      const std::vector<float> got = download(b.as<float>(), static_cast<std::size_t>(n), s);
      CHECK(got == std::vector<float>(static_cast<std::size_t>(n), 2.f * static_cast<float>(step + 1)));
      captured.push_back(graphs.captured());
      replayed.push_back(graphs.replayed());
    }  // a and b freed outside any graph, as begin_step drops an op's leftovers
  }
  CHECK(captured == std::vector<std::int64_t>{2, 2, 4, 4});
  CHECK(replayed == std::vector<std::int64_t>{0, 2, 2, 4});
  cudaFreeHost(host);
}

TEST_CASE("CUDA graphs: after the first step each F, B, BW and W is one graph launch and issues nothing of its own "
          "— one stage, and two stages with bf16 between them — with the losses unchanged",
          "[emulated][graphs]") {
  // Nothing but its graph may reach the compute stream during a replayed op (event waits
  // for an input's fence are not work items): an op whose kernel, copy or conversion
  // escaped its gate would show here as a work item, and run twice as a wrong loss.
  struct Case {
    std::string schedule;
    int p;
    bool bf16_wire;
  };
  for (const Case& c : {Case{"1f1b", 1, false}, Case{"zb-h1", 1, false}, Case{"zb-h1", 2, true}, Case{"1f1b", 2, true}}) {
    INFO(c.schedule << " p=" << c.p << (c.bf16_wire ? ", bf16 between stages" : ""));
    const ir::Plan plan = planner::build_plan(test::tiny_scenario(c.p, 1, 4), c.schedule, 1).lowered;
    std::vector<double> losses[2];
    for (const bool graphs : {false, true}) {
      cpu::TrainOptions train = test::train_options(3);
      train.cuda_graphs = graphs;
      train.bf16_wire = c.bf16_wire;
      const cpu::GptConfig config = cpu::model_config(plan, train);
      const cpu::Corpus corpus = cpu::training_corpus(train);
      RunControl control;
      LoopbackFabric fabric(control);
      std::vector<std::unique_ptr<DeviceContext>> ctx;
      std::vector<std::unique_ptr<CudaCompute>> compute;
      std::vector<std::unique_ptr<Counting>> counting;
      std::vector<std::unique_ptr<LoopbackTransport>> transport;
      std::vector<std::unique_ptr<CudaClock>> clock;
      for (int r = 0; r < c.p; ++r) {
        ctx.push_back(std::make_unique<DeviceContext>(0));
        compute.push_back(std::make_unique<CudaCompute>(config, plan, r, 0, corpus, train, *ctx.back(), &control));
        counting.push_back(std::make_unique<Counting>(*compute.back(), ctx.back()->compute()));
        transport.push_back(std::make_unique<LoopbackTransport>(fabric, *ctx.back(), 0, r, c.p, 1));
      }
      cudaEvent_t origin = nullptr;
      REQUIRE(cudaEventCreate(&origin) == cudaSuccess);
      REQUIRE(cudaEventRecord(origin, ctx[0]->compute()) == cudaSuccess);
      REQUIRE(cudaEventSynchronize(origin) == cudaSuccess);
      for (int r = 0; r < c.p; ++r) clock.push_back(std::make_unique<CudaClock>(*ctx[r], origin));
      // Per rank and step, what each op put on the stream.
      std::vector<std::vector<std::map<std::string, Counting::Seen>>> seen(static_cast<std::size_t>(c.p));
      std::vector<std::vector<double>> rank_loss(static_cast<std::size_t>(c.p));
      std::vector<std::string> errors(static_cast<std::size_t>(c.p));
      std::vector<std::thread> threads;
      for (int r = 0; r < c.p; ++r)
        threads.emplace_back([&, r] {
          const auto i = static_cast<std::size_t>(r);
          try {
            Backend backend{counting[i].get(), transport[i].get(), clock[i].get()};
            for (int step = 0; step < 3; ++step) {
              rank_loss[i].push_back(run_rank_step(plan, r, 0, step, backend, control).loss);
              seen[i].push_back(counting[i]->ops);
            }
          } catch (const std::exception& e) {
            errors[i] = e.what();
          }
        });
      for (auto& t : threads) t.join();
      for (int r = 0; r < c.p; ++r) {
        const auto i = static_cast<std::size_t>(r);
        INFO("rank " << r << ": " << errors[i]);
        REQUIRE(errors[i].empty());
        std::int64_t ops = 0;
        for (const ir::Op& op : plan.ranks[i]) ops += ir::is_chunk_work(op.kind);
        for (int step = 0; step < 3; ++step)
          for (const auto& [name, got] : seen[i][static_cast<std::size_t>(step)]) {
            INFO("step " << step << " " << name << ": " << got.items << " work items, " << got.launches
                         << " graph launches");
            if (!graphs) {
              CHECK(got.launches == 0);
              CHECK(got.items > 0);
            } else {
              CHECK(got.launches == 1);
              if (step > 0) CHECK(got.items == 0);  // a replay: the launch is all
            }
          }
        REQUIRE(seen[i][0].size() == static_cast<std::size_t>(ops));
        if (graphs) {
          CHECK(compute[i]->op_graphs()->captured() == ops);
          CHECK(compute[i]->op_graphs()->replayed() == 2 * ops);
        } else {
          CHECK(compute[i]->op_graphs() == nullptr);
        }
      }
      losses[graphs] = rank_loss[static_cast<std::size_t>(c.p - 1)];
      clock.clear();
      cudaEventDestroy(origin);
    }
    CHECK(losses[1] == losses[0]);
  }
}
