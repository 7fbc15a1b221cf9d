// run_cuda.cpp — the GPU launchers: loopback (one process, a thread per rank, all
// stages on one GPU) and NCCL (one process per GPU, launched by mpirun/srun), both
// driving the shared interpreter (run_rank_step) over CudaCompute/CudaClock and the
// matching transport.
#include "tdpipe/exec/cuda/run.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#if defined(TDPIPE_HAVE_MPI)
#include <mpi.h>
#endif

#include "check.hpp"
#include "cuda_compute.hpp"
#include "device_context.hpp"
#include "loopback_transport.hpp"
#include "nccl_transport.hpp"
#include "tdpipe/exec/cuda/launch_env.hpp"
#include "tdpipe/exec/interpreter.hpp"
#include "tdpipe/exec/launch_common.hpp"
#include "tdpipe/exec/recovery.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec::cuda {

TransportKind transport_from_string(std::string_view name) {
  if (name == "loopback") return TransportKind::Loopback;
  if (name == "nccl") return TransportKind::Nccl;
  throw Error("--transport " + std::string(name) + ": expected loopback (every stage on one GPU) or nccl "
              "(one process per GPU under mpirun/srun)");
}
std::string_view to_string(TransportKind kind) { return kind == TransportKind::Nccl ? "nccl" : "loopback"; }

bool built_with_mpi() {
#if defined(TDPIPE_HAVE_MPI)
  return true;
#else
  return false;
#endif
}

GpuInfo query_gpus() {
  GpuInfo info;
  int n = 0;
  cudaError_t status = cudaGetDeviceCount(&n);
  if (status != cudaSuccess) {
    info.why_none = cudaGetErrorString(status);
    cudaGetLastError();
    return info;
  }
  info.count = n;
  if (n == 0) {
    info.why_none = "no CUDA device";
    return info;
  }
  // Properties only: cudaSetDevice(0) + cudaMemGetInfo here would create a context on
  // GPU 0 in every process of a multi-GPU run before it picks its own GPU (hundreds of
  // MiB each on GPU 0). Free memory is checked on the chosen device (set_up_device).
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    info.name = prop.name;
    info.cc_major = prop.major;
    info.cc_minor = prop.minor;
    info.total_bytes = static_cast<std::int64_t>(prop.totalGlobalMem);
  }
  cudaGetLastError();
  return info;
}

namespace {

// Rough bytes one rank needs before any activation: weights, grads, Adam, bf16 copy,
// plus one micro-batch's activations through its blocks (the least it must hold).
std::int64_t minimum_bytes(const cpu::GptConfig& c, const ir::Plan& plan, int rank) {
  std::int64_t params = 0, blocks = 0;
  for (int stage : plan.stage_of.at(static_cast<std::size_t>(rank))) {
    auto [a, b] = cpu::stage_layers(c, stage, plan.virtual_stages());
    blocks += b - a;
    params += cpu::stage_parameter_count(c, stage, plan.virtual_stages());
  }
  const std::int64_t n = std::int64_t(c.micro_batch) * c.seq;
  const std::int64_t per_block = n * (40LL * c.hidden + 6LL * c.ffn) + 2LL * c.micro_batch * c.heads * c.seq * c.seq;
  // 1-bit Adam's fp32 error feedback: the worker's over every parameter, the server's over 1/d.
  const int d = std::max(1, plan.data);
  const std::int64_t onebit = plan.scenario.parallel.onebit() && d > 1 ? params * 4 + params * 4 / d : 0;
  // Parameter offload: the blocks' weights and moments stay in host memory but for the
  // copies in flight (a window of two blocks, OPT's at 12 bytes a parameter); their
  // gradients (4 bytes) stay.
  const std::int64_t block_params = 4LL * c.hidden * c.hidden + 2LL * c.hidden * c.ffn + 6LL * c.hidden + c.ffn;
  const std::int64_t streamed = plan.scenario.parallel.offload() ? blocks * block_params : 0;
  const std::int64_t window = streamed > 0 ? 2 * 12 * block_params : 0;
  return stage_state_bytes(params - streamed) + 4 * streamed + window + onebit + blocks * per_block + (64LL << 20);
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  TDPIPE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

struct DeviceSetup {
  cpu::GptConfig config;
  cpu::Corpus corpus;
};
// Makes `device` current (keeping its pool memory), loads the model config and the
// corpus, and checks that `replicas` copies of `ranks` fit in what the device has free.
DeviceSetup set_up_device(int device, const ir::Plan& plan, const cpu::TrainOptions& train,
                          const std::vector<int>& ranks, int replicas) {
  TDPIPE_CUDA_CHECK(cudaSetDevice(device));
  keep_pool_memory(device);
  DeviceSetup s{cpu::model_config(plan, train), cpu::training_corpus(train)};
  std::int64_t need = 0;
  for (int r : ranks) need += replicas * minimum_bytes(s.config, plan, r);
  size_t free_b = 0, total_b = 0;
  TDPIPE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  check_memory(need, static_cast<std::int64_t>(free_b), static_cast<std::int64_t>(total_b), device);
  return s;
}

void fill_metadata(cpu::RunResult& r, const ir::Plan& plan, const cpu::GptConfig& c, const CudaRunOptions& o,
                   int trace_step, const std::string& device, int world) {
  cpu::add_run_metadata(r.trace, plan, c, r, o.train.steps, trace_step);
  auto& md = r.trace.metadata;
  md["backend"] = "cuda";
  md["transport"] = std::string(to_string(o.transport));
  md["device"] = device;
  int runtime = 0, driver = 0, nccl = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  ncclGetVersion(&nccl);
  md["cuda_runtime"] = std::to_string(runtime);
  md["cuda_driver"] = std::to_string(driver);
  md["nccl"] = std::to_string(nccl);
  md["precision"] = "bf16 GEMMs, fp32 accumulation, fp32 residual stream and master weights";
  md["processes"] = std::to_string(world);
  md["cuda_graphs"] = o.train.cuda_graphs ? "on" : "off";
}

/// After a sharded run: every bucket's gradients and Adam moments all-gathered from
/// their owners (each replica calls it for pipeline rank `rank`, in the same order).
void gather_sharded_state(CudaCompute& compute, Transport& transport, const std::vector<int>& buckets, int rank) {
  for (int ch = 0; ch < compute.chunks(); ++ch) {
    const int n = buckets.at(static_cast<std::size_t>(rank * compute.chunks() + ch));
    for (int which = 0; which < 3; ++which)
      for (int k = 0; k < n; ++k) transport.all_gather(compute.state_bucket(ch, which, k, n), -1);
  }
}

// fp16 training: the scaler's state after the run and the traced step's scaler as trace
// metadata (every rank's scaler agrees; the recovery loop checked).
void add_loss_scale(cpu::RunResult& result, const CudaCompute& compute, int trace_step,
                    const LossScaleState& traced_scale) {
  const LossScaler* scaler = compute.loss_scaler();
  if (!scaler) return;
  result.state.loss_scale = scaler->state();
  if (trace_step >= 0 && static_cast<std::size_t>(trace_step) < result.loss_scale.size())
    cpu::detail::add_loss_scale_metadata(result.trace, result.loss_scale[static_cast<std::size_t>(trace_step)],
                                         traced_scale);
}

double sum_squares(const cpu::ParamMap& m) {
  double s = 0;
  for (const auto& [name, v] : m)
    for (double x : v) s += x * x;
  return s;
}

// The timeline's zero: a timing event, re-recorded at the start of every step.
class OriginEvent {
 public:
  OriginEvent() { TDPIPE_CUDA_CHECK(cudaEventCreate(&event_)); }
  ~OriginEvent() { cudaEventDestroy(event_); }
  OriginEvent(const OriginEvent&) = delete;
  OriginEvent& operator=(const OriginEvent&) = delete;
  cudaEvent_t get() const { return event_; }
  /// Records it on `stream` (idle: after a barrier) and waits for it, so that the
  /// clocks' later events measure from here.
  void record(cudaStream_t stream) {
    TDPIPE_CUDA_CHECK(cudaEventRecord(event_, stream));
    TDPIPE_CUDA_CHECK(cudaEventSynchronize(event_));
  }

 private:
  cudaEvent_t event_ = nullptr;
};

// ---- loopback: every rank a thread, one GPU ---------------------------------------

/// recovery.hpp's World for the loopback transport: every rank a thread on one GPU.
struct LoopbackWorld {
  LoopbackWorld(const cpu::GptConfig& config, const ir::Plan& plan, const cpu::Corpus& corpus,
                const CudaRunOptions& options, int device, OriginEvent& origin)
      : plan(&plan), fabric(control), origin(&origin) {
    const int p = plan.num_ranks(), d = std::max(1, plan.data);
    for (int k = 0; k < d; ++k)
      for (int r = 0; r < p; ++r) {
        contexts.push_back(std::make_unique<DeviceContext>(device));
        computes.push_back(std::make_unique<CudaCompute>(config, plan, r, k, corpus, options.train,
                                                         *contexts.back(), &control));
        transports.push_back(std::make_unique<LoopbackTransport>(fabric, *contexts.back(), k, r, p, d));
      }
    for (auto& c : contexts) clocks.push_back(std::make_unique<CudaClock>(*c, origin.get()));
  }
  ~LoopbackWorld() {
    if (control.failed()) fabric.abort(control.failure());
    cudaDeviceSynchronize();
  }

  // Runs body(w) on one thread per rank, bound to its device context; the first error
  // fails the run (the others stop at their next wait).
  void on_every_rank(const std::string& what, const std::function<void(int)>& body) {
    std::vector<std::thread> threads;
    for (int w = 0; w < static_cast<int>(computes.size()); ++w)
      threads.emplace_back([&, w] {
        try {
          contexts[static_cast<std::size_t>(w)]->bind();
          body(w);
        } catch (const Aborted&) {
        } catch (const std::exception& e) {
          control.fail("rank " + std::to_string(w) + ": " + what + e.what());
        }
      });
    for (auto& t : threads) t.join();
    if (control.failed()) fabric.abort(control.failure());
  }

  std::unique_ptr<Watchdog> watchdog(double seconds) {
    return std::make_unique<Watchdog>(
        control, seconds,
        [this](std::string& report) {
          for (const auto& line : fabric.p2p().pending()) report += "\n  unmatched: " + line;
        },
        [this] { fabric.abort("watchdog fired"); });
  }
  std::int64_t now_ns() { return clocks[0]->now_ns(ir::Stream::Compute); }
  std::int64_t run_step(int step, FaultInjector& injector, Heartbeats* heartbeats, std::vector<RankStepResult>& outs,
                        cpu::RunResult&) {
    TDPIPE_CUDA_CHECK(cudaDeviceSynchronize());
    // One origin for every rank: all share the device, so event times compare directly.
    // It is re-recorded at the start of every step: cudaEventElapsedTime returns float
    // ms, whose 24-bit mantissa would lose µs after ~20 s of a long run.
    origin->record(contexts[0]->compute());  // every rank thread is joined: nobody reads it now
    const std::int64_t start = now_ns();
    const int p = plan->num_ranks();
    on_every_rank("", [&](int w) {
      const auto i = static_cast<std::size_t>(w);
      Backend backend{computes[i].get(), transports[i].get(), clocks[i].get(), &injector, heartbeats};
      outs[i] = run_rank_step(*plan, w % p, w, step, backend, control);
    });
    if (!control.failed()) TDPIPE_CUDA_CHECK(cudaDeviceSynchronize());
    return start;
  }
  void step_done(cpu::RunResult&) {}

  const ir::Plan* plan;
  RunControl control;
  LoopbackFabric fabric;
  OriginEvent* origin;
  std::vector<std::unique_ptr<DeviceContext>> contexts;
  std::vector<std::unique_ptr<CudaCompute>> computes;
  std::vector<std::unique_ptr<LoopbackTransport>> transports;
  std::vector<std::unique_ptr<CudaClock>> clocks;
};

CudaRunResult run_loopback(const ir::Plan& plan, const CudaRunOptions& options) {
  const int p = plan.num_ranks(), d = std::max(1, plan.data);
  const LaunchEnv launch = parse_launch_env(process_env());
  const GpuInfo gpus = query_gpus();
  check_world(p * d, launch, /*loopback=*/true, gpus.count);
  const int device = options.device >= 0 ? options.device : 0;
  if (device >= gpus.count)
    throw Error("--device " + std::to_string(device) + ": this machine has " + std::to_string(gpus.count) + " GPU" +
                (gpus.count == 1 ? "" : "s"));
  std::vector<int> all_ranks(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) all_ranks[static_cast<std::size_t>(r)] = r;
  const DeviceSetup setup = set_up_device(device, plan, options.train, all_ranks, d);
  const cpu::GptConfig& config = setup.config;
  const cpu::Corpus& corpus = setup.corpus;
  const FaultOptions& fo = options.faults;
  const cpu::RecoveryStart rs =
      cpu::prepare_recovery(plan, config, options.train, options.start, fo, options.watchdog_seconds, corpus);
  const int first = rs.first, steps = rs.end - rs.first;
  cpu::check_injection(options.train.inject_overflow, plan, first, steps);
  FaultInjector injector(fo.inject);

  OriginEvent origin;
  // Builds the ranks (the last incarnation's are gone: one GPU holds one set) and loads
  // a checkpoint, else the start.
  auto build = [&](const std::optional<CheckpointManifest>& from) {
    auto w = std::make_unique<LoopbackWorld>(config, plan, corpus, options, device, origin);
    cpu::load_world_state(w->computes, fo.checkpoint_dir, from, options.start);
    return w;
  };
  std::unique_ptr<LoopbackWorld> world = build(rs.resumed);

  CudaRunResult out;
  out.device_name = device_name(device);
  cpu::RunResult& result = out.run;
  const int trace_step = resolve_trace_step(options.trace_step, steps);
  result.trace = run_trace_header("cuda", plan, p * d);
  LossScaleState traced_scale;
  cpu::run_recovering(plan, rs, {fo, options.watchdog_seconds, trace_step, options.keep_step_traces, "cuda"},
                      injector, build, world, result, traced_scale);
  auto& computes = world->computes;
  auto& transports = world->transports;
  RunControl& control = world->control;
  auto on_every_rank = [&](const std::string& what, const std::function<void(int)>& body) {
    world->on_every_rank(what, body);
    if (control.failed()) throw Error(control.failure());
  };

  // A sharded optimizer left each replica with its own segments' reduced gradients and
  // moments: gather them (the plan's own collective), so replica 0 reports the whole state.
  if (const std::vector<int> buckets = sharded_buckets(plan); !buckets.empty())
    on_every_rank("gathering the sharded optimizer state: ", [&](int w) {
      const auto i = static_cast<std::size_t>(w);
      gather_sharded_state(*computes[i], *transports[i], buckets, w % p);
    });

  double ss = 0;
  for (int r = 0; r < p; ++r) {
    auto& c = *computes[static_cast<std::size_t>(r)];
    for (int ch = 0; ch < c.chunks(); ++ch) {
      cpu::ParamMap w = c.chunk_stage(ch).named_params();
      ss += sum_squares(w);
      result.weights.merge(w);
      result.grads.merge(c.chunk_stage(ch).named_grads());
      result.state.m1.merge(c.chunk_stage(ch).named_moments(1));
      result.state.m2.merge(c.chunk_stage(ch).named_moments(2));
    }
  }
  result.state.params = result.weights;
  result.state.steps_done = first + steps;
  add_loss_scale(result, *computes.front(), trace_step, traced_scale);
  for (const auto& c : computes) result.param_state_peak_bytes.push_back(c->param_state_peak_bytes());
  for (int k = 1; k < d; ++k)
    for (int r = 0; r < p; ++r) {
      auto& c0 = *computes[static_cast<std::size_t>(r)];
      auto& ck = *computes[static_cast<std::size_t>(k * p + r)];
      for (int ch = 0; ch < c0.chunks(); ++ch) {
        cpu::ParamMap a = c0.chunk_stage(ch).named_params(), b = ck.chunk_stage(ch).named_params();
        for (const auto& [name, v] : a)
          for (std::size_t i = 0; i < v.size(); ++i)
            result.replica_divergence = std::max(result.replica_divergence, std::abs(v[i] - b[name][i]));
      }
    }
  out.weights_l2 = std::sqrt(ss);
  for (const auto& c : computes)
    if (const OpGraphs* g = c->op_graphs()) {
      out.graph_captures += g->captured();
      out.graph_replays += g->replayed();
    }
  fill_metadata(result, plan, config, options, trace_step, out.device_name, 1);
  result.trace.metadata["restarts"] = std::to_string(result.restarts);
  if (result.checkpoints_written > 0)
    result.trace.metadata["checkpoints_written"] = std::to_string(result.checkpoints_written);
  return out;
}

// ---- NCCL: one process per GPU -------------------------------------------------------

#if defined(TDPIPE_HAVE_MPI)
// MPI_Init once per process; at exit MPI_Finalize if we initialised it — or, after
// a failure of this process, MPI_Abort: MPI_Finalize synchronises with the other
// processes, which may be blocked in a collective this one will never join (they
// would hang instead of being stopped by the launcher).
struct MpiSession {
  bool ours = false;
  bool failed = false;
  MpiSession() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      MPI_Init(nullptr, nullptr);
      ours = true;
    }
  }
  ~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (failed) MPI_Abort(MPI_COMM_WORLD, 1);
    else if (ours) MPI_Finalize();
  }
};
MpiSession& mpi_session() {
  static MpiSession session;
  return session;
}
#endif

ncclUniqueId exchange_id(IdExchange exchange, const LaunchEnv& launch) {
  ncclUniqueId id{};
  switch (exchange) {
    case IdExchange::None:
      TDPIPE_NCCL_CHECK(ncclGetUniqueId(&id));
      break;
    case IdExchange::NcclCommId:
      // With NCCL_COMM_ID set, NCCL derives the id from that address on every rank
      // (and rank 0's ncclCommInitRank opens the bootstrap root there).
      TDPIPE_NCCL_CHECK(ncclGetUniqueId(&id));
      break;
    case IdExchange::Mpi:
#if defined(TDPIPE_HAVE_MPI)
      if (launch.rank == 0) TDPIPE_NCCL_CHECK(ncclGetUniqueId(&id));
      if (MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        throw Error("MPI_Bcast of the NCCL unique id failed on rank " + std::to_string(launch.rank));
#else
      (void)launch;
      throw Error("internal: MPI id exchange chosen in a build without MPI");
#endif
      break;
  }
  return id;
}

// Waits for NCCL work on `stream` by polling, never blocking in the driver: a peer
// that died leaves its partners' NCCL kernels spinning forever, so this checks the
// communicator's asynchronous error and gives up after `timeout_s` with a message.
void wait_nccl(cudaStream_t stream, ncclComm_t comm, double timeout_s, const std::string& what, bool restartable) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (int i = 0;; ++i) {
    const cudaError_t status = cudaStreamQuery(stream);
    if (status != cudaSuccess && status != cudaErrorNotReady) TDPIPE_CUDA_CHECK(status);
    // Checked even once the stream is idle: an operation on an aborted communicator may
    // end without having moved its data.
    ncclResult_t async = ncclSuccess;
    TDPIPE_NCCL_CHECK(ncclCommGetAsyncError(comm, &async));
    if (async == ncclRemoteError && restartable)  // a peer left: recoverable by a restart of every process
      throw RankFault("NCCL error during " + what + ": " + ncclGetErrorString(async) +
                      " (a peer process failed or left)");
    if (async != ncclSuccess && async != ncclInProgress)
      throw Error("NCCL asynchronous error during " + what + ": " + ncclGetErrorString(async) +
                  " (a peer process failed? set NCCL_DEBUG=INFO)");
    if (status == cudaSuccess) return;
    if (std::chrono::steady_clock::now() > deadline)
      throw Error("waited " + std::to_string(static_cast<int>(timeout_s)) + " s for " + what +
                  ": another process is gone or stuck (see its output), or raise --watchdog");
    if (i > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    else std::this_thread::yield();
  }
}

// Every event of this process as text lines, for gathering on the root.
std::string serialize(const std::vector<traces::TraceEvent>& events) {
  std::ostringstream s;
  for (const auto& e : events)
    s << e.rank << ' ' << e.stream << ' ' << (e.kind ? static_cast<int>(*e.kind) : -1) << ' ' << e.mb << ' '
      << e.chunk << ' ' << e.slice << ' ' << e.peer << ' ' << e.bytes << ' ' << e.start_ns << ' ' << e.dur_ns << ' '
      << e.name << '\n';
  return s.str();
}
std::vector<traces::TraceEvent> deserialize(const std::string& text) {
  std::vector<traces::TraceEvent> out;
  std::istringstream s(text);
  traces::TraceEvent e;
  int kind = -1;
  while (s >> e.rank >> e.stream >> kind >> e.mb >> e.chunk >> e.slice >> e.peer >> e.bytes >> e.start_ns >>
         e.dur_ns >> e.name) {
    e.kind = kind < 0 ? std::nullopt : std::optional<ir::OpKind>(static_cast<ir::OpKind>(kind));
    out.push_back(e);
  }
  return out;
}

/// The restart handshake's answer: another process failed for good.
struct EndedElsewhere : Error {
  using Error::Error;
};

/// recovery.hpp's World for the NCCL transport: this process's rank, its communicators
/// and transport. A restart destroys it — ncclCommAbort on every communicator, which
/// ends this process's NCCL kernels and makes its peers' NCCL calls fail with a remote
/// error, so they stop and restart too — and builds it again: new communicators
/// (ncclCommInitRank with a fresh id: MPI broadcasts one, NCCL_COMM_ID derives it from
/// the address again), the rank's state from the checkpoint every process agrees on.
struct NcclWorld {
  NcclWorld(const ir::Plan& plan, const CudaRunOptions& options, const LaunchEnv& launch, IdExchange exchange,
            int device, const DeviceSetup& setup, bool ending = false)
      : plan(&plan),
        ctx(device),
        world_rank(launch.rank),
        world_size(launch.world),
        watchdog_seconds(options.watchdog_seconds),
        restartable(!options.faults.inject.empty() || !options.faults.checkpoint_dir.empty()) {
    const int p = plan.num_ranks(), d = std::max(1, plan.data);
    const int replica = world_rank / p, rank = world_rank % p;
    scratch = DeviceMemory(2 * sizeof(double), ctx.compute(), true);
    const ncclUniqueId id = exchange_id(exchange, launch);
    const double limit_s = std::max(options.watchdog_seconds, 300.0);
    {
      TimeLimit limit(limit_s, [this, limit_s] { setup_timed_out(limit_s); });
      TDPIPE_NCCL_CHECK(ncclCommInitRank(&comms.world, launch.world, id, world_rank));
    }
    // A run that restarts: first, whether a process failed for good and only came to say
    // so (`ending`) — the others stop too, with a message instead of a hang.
    if (restartable) {
      double fatal = 0;
      try {
        fatal = world_reduce(ending ? 1 : 0, ncclMax, "the restart handshake");
      } catch (const RankFault&) {
        // The ending process leaves as soon as it has contributed: its communicator may be
        // gone before this one saw the result. A peer lost here ended the run too.
        if (ending) return;
        fatal = 1;
      }
      if (ending) return;
      if (fatal > 0)
        throw EndedElsewhere("rank " + std::to_string(world_rank) +
                             ": another process ended the run with an error (see its output)");
    }
    {
      TimeLimit limit(limit_s, [this, limit_s] { setup_timed_out(limit_s); });
      // dp: the replicas of this pipeline rank (collective over the world: every rank calls it).
      if (d > 1) TDPIPE_NCCL_CHECK(ncclCommSplit(comms.world, /*color=*/rank, /*key=*/replica, &comms.dp, nullptr));
      // fp16: the overflow agreement before OPT, on a communicator of its own (the compute
      // thread's; the p2p and dp threads may still be busy on theirs).
      if (plan.scenario.model.dtype == "fp16" && launch.world > 1)
        TDPIPE_NCCL_CHECK(ncclCommSplit(comms.world, /*color=*/0, /*key=*/world_rank, &comms.ctl, nullptr));
    }
    computes.push_back(std::make_unique<CudaCompute>(setup.config, plan, rank, replica, setup.corpus, options.train,
                                                     ctx, &control));
    CudaCompute& compute = *computes.front();
    transport = std::make_unique<NcclTransport>(comms.world, comms.dp, ctx, replica, rank, p, &control, restartable,
                                                comms.ctl);
    std::set<int> peers;
    for (const ir::Op& op : plan.ranks[static_cast<std::size_t>(rank)])
      if (ir::is_p2p(op.kind)) peers.insert(op.peer);
    // This rank's all-reduce buckets, as the interpreter will cut them (Compute::grad_bucket).
    std::vector<Buffer> buckets;
    bool sharded = false, compressed = false;
    if (d > 1) {
      std::map<int, int> per_chunk;
      for (const ir::Op& op : plan.ranks[static_cast<std::size_t>(rank)])
        if (ir::is_gradient_reduction(op.kind)) {
          ++per_chunk[op.chunk];
          sharded = sharded || op.kind == ir::OpKind::REDUCE_SCATTER;
          compressed = compressed || op.kind == ir::OpKind::COMPRESSED_ALLREDUCE;
        }
      for (const auto& [chunk, count] : per_chunk)
        for (int i = 0; i < count; ++i) buckets.push_back(compute.grad_bucket(chunk, i, count));
    }
    transport->warm_up(peers, buckets, sharded, compressed);
    clock = std::make_unique<CudaClock>(ctx, origin.get());
    world_sum(0, "the start barrier (every process up)");
    origin.record(ctx.compute());  // (re-recorded at every step; now_ns needs one from the start)
  }

  // Communicator setup waits for every process of the world and cannot be interrupted:
  // a process that died before joining (a bad scenario path, no GPU, a crash before a
  // restart) would leave the others there forever, so past a limit — the watchdog's but
  // at least 5 minutes: on a cluster the processes may start minutes apart (scheduler,
  // containers), and a healthy run must not be killed for that — this process ends itself.
  [[noreturn]] void setup_timed_out(double limit_s) const {
    std::fprintf(stderr,
                 "tdpipe: rank %d waited %.0f s for the other processes in NCCL's communicator setup: one is gone "
                 "or never started (see its output; NCCL_DEBUG=INFO says more), or raise --watchdog%s\n",
                 world_rank, limit_s,
                 restartable ? "; relaunch every process (with --resume DIR if a checkpoint was written)" : "");
    std::fflush(stderr);
    std::_Exit(1);
  }

  // Declared after the streams and buffers, so destroyed before them: on any failure
  // the communicators are aborted (not destroyed — ncclCommDestroy would wait for NCCL
  // work a failed peer never completes) and that ends this process's spinning NCCL
  // kernels, which the stream synchronisations in ~CudaCompute and ~DeviceContext
  // would otherwise wait for forever.
  struct Comms {
    ncclComm_t world = nullptr, dp = nullptr, ctl = nullptr;
    bool clean = false;
    void abort() {
      for (ncclComm_t* c : {&ctl, &dp, &world})
        if (*c) ncclCommAbort(std::exchange(*c, nullptr));
    }
    ~Comms() {
      if (clean)
        for (ncclComm_t c : {ctl, dp, world})
          if (c) ncclCommDestroy(c);
      if (!clean) abort();
    }
  };

  /// A world-wide element-wise reduction (and barrier) of `values`, on the compute
  /// stream from this (main) thread — never concurrent with the p2p thread's use of
  /// the same communicator. Throws RankFault when a peer left.
  std::vector<double> world_reduce_all(std::vector<double> values, ncclRedOp_t op, const char* what) {
    if (values.empty()) return values;
    ctx.bind();
    const std::size_t bytes = values.size() * sizeof(double);
    DeviceMemory large;  // (one or two doubles go through the scratch buffer)
    if (bytes > scratch.bytes()) large = DeviceMemory(bytes, ctx.compute());
    void* buf = large.empty() ? scratch.get() : large.get();
    TDPIPE_CUDA_CHECK(cudaMemcpyAsync(buf, values.data(), bytes, cudaMemcpyHostToDevice, ctx.compute()));
    TDPIPE_NCCL_CHECK(ncclAllReduce(buf, buf, values.size(), ncclFloat64, op, comms.world, ctx.compute()));
    wait_nccl(ctx.compute(), comms.world, watchdog_seconds, what, restartable);
    TDPIPE_CUDA_CHECK(cudaMemcpyAsync(values.data(), buf, bytes, cudaMemcpyDeviceToHost, ctx.compute()));
    TDPIPE_CUDA_CHECK(cudaStreamSynchronize(ctx.compute()));
    return values;
  }
  double world_reduce(double v, ncclRedOp_t op, const char* what) { return world_reduce_all({v}, op, what).front(); }
  double world_sum(double v, const char* what) { return world_reduce(v, ncclSum, what); }

  /// A fault of this process or a lost peer: record it (recoverable) and abort the
  /// communicators, so that every peer learns of it and stops too.
  void lost(const std::string& why) {
    control.fail(why.rfind("rank ", 0) == 0 ? why : "rank " + std::to_string(world_rank) + ": " + why, true);
    comms.abort();
  }

  std::unique_ptr<Watchdog> watchdog(double seconds) { return std::make_unique<Watchdog>(control, seconds); }
  std::int64_t now_ns() { return clock->now_ns(ir::Stream::Compute); }
  std::int64_t run_step(int step, FaultInjector& injector, Heartbeats*, std::vector<RankStepResult>& outs,
                        cpu::RunResult&) {
    if (control.failed()) return now_ns();
    try {
      world_sum(0, "the step barrier");  // steps start together
    } catch (const RankFault& e) {
      lost(e.what());
      return now_ns();
    }
    // Per-step origin right after the barrier: times stay small (float ms keeps µs) and
    // the processes' zeros are as close as the barrier makes them.
    origin.record(ctx.compute());
    const std::int64_t start = now_ns();
    Backend backend{computes.front().get(), transport.get(), clock.get(), &injector, nullptr};
    try {
      outs.front() = run_rank_step(*plan, world_rank % plan->num_ranks(), world_rank, step, backend, control);
    } catch (const Aborted&) {
    }
    if (control.failed()) {
      if (control.recoverable()) {
        // This process's own injected fault, unless the transport saw a peer leave.
        own_fault = control.failure().find("NCCL") == std::string::npos;
        comms.abort();  // (peers learn of it from the aborted communicators)
      }
      return start;
    }
    try {
      outs.front().loss = world_sum(outs.front().loss, "the loss sum");  // the step's loss, every rank's
    } catch (const RankFault& e) {
      lost(e.what());
    }
    return start;
  }
  void step_done(cpu::RunResult&) {}
  int lost_rank() const { return own_fault ? world_rank : -1; }

  /// This process's part of a checkpoint. One barrier gathers every part's size and
  /// CRC-32 (−1: its write failed); the root then writes the manifest, and a second
  /// barrier tells every process whether the checkpoint is complete. A failed part
  /// anywhere: no manifest, training goes on.
  void write_checkpoint(const std::string& dir, CheckpointManifest manifest, const std::vector<RankCheckpoint>& states,
                        int fail_rank, int step, cpu::RunResult& result) {
    std::string why;
    CheckpointManifest::File part;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      part = write_checkpoint_part(dir, manifest.steps_done, states.front(), fail_rank == world_rank);
    } catch (const Error& e) {
      why = e.what();
    }
    try {
      std::vector<double> parts(static_cast<std::size_t>(2 * world_size), 0.0);  // bytes, CRC per world rank
      parts[static_cast<std::size_t>(2 * world_rank)] = why.empty() ? static_cast<double>(part.bytes) : -1;
      parts[static_cast<std::size_t>(2 * world_rank + 1)] = part.crc;
      parts = world_reduce_all(std::move(parts), ncclSum, "the checkpoint barrier");
      int failed_rank = -1;
      std::int64_t total = 0;
      for (int r = 0; r < world_size; ++r) {
        const double b = parts[static_cast<std::size_t>(2 * r)];
        if (b < 0 && failed_rank < 0) failed_rank = r;
        manifest.files.push_back({fmt::format("rank-{:04d}.ckpt", r), static_cast<std::int64_t>(b),
                                  static_cast<std::uint32_t>(parts[static_cast<std::size_t>(2 * r + 1)])});
        total += static_cast<std::int64_t>(b);
      }
      std::string root_why;
      if (failed_rank < 0 && world_rank == 0) {
        try {
          finish_checkpoint(dir, manifest);
        } catch (const Error& e) {
          root_why = e.what();
        }
      }
      // Everyone knows whether the manifest exists before going on.
      const double finished =
          world_sum(world_rank == 0 && failed_rank < 0 && root_why.empty() ? 1 : 0, "the manifest barrier");
      if (finished == 1) {
        ++result.checkpoints_written;
        result.checkpoint_bytes += total;  // every process's part
        result.checkpoint_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (world_rank == 0) {
          try {
            prune_checkpoints(dir, faults_keep);
          } catch (const Error& e) {  // the new checkpoint is complete all the same
            result.faults.push_back({"ckpt-prune", step, 0, e.what()});
          }
        }
      } else {
        result.faults.push_back(
            {"ckpt-fail", step, failed_rank >= 0 ? failed_rank : 0,
             !why.empty()         ? why
             : failed_rank >= 0   ? fmt::format("the checkpoint after {} steps is not complete: world rank {}'s part "
                                                "failed", manifest.steps_done, failed_rank)
             : !root_why.empty()  ? root_why
                                  : fmt::format("the checkpoint after {} steps is not complete: world rank 0 could "
                                                "not write its manifest", manifest.steps_done)});
      }
    } catch (const RankFault& e) {
      lost(e.what());
    }
  }

  const ir::Plan* plan;
  RunControl control;
  DeviceContext ctx;
  std::vector<std::unique_ptr<CudaCompute>> computes;  ///< this process's one rank
  Comms comms;
  std::unique_ptr<NcclTransport> transport;
  DeviceMemory scratch;
  OriginEvent origin;
  std::unique_ptr<CudaClock> clock;
  int world_rank, world_size;
  double watchdog_seconds;
  /// The run has checkpoints or injected faults: a lost peer restarts every process
  /// (else it ends the run, as before restarts existed).
  bool restartable;
  bool own_fault = false;  ///< the step failed on this process's own injected fault
  int faults_keep = 2;
};

CudaRunResult run_nccl_process(const ir::Plan& plan, const CudaRunOptions& options, const LaunchEnv& launch,
                               IdExchange exchange) {
  const int p = plan.num_ranks(), d = std::max(1, plan.data);
  const GpuInfo gpus = query_gpus();
  check_world(p * d, launch, /*loopback=*/false, gpus.count);
  const int device = select_device(launch, gpus.count);
  const int world_rank = launch.rank, replica = world_rank / p, rank = world_rank % p;
  const DeviceSetup setup = set_up_device(device, plan, options.train, {rank}, 1);
  const cpu::GptConfig& config = setup.config;
  const FaultOptions& fo = options.faults;
  cpu::RecoveryStart rs =
      cpu::prepare_recovery(plan, config, options.train, std::nullopt, fo, options.watchdog_seconds, setup.corpus);
  const int steps = rs.end - rs.first;  // (before the processes agree where to resume)
  cpu::check_injection(options.train.inject_overflow, plan, rs.first, steps);
  FaultInjector injector(fo.inject);

  // Builds this process's part of the world and loads the checkpoint every process
  // agrees on: the oldest of their newest complete ones (a failure while the root wrote
  // a manifest may leave the processes seeing different newest ones).
  auto build = [&](std::optional<CheckpointManifest>& from) {
    auto w = std::make_unique<NcclWorld>(plan, options, launch, exchange, device, setup);
    w->faults_keep = fo.checkpoint_keep;
    const double mine = from ? from->steps_done : -1;
    const double agreed = w->world_reduce(mine, ncclMin, "the restart agreement");
    if (agreed != mine) {
      if (agreed < 0) from.reset();
      else if (rs.resumed && static_cast<int>(agreed) == rs.resumed->steps_done) from = rs.resumed;
      else from = checkpoint_at(fo.checkpoint_dir, static_cast<int>(agreed), rs.fingerprint);
      if (agreed >= 0 && !from)
        throw Error(fmt::format("restart: rank {} cannot read the checkpoint after {} steps the others agreed on",
                                world_rank, static_cast<int>(agreed)));
    }
    cpu::load_world_state(w->computes, fo.checkpoint_dir, from, std::nullopt);
    return w;
  };
  CudaRunResult out;
  out.world_rank = world_rank;
  out.world_size = launch.world;
  out.root = world_rank == 0;
  out.device_name = device_name(device);
  cpu::RunResult& result = out.run;
  const int trace_step = resolve_trace_step(options.trace_step, steps);
  result.trace = run_trace_header("cuda", plan, p * d);
  LossScaleState traced_scale;
  cpu::RecoveryOptions ro{fo, options.watchdog_seconds, trace_step, false, "cuda"};
  ro.heartbeats = false;
  ro.trace_ranks = p * d;
  ro.rebase_step_events = false;  // the processes' events are aligned once gathered
  const bool restartable = !fo.inject.empty() || !fo.checkpoint_dir.empty();
  std::unique_ptr<NcclWorld> world;
  try {
    std::optional<CheckpointManifest> start = rs.resumed;
    world = build(start);
    if ((start ? start->steps_done : -1) != (rs.resumed ? rs.resumed->steps_done : -1)) {
      // The processes saw different newest checkpoints (a shared folder out of sync): all
      // go on from the one they agreed on, numbering steps from it.
      rs.resumed = start;
      rs.first = start->steps_done;
      ro.trace_step = resolve_trace_step(options.trace_step, rs.end - rs.first);
    }
    cpu::run_recovering(plan, rs, ro, injector, build, world, result, traced_scale);
  } catch (const EndedElsewhere&) {
    throw;
  } catch (const std::exception& e) {
    if (!restartable) throw;
    // The others may be restarting: join their new world once to say this process ends
    // the run (the handshake right after ncclCommInitRank), and stop.
    world.reset();
    try {
      NcclWorld last(plan, options, launch, exchange, device, setup, /*ending=*/true);
    } catch (...) {
    }
    const std::string why = e.what();
    throw Error(why.rfind("rank ", 0) == 0 ? why : "rank " + std::to_string(world_rank) + ": " + why);
  }
  CudaCompute& compute = *world->computes.front();
  // Each process's injector fires only its own rank's faults: a fault never fired when
  // no process fired it.
  {
    std::vector<double> fired;
    for (const FaultSpec& f : fo.inject)
      fired.push_back(std::find(result.unfired_faults.begin(), result.unfired_faults.end(), f.text) ==
                      result.unfired_faults.end());
    fired = world->world_reduce_all(std::move(fired), ncclMax, "the fired-faults agreement");
    std::vector<std::string> unfired;
    for (std::size_t i = 0; i < fired.size(); ++i)
      if (fired[i] == 0) unfired.push_back(fo.inject[i].text);
    result.unfired_faults = std::move(unfired);
  }

  if (const std::vector<int> buckets = sharded_buckets(plan); !buckets.empty())
    gather_sharded_state(compute, *world->transport, buckets, rank);  // as the loopback run does

  double ss = 0;
  for (int ch = 0; ch < compute.chunks(); ++ch) {
    cpu::ParamMap w = compute.chunk_stage(ch).named_params();
    if (replica == 0) {
      ss += sum_squares(w);
      result.weights.merge(w);
      result.grads.merge(compute.chunk_stage(ch).named_grads());
      result.state.m1.merge(compute.chunk_stage(ch).named_moments(1));
      result.state.m2.merge(compute.chunk_stage(ch).named_moments(2));
    }
  }
  result.state.params = result.weights;
  result.state.steps_done = rs.end;
  add_loss_scale(result, compute, ro.trace_step, traced_scale);
  {
    // Every process's device peak, by world rank (as the loopback run reports them).
    std::vector<double> peaks(static_cast<std::size_t>(launch.world), 0.0);
    peaks[static_cast<std::size_t>(world_rank)] = static_cast<double>(compute.param_state_peak_bytes());
    peaks = world->world_reduce_all(std::move(peaks), ncclSum, "the device peaks' gather");
    for (double b : peaks) result.param_state_peak_bytes.push_back(static_cast<std::int64_t>(b));
  }
  out.weights_l2 = std::sqrt(world->world_sum(ss, "the weight norm sum"));
  if (const OpGraphs* g = compute.op_graphs()) {
    out.graph_captures = g->captured();
    out.graph_replays = g->replayed();
  }

  // Times are relative to each process's own origin (recorded after the step's barrier).
  std::vector<traces::TraceEvent> mine = std::move(result.trace.events);
#if defined(TDPIPE_HAVE_MPI)
  if (launch.world > 1 && exchange == IdExchange::Mpi) {
    std::string text = serialize(mine);
    int len = static_cast<int>(text.size());
    std::vector<int> lens(static_cast<std::size_t>(launch.world)), displs(lens.size());
    MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
    std::string all;
    if (out.root) {
      int total = 0;
      for (std::size_t i = 0; i < lens.size(); ++i) {
        displs[i] = total;
        total += lens[i];
      }
      all.resize(static_cast<std::size_t>(total));
    }
    MPI_Gatherv(text.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
    if (out.root) mine = deserialize(all);
  }
#endif
  rebase_to_zero(mine);
  result.trace.events = std::move(mine);
  fill_metadata(result, plan, config, options, ro.trace_step, out.device_name, launch.world);
  result.trace.metadata["world_rank"] = std::to_string(world_rank);
  result.trace.metadata["restarts"] = std::to_string(result.restarts);
  if (result.checkpoints_written > 0)
    result.trace.metadata["checkpoints_written"] = std::to_string(result.checkpoints_written);
  TDPIPE_CUDA_CHECK(cudaStreamSynchronize(world->ctx.compute()));
  world->comms.clean = true;
  return out;
}

CudaRunResult run_nccl(const ir::Plan& plan, const CudaRunOptions& options, const LaunchEnv& launch) {
  const IdExchange exchange = choose_id_exchange(launch, process_env(), built_with_mpi());
#if defined(TDPIPE_HAVE_MPI)
  // MPI first, before anything that can fail on one process only (memory check,
  // NCCL init): a failure then ends in MPI_Abort, which stops every process.
  if (exchange == IdExchange::Mpi) mpi_session();
  try {
    return run_nccl_process(plan, options, launch, exchange);
  } catch (...) {
    if (exchange == IdExchange::Mpi) mpi_session().failed = true;
    throw;
  }
#else
  return run_nccl_process(plan, options, launch, exchange);
#endif
}

// What run_cuda and run_cuda_rank refuse before touching a GPU.
void check_request(const ir::Plan& plan, const CudaRunOptions& options, TransportKind transport) {
  check_runnable(plan);
  if (options.train.steps < 1) throw Error("--steps: expected at least 1");
  const FaultOptions& fo = options.faults;
  for (const FaultSpec& f : fo.inject)
    if (f.kind == FaultSpec::Kind::Drop || f.kind == FaultSpec::Kind::Corrupt)
      throw Error("--inject \"" + f.text + "\": lost and corrupt messages are the CPU backend's faults (its fabric "
                  "checksums and acknowledges every message); on GPUs NCCL's transports retransmit below it");
  if (options.start && transport != TransportKind::Loopback)
    throw Error("a start state (re-balancing, --balance-every) needs the loopback transport: an NCCL process "
                "holds only its own ranks' weights");
}

}  // namespace

CudaRunResult run_cuda(const ir::Plan& plan, const CudaRunOptions& options) {
  check_request(plan, options, options.transport);
  return options.transport == TransportKind::Loopback ? run_loopback(plan, options)
                                                      : run_nccl(plan, options, parse_launch_env(process_env()));
}

CudaRunResult run_cuda_rank(const ir::Plan& plan, const CudaRunOptions& options, const LaunchEnv& launch) {
  check_request(plan, options, TransportKind::Nccl);
  CudaRunOptions nccl = options;
  nccl.transport = TransportKind::Nccl;
  return run_nccl(plan, nccl, launch);
}

}  // namespace tdpipe::exec::cuda
