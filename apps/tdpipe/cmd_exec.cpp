// cmd_exec.cpp — `tdpipe exec SCENARIO --backend cpu`: train the scenario's model
// through a schedule for real, print losses and timing, write the measured trace.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "cuda_commands.hpp"
#include "exec_balance.hpp"
#include "exec_common.hpp"
#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/exec/faults.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/planner/generators.hpp"
#include "tdpipe/traces/chrome_json.hpp"
#include "tdpipe/traces/trace_io.hpp"

namespace tdpipe::apps {
namespace {

struct ExecArgs {
  std::string scenario;
  std::string backend = "cpu";
  std::string schedule;
  int slices = 0;
  int steps = 20;
  double lr = 3e-3;
  std::uint64_t seed = 7;
  std::string corpus;
  double watchdog = 30;
  std::string trace_out;
  std::string trace_format = "chrome";
  bool json = false;
  bool check = false;
  bool pin = false, no_pin = false;    // cpu backend
  std::string runtime = "cooperative";  // cpu backend
  int rank_threads = 0;                 // cpu backend, cooperative (0: automatic)
  std::string rank_speed;              // "r:speed,…"
  std::string wire = "auto";           // what crosses stages: auto | bf16 | fp32
  std::string cuda_graphs = "off";     // cuda backend: on | off
  int balance_every = 0;               // re-balance every K steps (0: never)
  double balance_alpha = 0.3;
  std::string transport = "loopback";  // cuda backend
  int device = -1;                     // cuda backend, loopback
  std::int64_t max_ops = 0;
  std::string inject_overflow;         // "STEP:RANK:SLICE", fp16
  std::vector<std::string> inject;     // fault specs (exec/faults.hpp)
  exec::FaultOptions faults;           // both backends (cuda: kill, hang, slow, ckpt-fail)
  std::string resume;                  // checkpoint folder to resume from
};

// --inject-overflow STEP:RANK:SLICE → the CPU backend's injection (range checks: the run).
exec::cpu::TrainOptions::OverflowInjection parse_injection(const std::string& text) {
  exec::cpu::TrainOptions::OverflowInjection in;
  if (text.empty()) return in;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%d:%d:%d%c", &in.step, &in.rank, &in.slice, &tail) != 3 || in.step < 0 ||
      in.rank < 0 || in.slice < 0)
    throw Error(fmt::format("--inject-overflow: expected STEP:RANK:SLICE (three integers ≥ 0: the step, the world "
                            "rank replica·p + rank, the temporal slice), got \"{}\"", text));
  return in;
}

// The fault-tolerance options, checked against each other and the rest of the command.
exec::FaultOptions fault_options(const ExecArgs& a) {
  exec::FaultOptions f = a.faults;
  const bool any = !a.inject.empty() || !f.checkpoint_dir.empty() || !a.resume.empty();
  if (any && a.balance_every > 0)
    throw Error("--balance-every with --inject, --checkpoint-dir or --resume: a re-balanced run changes its plan "
                "between segments, and a checkpoint names one plan; drop one of them");
  if (!a.resume.empty()) {
    if (!f.checkpoint_dir.empty() && f.checkpoint_dir != a.resume)
      throw Error(fmt::format("--resume {} with --checkpoint-dir {}: a resumed run goes on writing into the folder it "
                              "resumes from; give one of them", a.resume, f.checkpoint_dir));
    if (a.check)
      throw Error("--check with --resume: the reference would train from step 0 and this run from its checkpoint");
    f.checkpoint_dir = a.resume;
    f.resume = true;
  }
  if (f.checkpoint_every > 0 && f.checkpoint_dir.empty())
    throw Error("--checkpoint-every needs --checkpoint-dir DIR (or --resume DIR)");
  if (!a.faults.checkpoint_dir.empty() && f.checkpoint_every == 0)
    throw Error("--checkpoint-dir without --checkpoint-every N would write no checkpoint");
  for (const auto& text : a.inject) f.inject.push_back(exec::parse_fault_spec(text));
  exec::check_fault_options(f);
  return f;
}

void run_exec(const ExecArgs& a) {
  exec::cpu::keep_freed_memory();  // steady step times from the first steps (run.hpp)
  const exec::FaultOptions faults = fault_options(a);
  if (a.check && !a.inject_overflow.empty())
    throw Error("--check with --inject-overflow: the single-device reference takes every step, so a skipped step "
                "would show as a difference; drop one of them");
#ifdef TDPIPE_HAVE_CUDA
  if (a.backend == "cuda") {
    CudaExecRequest c;
    c.scenario = a.scenario;
    c.schedule = a.schedule;
    c.transport = a.transport;
    c.trace_out = a.trace_out;
    c.trace_format = a.trace_format;
    c.corpus = a.corpus;
    c.slices = a.slices;
    c.steps = a.steps;
    c.device = a.device;
    c.lr = a.lr;
    c.watchdog = a.watchdog;
    c.seed = a.seed;
    c.json = a.json;
    c.check = a.check;
    c.max_ops = a.max_ops;
    c.rank_speed = a.rank_speed;
    c.wire = a.wire;
    c.cuda_graphs = a.cuda_graphs == "on";
    c.balance_every = a.balance_every;
    c.balance_alpha = a.balance_alpha;
    c.faults = faults;
    c.inject_overflow = parse_injection(a.inject_overflow);
    run_exec_cuda(c);
    return;
  }
#endif
  check_cpu_backend(a.backend);
  if (a.cuda_graphs == "on")
    throw Error("--cuda-graphs on: CUDA graphs are the cuda backend's (--backend cuda); the cpu backend has none");
  const LoadedPlan loaded = load_plan(a.scenario, a.schedule, a.slices, a.max_ops);
  const ir::Scenario& sc = loaded.scenario;
  ir::Plan plan = loaded.built.lowered;

  exec::cpu::CpuRunOptions opt;
  opt.train = train_options(a.steps, a.lr, a.seed, a.corpus);
  opt.watchdog_seconds = a.watchdog;
  opt.pinning = a.pin ? exec::cpu::CpuRunOptions::Pinning::on
                      : a.no_pin ? exec::cpu::CpuRunOptions::Pinning::off
                                 : exec::cpu::CpuRunOptions::Pinning::automatic;
  opt.runtime = a.runtime == "threaded" ? exec::Runtime::threaded : exec::Runtime::cooperative;
  opt.rank_threads = a.rank_threads;
  opt.train.rank_speed = parse_rank_speed(a.rank_speed, plan.num_ranks());
  opt.train.inject_overflow = parse_injection(a.inject_overflow);
  opt.train.bf16_wire = bf16_wire(a.wire, false, sc);
  opt.faults = faults;
  // Up front, for the whole run: --balance-every hands it to the one segment holding its step.
  if (!faults.resume) exec::cpu::check_injection(opt.train.inject_overflow, plan, 0, a.steps);
  exec::cpu::RunResult r;
  if (a.balance_every <= 0 || a.steps == 0) {
    r = exec::cpu::run_cpu(plan, opt);
  } else {
    r = run_balanced(sc, plan, a.steps, opt.train.rank_speed,
                     {a.balance_every, a.balance_alpha, loaded.schedule, a.slices, a.max_ops},
                     [&](const ir::Plan& segment, int steps, const std::optional<exec::cpu::TrainState>& start,
                         const std::vector<double>& speed) {
                       return exec::cpu::run_cpu(segment, segment_options(opt, steps, start, speed));
                     });
  }
  if (!a.trace_out.empty()) {
    r.trace.metadata["step"] = std::to_string(r.state.steps_done - 1);  // the last step's index
    traces::write_trace(r.trace, a.trace_out, traces::trace_format_from_string(a.trace_format));
  }

  const double iteration = steady_iteration_seconds(r.iteration_seconds);
  const double l2 = exec::cpu::weights_l2(r.weights);
  nlohmann::json j = run_report(sc, plan, a.steps, r, l2, iteration, a.trace_out);
  j["backend"] = "cpu";
  if (a.check)
    add_reference_errors(j, r, exec::cpu::run_reference(sc, plan.data, plan.microbatches, opt.train),
                         /*skip_missing=*/false);
  if (a.json) {
    std::cout << j.dump(2) << "\n";
    return;
  }
  fmt::print("{} on {}: p={} d={} m={} v={} S={}, cpu backend, {} steps\n", plan.schedule, sc.name,
             plan.stages, plan.data, plan.microbatches, plan.chunks, plan.slices, a.steps);
  print_run_report(j, r, l2, iteration, 2, "single-device reference", a.trace_out);
}

}  // namespace

void add_exec_command(CLI::App& app) {
  auto args = std::make_shared<ExecArgs>();
  CLI::App* cmd = app.add_subcommand("exec", "Train the scenario's model through a schedule, for real");
  cmd->add_option("scenario", args->scenario,
                  "Scenario file (YAML or JSON), or a plan file (tdpipe plan --format json -o PLAN.json: run as it is)")->required();
  cmd->add_option("--backend", args->backend, "Executor backend")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--schedule", args->schedule, "Schedule (default: the scenario's)")
      ->check(CLI::IsMember(planner::schedule_names()));
  add_slices_option(cmd, args->slices);
  cmd->add_option("--steps", args->steps, "Optimizer steps")->check(CLI::NonNegativeNumber);
  cmd->add_option("--lr", args->lr, "Adam learning rate");
  cmd->add_option("--seed", args->seed, "Data sampling seed");
  cmd->add_option("--corpus", args->corpus, "Training text (default: data/tiny_corpus.txt)");
  // A floor, so that a mistyped limit cannot fail a healthy run: on a loaded machine an
  // op (or the first step's allocations) can go a good fraction of a second unseen.
  cmd->add_option("--watchdog", args->watchdog, "Seconds without progress before a run is declared hung (≥ 1)")
      ->check(CLI::Validator(
          [](const std::string& text) -> std::string {
            double v = 0;
            try {
              v = std::stod(text);
            } catch (const std::exception&) {
              return "expected a number of seconds, got '" + text + "'";
            }
            if (!(v >= 1 && v <= 1e6))
              return fmt::format("{} s is outside [1, 1e6]: below 1 s the watchdog would fail healthy runs on a "
                                 "loaded machine; expected at least 1 (default 30)",
                                 text);
            return {};
          },
          "SECONDS in [1, 1e6]"));
  cmd->add_option("--trace-out", args->trace_out,
                  "Write the last step's measured trace: a file (chrome) or a folder (kineto)");
  cmd->add_option("--trace-format", args->trace_format,
                  "chrome: one Chrome/Perfetto JSON file; kineto: a folder of rank<N>.json Kineto files, "
                  "one per rank, which HTA (Holistic Trace Analysis) reads")
      ->check(CLI::IsMember({"chrome", "kineto"}))
      ->capture_default_str();
  cmd->add_option("--transport", args->transport,
                  "cuda backend: loopback (every stage on one GPU) or nccl (one process per GPU)")
      ->check(CLI::IsMember({"loopback", "nccl"}));
  cmd->add_option("--device", args->device, "cuda backend, loopback: GPU index");
  cmd->add_flag("--json", args->json, "Print JSON instead of text");
  auto* pin = cmd->add_flag("--pin", args->pin,
                            "Pin rank w's threads to the w-th core the process may use (default: when every rank has one)");
  cmd->add_flag("--no-pin", args->no_pin, "Never pin threads (a machine shared with other busy work)")->excludes(pin);
  cmd->add_option("--runtime", args->runtime,
                  "CPU backend: cooperative (a rank's compute and p2p streams on one thread) or threaded (a "
                  "thread per stream)")
      ->check(CLI::IsMember({"cooperative", "threaded"}));
  cmd->add_option("--rank-threads", args->rank_threads,
                  "CPU backend, cooperative runtime: run the p × d ranks on N threads, each taking turns between a "
                  "contiguous block of ranks (default: a thread per rank, or one per core where the ranks outnumber "
                  "the cores and none needs its own: fp16, injected faults, --rank-speed)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--balance-every", args->balance_every,
                  "Every K steps, re-partition the layers by the measured stage times (tdpipe balance) and "
                  "continue from the same weights and Adam state (cuda backend: loopback transport)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--balance-alpha", args->balance_alpha, "EWMA weight of each newer step for --balance-every")
      ->check(CLI::Range(1e-6, 1.0));
  cmd->add_option("--wire", args->wire,
                  "what crosses stages — bf16: the CUDA backend sends activations and gradients as bf16 (half "
                  "the bytes, as the planner prices them for model.dtype bf16; not with fp16), the CPU backend rounds them "
                  "through bf16 to compare like with like; fp32: fp32 on the GPU, exact on the CPU; auto "
                  "(default): bf16 on cuda when model.dtype is bf16, else fp32")
      ->check(CLI::IsMember({"auto", "bf16", "fp32"}));
  cmd->add_option("--cuda-graphs", args->cuda_graphs,
                  "cuda backend: on — capture each F, B, BW and W into a CUDA graph at its first step and replay it "
                  "after (one launch per op instead of one per kernel; every received tensor keeps its buffer; not "
                  "with parallel.param_offload); off (default) — issue each kernel")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--rank-speed", args->rank_speed,
                  "RANK:SPEED,… with SPEED in [0.01, 1] — stretch each F/B/W of those pipeline ranks to 1/SPEED of "
                  "its time, a slower device (see `tdpipe balance`)");
  cmd->add_option("--inject-overflow", args->inject_overflow,
                  "STEP:RANK:SLICE — model.dtype fp16: world rank RANK stores an inf into a gradient of "
                  "temporal slice SLICE at step STEP, to watch the per-slice loss scaler skip that step everywhere");
  cmd->add_option("--inject", args->inject,
                  "inject a fault (repeatable; cuda backend: kill, hang, slow and ckpt-fail) — kill:rank=R,step=S[,op=OP], hang:rank=R,step=S[,op=OP], "
                  "drop:rank=R,peer=Q,step=S[,message=N][,times=N], corrupt:… (as drop), slow:rank=R,factor=F[,step=S], "
                  "ckpt-fail:step=S[,rank=R]; ranks are world ranks (replica·p + rank); see README \"Faults and "
                  "recovery\"");
  cmd->add_option("--checkpoint-dir", args->faults.checkpoint_dir,
                  "Write checkpoints here (per rank: weights, Adam state, loss scaler; a manifest last)");
  cmd->add_option("--checkpoint-every", args->faults.checkpoint_every, "Steps between checkpoints (0: none)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--checkpoint-keep", args->faults.checkpoint_keep, "Complete checkpoints kept")
      ->check(CLI::Range(1, 1000000));
  cmd->add_option("--resume", args->resume,
                  "Continue the run whose checkpoints are in DIR from its last complete one, to --steps steps in all "
                  "(the same scenario and options as the run that wrote them)");
  cmd->add_option("--max-restarts", args->faults.max_restarts,
                  "Restarts from the last checkpoint after a lost rank or transfer before giving up")
      ->check(CLI::Range(0, 100));
  cmd->add_option("--heartbeat-period", args->faults.heartbeat_period, "Seconds between a rank's heartbeats")
      ->check(CLI::Range(1e-3, 60.0));
  cmd->add_option("--heartbeat-timeout", args->faults.heartbeat_timeout,
                  "Seconds without a heartbeat before a rank is declared lost (≥ 2 periods)")
      ->check(CLI::Range(2e-3, 3600.0));
  cmd->add_option("--retry-timeout", args->faults.retry_timeout,
                  "Seconds without an acknowledgement before a transfer is sent again (doubling per retry; 3 retries)")
      ->check(CLI::Range(1e-4, 60.0));
  cmd->add_flag("--check", args->check, "Also run the single-device reference and report the difference");
  add_max_ops_option(cmd, args->max_ops);
  cmd->callback([args] { run_exec(*args); });
}

}  // namespace tdpipe::apps
