// test_stream_order.cpp — the CUDA backend's stream order on the emulated GPU: a device
// Buffer's fence (mark_ready / use_on) is what keeps a consumer on another stream from
// reading it before its producer wrote it, or its memory from being freed under a
// consumer; and a step's compute ops return without the host waiting for them.
//
// The emulated GPU makes both failures deterministic here: a stream is held at a gate
// (a work item that waits for the test), memory reads NaN until its allocation's point
// on its stream is reached and again once a stream-ordered free is reached.
#include <catch2/catch.hpp>

#include <cmath>
#include <future>
#include <memory>
#include <vector>

#include <cuda_runtime.h>

#include "cuda_compute.hpp"
#include "device_context.hpp"
#include "device_memory.hpp"
#include "kernels.cuh"
#include "loopback_transport.hpp"
#include "tdpipe/exec/launch_common.hpp"
#include "tdpipe/exec/interpreter.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "../gpu/gpu_test_util.hpp"

namespace {
using namespace tdpipe;
using namespace tdpipe::exec;
using namespace tdpipe::exec::cuda;

// Holds `stream` at this point of its work until open() (or the gate's end).
struct Gate {
  std::promise<void> opened;
  std::shared_future<void> wait = opened.get_future().share();
  bool open_ = false;
  explicit Gate(cudaStream_t stream) {
    emu::submit(stream, [w = wait] { w.wait(); });
  }
  void open() {
    if (!open_) opened.set_value();
    open_ = true;
  }
  ~Gate() { open(); }
};

std::vector<float> download(const float* p, std::size_t n, cudaStream_t stream) {
  std::vector<float> host(n);
  REQUIRE(cudaMemcpyAsync(host.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  return host;
}

// What the two Buffer cases add: n ones and the ramp 0 … n − 1.
struct Inputs {
  std::size_t n = 1000;
  std::vector<float> ones = std::vector<float>(n, 1.f), ramp = std::vector<float>(n);
  Inputs() {
    for (std::size_t i = 0; i < n; ++i) ramp[i] = static_cast<float>(i);
  }
};

// A Buffer of n floats, 1 … n, written on `stream` behind `gate` (its producer "still runs").
Buffer produced(std::size_t n, cudaStream_t stream, const std::vector<float>& ones, const std::vector<float>& ramp) {
  Buffer b = device_buffer(static_cast<std::int64_t>(n), stream);
  DeviceMemory a(n * sizeof(float), stream), c(n * sizeof(float), stream);
  REQUIRE(cudaMemcpyAsync(a.get(), ramp.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(c.get(), ones.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream) == cudaSuccess);
  kernels::add(b.as<float>(), a.as<float>(), c.as<float>(), static_cast<std::int64_t>(n), stream);
  return b;  // a and c are freed in order on `stream`, after the add
}
}  // namespace

TEST_CASE("stream order: a SEND's stream that waits for the Buffer's fence reads what its producer wrote, one that "
          "does not reads garbage",
          "[emulated][stream-order]") {
  DeviceContext ctx(0);
  const Inputs data;
  const std::size_t n = data.n;
  const std::vector<float>&ones = data.ones, &ramp = data.ramp;
  for (const bool fenced : {true, false}) {
    CAPTURE(fenced);
    auto gate = std::make_unique<Gate>(ctx.compute());  // the producer's stream is busy
    Buffer out = produced(n, ctx.compute(), ones, ramp);
    if (fenced) {
      mark_ready(out, ctx.compute());  // CudaCompute::issued
      use_on(out, ctx.p2p());          // the transport, before its copy
    }
    // The "transfer": a device-to-device copy on the p2p stream (a copy to pageable host
    // memory would block the host until it ran, which is behind the gate).
    DeviceMemory sent(n * sizeof(float), ctx.p2p());
    REQUIRE(cudaMemcpyAsync(sent.get(), out.as<float>(), n * sizeof(float), cudaMemcpyDeviceToDevice, ctx.p2p()) ==
            cudaSuccess);
    // Unfenced, the copy runs while the producer is held (it does not wait for it);
    // fenced, it waits behind the gate.
    if (!fenced) REQUIRE(cudaStreamSynchronize(ctx.p2p()) == cudaSuccess);
    gate->open();
    const std::vector<float> got = download(sent.as<float>(), n, ctx.p2p());
    int right = 0;
    for (std::size_t i = 0; i < n; ++i) right += got[i] == ramp[i] + 1.f;
    if (fenced)
      CHECK(right == static_cast<int>(n));
    else
      CHECK(right == 0);  // read before the allocation's point: NaN
    out = Buffer{};
    gate.reset();
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }
}

TEST_CASE("stream order: a consumer that takes over a Buffer's free (use_on) reads it whole, freed on its "
          "producer's stream instead, it reads freed memory",
          "[emulated][stream-order]") {
  DeviceContext ctx(0);
  const Inputs data;
  const std::size_t n = data.n;
  const std::vector<float>&ones = data.ones, &ramp = data.ramp;
  for (const bool taken_over : {true, false}) {
    CAPTURE(taken_over);
    // A RECV's buffer: written on the p2p stream, seen complete by the host.
    Buffer in = produced(n, ctx.p2p(), ones, ramp);
    REQUIRE(cudaStreamSynchronize(ctx.p2p()) == cudaSuccess);
    // The compute op that consumes it is queued behind earlier work…
    auto gate = std::make_unique<Gate>(ctx.compute());
    if (taken_over) use_on(in, ctx.compute());  // CudaCompute::run's check_input
    DeviceMemory sum(n * sizeof(float), ctx.compute());
    kernels::add(sum.as<float>(), in.as<float>(), in.as<float>(), static_cast<std::int64_t>(n), ctx.compute());
    in = Buffer{};  // …and the op returned: the interpreter drops its input
    REQUIRE(cudaStreamSynchronize(ctx.p2p()) == cudaSuccess);  // (a free there is reached now)
    gate->open();
    const std::vector<float> got = download(sum.as<float>(), n, ctx.compute());
    int right = 0;
    for (std::size_t i = 0; i < n; ++i) right += got[i] == 2.f * (ramp[i] + 1.f);
    if (taken_over)
      CHECK(right == static_cast<int>(n));
    else
      CHECK(right == 0);  // freed (NaN) before the kernel read it
    gate.reset();
  }
}

TEST_CASE("stream order: a step's compute ops return with their kernels in flight — the host waits for the compute "
          "stream a fixed few times per step, not once per op, and the trace keeps each op's device interval",
          "[emulated][stream-order]") {
  // One stage, so every op is the rank's own: 4 micro-batches of F and B/W, and OPT.
  ir::Scenario sc = test::tiny_scenario(1, 1, 4);
  const ir::Plan plan = planner::build_plan(sc, "1f1b", 1).lowered;
  const cpu::TrainOptions train = test::train_options(3);
  const cpu::GptConfig config = cpu::model_config(plan, train);
  const cpu::Corpus corpus = cpu::training_corpus(train);
  DeviceContext ctx(0);
  RunControl control;
  CudaCompute compute(config, plan, 0, 0, corpus, train, ctx, &control);
  LoopbackFabric fabric(control);
  LoopbackTransport transport(fabric, ctx, 0, 0, 1, 1);
  cudaEvent_t origin = nullptr;
  REQUIRE(cudaEventCreate(&origin) == cudaSuccess);
  CudaClock clock(ctx, origin);
  Backend backend{&compute, &transport, &clock};
  int compute_ops = 0;
  for (const ir::Op& op : plan.ranks[0]) compute_ops += ir::is_compute(op.kind);
  REQUIRE(compute_ops >= 9);
  std::vector<std::uint64_t> waits;
  for (int step = 0; step < 3; ++step) {
    REQUIRE(cudaEventRecord(origin, ctx.compute()) == cudaSuccess);
    REQUIRE(cudaEventSynchronize(origin) == cudaSuccess);
    const std::uint64_t before = emu::blocked_host_waits(ctx.compute());
    const RankStepResult r = run_rank_step(plan, 0, 0, step, backend, control);
    waits.push_back(emu::blocked_host_waits(ctx.compute()) - before);
    CHECK(std::isfinite(r.loss));
    // Compute ops: in plan order on the stream, each a positive interval after the last.
    std::int64_t last_end = 0;
    int seen = 0;
    for (std::size_t i = 0; i < plan.ranks[0].size(); ++i) {
      if (!ir::is_compute(plan.ranks[0][i].kind)) continue;
      const traces::TraceEvent& e = r.events[i];
      CHECK(e.start_ns >= last_end);
      CHECK(e.dur_ns > 0);
      last_end = e.end_ns();
      ++seen;
    }
    CHECK(seen == compute_ops);
  }
  // begin_step's upload and its end, end_step's loss readout: at most 3 waits that found
  // the stream busy; an op that waited for its kernels would add one per op.
  INFO("host waits on the compute stream per step: " << waits[0] << ", " << waits[1] << ", " << waits[2] << " ("
                                                        << compute_ops << " compute ops a step)");
  for (std::uint64_t w : waits) CHECK(w <= 3);
  cudaEventDestroy(origin);
}
