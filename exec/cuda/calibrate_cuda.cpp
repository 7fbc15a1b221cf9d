// calibrate_cuda.cpp — GPU profile for the simulator, loopback transport
// micro-benchmarks, and one decoder block's F/B/W timing.
#include "tdpipe/exec/cuda/calibrate.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "check.hpp"
#include "cuda_compute.hpp"
#include "device_context.hpp"
#include "device_memory.hpp"
#include "gpt_cuda.hpp"
#include "loopback_transport.hpp"
#include "tdpipe/exec/cpu/calibrate.hpp"
#include "tdpipe/exec/cuda/run.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/traces/handoff.hpp"
#include "tdpipe/traces/metrics.hpp"

namespace tdpipe::exec::cuda {

using traces::median;

namespace {

// Runs `mine` here and `theirs` on a second thread (the peer rank). A failure on
// either side fails `control` and aborts `fabric`, so the other side's waits end
// instead of hanging; the first exception is rethrown here (never std::terminate).
template <class Mine, class Theirs>
void run_pair(RunControl& control, LoopbackFabric& fabric, Mine mine, Theirs theirs) {
  std::exception_ptr theirs_error, mine_error;
  auto fail = [&](std::exception_ptr& slot) {
    slot = std::current_exception();
    try {
      std::rethrow_exception(slot);
    } catch (const std::exception& e) {
      control.fail(e.what());
    } catch (...) {
      control.fail("loopback benchmark: peer aborted");
    }
    fabric.abort(control.failure());
  };
  std::thread peer([&] {
    try {
      theirs();
    } catch (...) {
      fail(theirs_error);
    }
  });
  try {
    mine();
  } catch (...) {
    fail(mine_error);
  }
  peer.join();
  // The side that failed first explains the failure; the other one was aborted.
  if (control.failed()) throw Error("loopback transport benchmark: " + control.failure());
  if (mine_error) std::rethrow_exception(mine_error);
  if (theirs_error) std::rethrow_exception(theirs_error);
}

// Median seconds of a SEND/RECV pair of `bytes` between two rank threads over the
// loopback transport (what a pipeline SEND costs in a loopback run).
double loopback_p2p_seconds(int device, std::int64_t bytes, int repeats) {
  RunControl control;
  LoopbackFabric fabric(control);
  DeviceContext a(device), b(device);
  LoopbackTransport ta(fabric, a, 0, 0, 2, 1), tb(fabric, b, 0, 1, 2, 1);
  const std::int64_t elements = std::max<std::int64_t>(1, bytes / 4);
  a.bind();
  Buffer src = device_buffer(elements, a.p2p()), dst = device_buffer(elements, b.p2p());
  TDPIPE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> samples;
  run_pair(
      control, fabric,
      [&] {
        a.bind();
        for (int i = 0; i < repeats; ++i) {
          P2POp op{ir::OpKind::SEND, 1, TensorKey{ir::OpKind::F, 0, i, 0}, src, "SEND"};
          const auto t0 = std::chrono::steady_clock::now();
          ta.post(std::span<P2POp>(&op, 1));
          samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
      },
      [&] {
        b.bind();
        for (int i = 0; i < repeats; ++i) {
          P2POp op{ir::OpKind::RECV, 0, TensorKey{ir::OpKind::F, 0, i, 0}, dst, "RECV"};
          tb.post(std::span<P2POp>(&op, 1));
        }
      });
  return median(samples);
}

double loopback_allreduce_seconds(int device, std::int64_t bytes, int repeats) {
  RunControl control;
  LoopbackFabric fabric(control);
  DeviceContext a(device), b(device);
  LoopbackTransport ta(fabric, a, 0, 0, 1, 2), tb(fabric, b, 1, 0, 1, 2);
  const std::int64_t elements = std::max<std::int64_t>(1, bytes / 4);
  a.bind();
  Buffer x = device_buffer(elements, a.dp()), y = device_buffer(elements, b.dp());
  TDPIPE_CUDA_CHECK(cudaMemsetAsync(x.data.get(), 0, static_cast<std::size_t>(elements) * 4, a.dp()));
  TDPIPE_CUDA_CHECK(cudaMemsetAsync(y.data.get(), 0, static_cast<std::size_t>(elements) * 4, b.dp()));
  TDPIPE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> samples;
  run_pair(
      control, fabric,
      [&] {
        a.bind();
        for (int i = 0; i < repeats; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          ta.all_reduce(x, 0);
          samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
      },
      [&] {
        b.bind();
        for (int i = 0; i < repeats; ++i) tb.all_reduce(y, 0);
      });
  return median(samples);
}

}  // namespace

traces::Profile calibrate(const ir::Plan& plan, const CudaCalibrateOptions& options) {
  if (options.steps < 1) throw Error("calibrate: --steps " + std::to_string(options.steps) + ": expected at least 1");
  if (options.warmup_steps < 0)
    throw Error("calibrate: --warmup " + std::to_string(options.warmup_steps) + ": expected 0 or more");
  CudaRunOptions run;
  run.train = options.train;
  run.train.steps = options.warmup_steps + options.steps;
  run.transport = TransportKind::Loopback;
  run.keep_step_traces = true;
  run.device = options.device;
  const CudaRunResult r = run_cuda(plan, run);
  const std::vector<traces::Trace> measured(r.run.step_traces.begin() + options.warmup_steps,
                                            r.run.step_traces.end());
  traces::Profile prof;
  prof.scenario = plan.scenario.name;
  prof.stages = plan.stages;
  // Every stage runs on this one GPU and they share it. By default its large GEMMs each
  // fill the device (capacity 1); the fit from the run is recorded beside it and used
  // with --shared-capacity fit (small kernels can overlap: capacity above 1). Op times
  // become work alone on the GPU.
  prof.platform.shared_capacity = cpu::apply_sharing_choice(options.sharing, 1.0, plan, measured, prof);
  prof.ops = cpu::profile_ops(plan, measured, prof.platform.shared_capacity);
  const int device = options.device >= 0 ? options.device : 0;
  const std::int64_t small = 8, large = 64 << 20;
  const int reps = std::max(10, options.transport_repeats);
  const double t_small = loopback_p2p_seconds(device, small, reps);
  const double t_large = loopback_p2p_seconds(device, large, std::max(10, reps / 10));
  prof.p2p.latency_seconds = t_small;
  prof.p2p.bytes_per_second = t_large > t_small ? static_cast<double>(large - small) / (t_large - t_small) : 0;
  // Inside the schedule a hand-off also waits for the host threads (the transport's
  // host-observed completion, event waits): fit the latency from the run itself.
  traces::fit_profile_p2p_latency(prof, plan, measured);
  const double a_small = loopback_allreduce_seconds(device, 16, reps);
  const double a_large = loopback_allreduce_seconds(device, large, std::max(10, reps / 10));
  prof.collective.latency_seconds = a_small;
  prof.collective.bytes_per_second =
      a_large > a_small ? static_cast<double>(large - 16) / (a_large - a_small) : 0;
  const int ranks = plan.num_ranks() * std::max(1, plan.data);
  prof.platform.backend = "cuda";
  prof.platform.device = r.device_name;
  prof.platform.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  prof.platform.ranks = ranks;
  prof.platform.threads_per_rank = 1;
  std::ostringstream desc;
  desc << ranks << " pipeline ranks sharing one " << r.device_name
       << " over the loopback transport (each rank its own streams); op times are each op's work alone on "
          "the GPU, deduced from CUDA-event times inside the running schedule by processor sharing of the GPU";
  prof.platform.description = desc.str();
  std::vector<double> iters(r.run.iteration_seconds.begin() + options.warmup_steps, r.run.iteration_seconds.end());
  std::ostringstream it;
  it.precision(9);
  it << median(iters);
  prof.metadata["schedule"] = plan.schedule;
  prof.metadata["chunks"] = std::to_string(plan.chunks);
  prof.metadata["slices"] = std::to_string(plan.slices);
  for (std::size_t j = 0; j < plan.slice_tokens.size(); ++j)
    prof.metadata["slice_tokens"] += (j ? "," : "") + std::to_string(plan.slice_tokens[j]);
  prof.metadata["data"] = std::to_string(plan.data);
  prof.metadata["measured_steps"] = std::to_string(options.steps);
  prof.metadata["median_iteration_seconds"] = it.str();
  std::ostringstream span;
  span.precision(9);
  span << cpu::median_trace_iteration_seconds(measured);
  prof.metadata["median_trace_iteration_seconds"] = span.str();
  prof.metadata["dtype"] = "bf16 GEMMs, fp32 accumulation";
  prof.metadata["transport"] = "loopback";
  return prof;
}

LayerTiming time_layer(const LayerShape& shape, int warmup, int iters, int device) {
  if (warmup < 0 || iters < 1)
    throw Error("time_layer: expected warmup >= 0 and iters >= 1 (got " + std::to_string(warmup) + ", " +
                std::to_string(iters) + ")");
  if (shape.heads < 1 || shape.hidden % shape.heads != 0)
    throw Error("layer shape: hidden " + std::to_string(shape.hidden) + " is not a multiple of heads " +
                std::to_string(shape.heads));
  const GpuInfo gpus = query_gpus();
  if (device < 0 || gpus.count <= device)
    throw Error("time_layer: no CUDA GPU " + std::to_string(device) + " (" +
                (gpus.why_none.empty() ? "not enough devices" : gpus.why_none) + ")");
  DeviceContext ctx(device);
  keep_pool_memory(device);
  cpu::GptConfig c;
  c.layers = 3;  // stage 1 of 3 holds exactly block 1: no embedding, no head
  c.hidden = shape.hidden;
  c.heads = shape.heads;
  c.ffn = shape.ffn;
  c.seq = shape.seq;
  c.vocab = 64;
  c.micro_batch = shape.micro_batch;
  cudaDeviceProp prop{};
  TDPIPE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  GptStageCuda stage(c, 1, 3, ctx.compute(), ctx.cublas());
  const std::int64_t n = std::int64_t(shape.micro_batch) * shape.seq * shape.hidden;
  // Random activations: all-zero data would run the tensor cores at lower power.
  std::vector<float> host(static_cast<std::size_t>(n));
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (auto& v : host) v = dist(rng);
  DeviceMemory x(static_cast<std::size_t>(n) * 4, ctx.compute()), dy(static_cast<std::size_t>(n) * 4, ctx.compute()),
      y(static_cast<std::size_t>(n) * 4, ctx.compute()), dx(static_cast<std::size_t>(n) * 4, ctx.compute());
  TDPIPE_CUDA_CHECK(cudaMemcpyAsync(x.get(), host.data(), host.size() * 4, cudaMemcpyHostToDevice, ctx.compute()));
  for (auto& v : host) v *= 1e-3f;
  TDPIPE_CUDA_CHECK(cudaMemcpyAsync(dy.get(), host.data(), host.size() * 4, cudaMemcpyHostToDevice, ctx.compute()));
  TDPIPE_CUDA_CHECK(cudaStreamSynchronize(ctx.compute()));
  // Owned so that a failing CUDA call below does not leak them.
  struct Events {
    cudaEvent_t e[4] = {};
    ~Events() {
      for (cudaEvent_t x : e)
        if (x) cudaEventDestroy(x);
    }
  } events;
  cudaEvent_t* ev = events.e;
  for (int k = 0; k < 4; ++k) TDPIPE_CUDA_CHECK(cudaEventCreate(&ev[k]));
  std::vector<double> f, b, w;
  for (int i = 0; i < warmup + iters; ++i) {
    stage.begin_step();
    TDPIPE_CUDA_CHECK(cudaEventRecord(ev[0], ctx.compute()));
    stage.forward(0, 0, 0, shape.seq, x.as<float>(), y.as<float>(), nullptr, nullptr, 1.f, nullptr);
    TDPIPE_CUDA_CHECK(cudaEventRecord(ev[1], ctx.compute()));
    stage.backward_input(0, 0, dy.as<float>(), dx.as<float>());
    TDPIPE_CUDA_CHECK(cudaEventRecord(ev[2], ctx.compute()));
    stage.backward_weight(0, 0);
    TDPIPE_CUDA_CHECK(cudaEventRecord(ev[3], ctx.compute()));
    TDPIPE_CUDA_CHECK(cudaEventSynchronize(ev[3]));
    if (i < warmup) continue;
    float ms[3];
    for (int k = 0; k < 3; ++k) TDPIPE_CUDA_CHECK(cudaEventElapsedTime(&ms[k], ev[k], ev[k + 1]));
    f.push_back(ms[0] * 1e-3);
    b.push_back(ms[1] * 1e-3);
    w.push_back(ms[2] * 1e-3);
  }
  LayerTiming t;
  t.f_seconds = median(f);
  t.b_seconds = median(b);
  t.w_seconds = median(w);
  t.samples = iters;
  t.device = prop.name;  // the timed device (gpus.name is device 0's)
  return t;
}

}  // namespace tdpipe::exec::cuda
