// cmd_exec_cuda.cpp — `tdpipe exec … --backend cuda [--transport nccl|loopback]` and
// `tdpipe calibrate --backend cuda`: same outputs as the CPU backend, from the CUDA
// backend. Compiled to nothing without it.
#include "cuda_commands.hpp"

#if defined(TDPIPE_HAVE_CUDA)

#include <iostream>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "exec_balance.hpp"
#include "exec_common.hpp"
#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/exec/cuda/calibrate.hpp"
#include "tdpipe/exec/cuda/run.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/traces/chrome_json.hpp"
#include "tdpipe/traces/kineto.hpp"
#include "tdpipe/traces/trace_io.hpp"
#include "tdpipe/traces/profile.hpp"

namespace tdpipe::apps {

void run_exec_cuda(const CudaExecRequest& a) {
  const LoadedPlan loaded = load_plan(a.scenario, a.schedule, a.slices, a.max_ops);
  const ir::Scenario& sc = loaded.scenario;
  ir::Plan plan = loaded.built.lowered;

  exec::cuda::CudaRunOptions opt;
  opt.train = train_options(a.steps, a.lr, a.seed, a.corpus);
  opt.train.rank_speed = parse_rank_speed(a.rank_speed, plan.num_ranks());
  opt.transport = exec::cuda::transport_from_string(a.transport);
  opt.watchdog_seconds = a.watchdog;
  opt.device = a.device;
  opt.faults = a.faults;
  opt.train.inject_overflow = a.inject_overflow;
  opt.train.bf16_wire = bf16_wire(a.wire, true, sc);
  opt.train.cuda_graphs = a.cuda_graphs;
  // Up front, for the whole run: --balance-every hands it to the one segment holding its step.
  if (!a.faults.resume) exec::cpu::check_injection(opt.train.inject_overflow, plan, 0, a.steps);
  exec::cuda::CudaRunResult r;
  if (a.balance_every <= 0 || a.steps == 0) {
    r = exec::cuda::run_cuda(plan, opt);  // (which refuses --steps 0)
  } else {
    if (opt.transport != exec::cuda::TransportKind::Loopback)
      throw Error("--balance-every on the cuda backend needs --transport loopback (one process holding every rank's "
                  "weights, which migrate with their layers)");
    // The last segment's CUDA result (device, weights' norm); the loop keeps the rest.
    r.run = run_balanced(sc, plan, a.steps, opt.train.rank_speed,
                         {a.balance_every, a.balance_alpha, loaded.schedule, a.slices, a.max_ops},
                         [&](const ir::Plan& segment, int steps, const std::optional<exec::cpu::TrainState>& start,
                             const std::vector<double>& speed) {
                           exec::cuda::CudaRunResult one =
                               exec::cuda::run_cuda(segment, segment_options(opt, steps, start, speed));
                           r.weights_l2 = one.weights_l2;
                           r.device_name = one.device_name;
                           return std::move(one.run);
                         });
  }
  if (!a.trace_out.empty()) {
    // Without MPI each NCCL process has only its own events: one file per process.
    const bool own_file = !r.root || (r.world_size > 1 && !exec::cuda::built_with_mpi());
    r.run.trace.metadata["step"] = std::to_string(r.run.state.steps_done - 1);  // the last step's index
    const traces::TraceFormat format = traces::trace_format_from_string(a.trace_format);
    if (format == traces::TraceFormat::Kineto) {
      // A folder of per-rank files: the root writes them all from the gathered trace (MPI);
      // without MPI each process writes its own rank's file.
      if (!own_file)
        traces::write_kineto_dir(r.run.trace, a.trace_out);
      else if (!exec::cuda::built_with_mpi())
        traces::write_kineto_dir(r.run.trace, a.trace_out, r.world_rank);
    } else {
      traces::write_trace(r.run.trace, own_file ? fmt::format("{}.rank{}", a.trace_out, r.world_rank) : a.trace_out);
    }
  }
  if (!r.root) return;

  const double iteration = steady_iteration_seconds(r.run.iteration_seconds);
  nlohmann::json j = run_report(sc, plan, a.steps, r.run, r.weights_l2, iteration, a.trace_out);
  j["backend"] = "cuda";
  j["transport"] = a.transport;
  j["device"] = r.device_name;
  j["processes"] = r.world_size;
  if (opt.train.cuda_graphs) j["cuda_graphs"] = {{"captures", r.graph_captures}, {"replays", r.graph_replays}};
  if (a.check) {
    const auto ref = exec::cpu::run_reference(sc, plan.data, plan.microbatches, opt.train);
    add_reference_errors(j, r.run, ref, /*skip_missing=*/true);  // NCCL runs hold only this process's tensors
    j["reference"]["note"] = fmt::format("CPU fp64 single-device reference; the GPU computes GEMMs in {}",
                                         sc.model.dtype == "fp16" ? "fp16 (loss-scaled)" : "bf16");
  }
  if (a.json) {
    std::cout << j.dump(2) << "\n";
    return;
  }
  fmt::print("{} on {}: p={} d={} m={} v={} S={}, cuda backend ({} transport, {}), {} steps\n", plan.schedule,
             sc.name, plan.stages, plan.data, plan.microbatches, plan.chunks, plan.slices, a.transport,
             r.device_name, a.steps);
  if (opt.train.cuda_graphs)
    fmt::print("CUDA graphs: {} op captures, {} replays (this process's ranks)\n", r.graph_captures, r.graph_replays);
  print_run_report(j, r.run, r.weights_l2, iteration, 3, "single-device fp64 reference", a.trace_out);
}

traces::Profile calibrate_cuda_plan(const ir::Plan& plan, const CudaCalibrateRequest& a) {
  exec::cuda::CudaCalibrateOptions opt;
  opt.steps = a.steps;
  opt.warmup_steps = a.warmup;
  opt.train.corpus_path = a.corpus;
  opt.train.bf16_wire = bf16_wire("auto", true, plan.scenario);  // what `tdpipe exec` runs
  opt.device = a.device;
  opt.sharing = a.sharing;
  traces::Profile prof = exec::cuda::calibrate(plan, opt);
  if (prof.scenario.empty()) prof.scenario = plan.scenario.name;
  return prof;
}

void run_calibrate_cuda(const CudaCalibrateRequest& a) {
  const LoadedPlan loaded = load_plan(a.scenario, a.schedule, a.slices, a.max_ops);
  const std::string& schedule = loaded.schedule;
  const planner::BuiltPlan& built = loaded.built;
  traces::Profile prof = calibrate_cuda_plan(built.lowered, a);
  traces::write_profile(prof, a.output);
  fmt::print("{}: {} ops measured on {} ({} schedule, p={} v={} S={}), loopback p2p {:.2f} us + {:.2f} GB/s, "
             "all-reduce {:.2f} us + {:.2f} GB/s, shared capacity {}\n",
             a.output, prof.ops.size(), prof.platform.device, schedule, built.lowered.stages, built.lowered.chunks,
             built.lowered.slices, prof.p2p.latency_seconds * 1e6, prof.p2p.bytes_per_second / 1e9,
             prof.collective.latency_seconds * 1e6, prof.collective.bytes_per_second / 1e9,
             prof.metadata["shared_capacity"]);
}

}  // namespace tdpipe::apps

#endif  // TDPIPE_HAVE_CUDA
