// bench_exec.cpp — the CPU executor's own cost: (1) runtime overhead per op with a
// compute that does nothing (interpreter waits + rendezvous transport), (2) measured
// iteration time of the tiny scenario against the time its schedule implies for the
// measured op durations (ir::replay: sum of op times + the schedule's inherent bubble);
// with a thread per stream (Runtime::threaded), the cooperative runtime, and the
// cooperative runtime with a core per rank. `--explain SCHEDULE …` prints one step op by
// op beside its replay: where the measured step falls behind the schedule.
#include "bench_help.hpp"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "tdpipe/exec/cpu/backend.hpp"
#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/exec/interpreter.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "tdpipe/ir/replay.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/traces/metrics.hpp"

using namespace tdpipe;

using traces::median;

namespace {

// Produces and consumes 1-element tensors and does no math: what remains of an
// iteration is the interpreter's and the transport's cost.
class NullCompute final : public exec::Compute {
 public:
  explicit NullCompute(int virtual_stages) : last_(virtual_stages - 1) {}
  void begin_step(int) override {}
  exec::Buffer run(const exec::ComputeOp& op, exec::Buffer) override {
    const bool out = (op.kind == ir::OpKind::F && op.stage < last_) ||
                     ((op.kind == ir::OpKind::B || op.kind == ir::OpKind::BW) && op.stage > 0);
    return out ? exec::cpu::host_buffer(1) : exec::Buffer{};
  }
  exec::Buffer allocate(const exec::TensorKey&) override { return exec::cpu::host_buffer(1); }
  exec::Buffer grad_bucket(int, int, int) override { return exec::cpu::host_buffer(1); }
  exec::Buffer param_bucket(int, int, int) override { return exec::cpu::host_buffer(1); }
  double end_step() override { return 0; }

 private:
  int last_;
};

// The median iteration of `plan` with the null compute over 30 steps, in seconds, its
// ranks on `threads` threads (exec::run_rank_steps; = ranks: a thread per rank), thread g
// pinned to the g-th core if `pin`.
double null_iteration(const ir::Plan& plan, exec::Runtime runtime, int threads, bool pin = false) {
  const int p = plan.num_ranks();
  exec::RunControl control;
  exec::cpu::CpuFabric fabric(control);
  exec::cpu::CpuClock clock(std::chrono::steady_clock::now());
  std::vector<std::unique_ptr<NullCompute>> computes;
  std::vector<std::unique_ptr<exec::cpu::CpuTransport>> transports;
  for (int r = 0; r < p; ++r) {
    computes.push_back(std::make_unique<NullCompute>(plan.virtual_stages()));
    transports.push_back(std::make_unique<exec::cpu::CpuTransport>(fabric, 0, r, p, 1));
  }
  const auto groups = exec::cpu::rank_groups(p, threads);
  const std::vector<int> cores = pin ? exec::cpu::allowed_cores() : std::vector<int>{};
  std::vector<double> iters;
  for (int step = 0; step < 30; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int g = 0; g < static_cast<int>(groups.size()); ++g)
      pool.emplace_back([&, g] {
        exec::cpu::pin_to_core(g, cores);
        const auto& group = groups[static_cast<std::size_t>(g)];
        std::vector<exec::RankSlot> slots;
        for (int r : group)
          slots.push_back(
              {r, r, exec::Backend{computes[r].get(), transports[r].get(), &clock, nullptr, nullptr, runtime}});
        exec::run_rank_steps(plan, slots, step, control);
      });
    for (auto& t : pool) t.join();
    iters.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(iters);
}

void bench_overhead(const ir::Scenario& base, const std::string& schedule, int p, int m) {
  ir::Scenario sc = base;
  sc.parallel.pipeline = p;
  sc.parallel.global_batch = m * sc.parallel.micro_batch;
  sc.model.layers = 8;
  const auto built = planner::build_plan(sc, schedule, 0);
  const ir::Plan& plan = built.lowered;
  std::size_t ops = 0;
  for (const auto& r : plan.ranks) ops = std::max(ops, r.size());
  const int cores = std::max(1, static_cast<int>(exec::cpu::allowed_cores().size()));
  const int shared_threads = std::min(p, cores);
  const double threaded = null_iteration(plan, exec::Runtime::threaded, p);
  const double coop = null_iteration(plan, exec::Runtime::cooperative, p);
  const double shared = null_iteration(plan, exec::Runtime::cooperative, shared_threads, true);
  const double n = static_cast<double>(ops);
  fmt::print("  {:<12} p={} m={:<3} ops/rank {:>4}  per op: thread per stream {:6.2f} us  thread per rank {:6.2f} us  "
             "{} pinned rank threads {:6.2f} us\n",
             schedule, p, m, ops, threaded / n * 1e6, coop / n * 1e6, shared_threads, shared / n * 1e6);
}

struct IterationFigures {
  double measured = 0, implied = 0, overhead = 0;  // s, s, ratio − 1
};

using Pinning = exec::cpu::CpuRunOptions::Pinning;

exec::cpu::RunResult run_traced(const ir::Plan& plan, exec::Runtime runtime, Pinning pinning, int steps) {
  exec::cpu::CpuRunOptions opt;
  opt.runtime = runtime;
  opt.train.steps = steps;
  opt.keep_step_traces = true;
  opt.pinning = pinning;
  return exec::cpu::run_cpu(plan, opt);
}

// A step's measured events by (rank, op text), and the plan replayed with their compute
// durations (free communication): the time the schedule implies for those op times.
struct Measured {
  std::map<std::pair<int, std::string>, const traces::TraceEvent*> by_name;
  std::int64_t end = 0;
  ir::ReplayResult replay;

  Measured(const ir::Plan& plan, const traces::Trace& t) {
    for (const auto& e : t.events) {
      by_name[{e.rank, e.name}] = &e;
      end = std::max(end, e.end_ns());
    }
    replay = ir::replay(plan, [&](const ir::Op& op, int rank) -> std::int64_t {
      if (!ir::is_compute(op.kind)) return 0;
      const auto* e = event(op, rank);
      return e ? e->dur_ns : 0;
    });
  }
  const traces::TraceEvent* event(const ir::Op& op, int rank) const {
    auto it = by_name.find({rank, ir::op_to_text(op)});
    return it == by_name.end() ? nullptr : it->second;
  }
};

IterationFigures measure_iteration(const ir::Plan& plan, exec::Runtime runtime, Pinning pinning) {
  constexpr int kSteps = 12;
  const auto r = run_traced(plan, runtime, pinning, kSteps);
  std::vector<double> ratio, measured, implied;
  for (int step = 2; step < kSteps; ++step) {
    const Measured m(plan, r.step_traces[static_cast<std::size_t>(step)]);
    measured.push_back(static_cast<double>(m.end) * 1e-9);
    implied.push_back(static_cast<double>(m.replay.makespan_ns) * 1e-9);
    ratio.push_back(static_cast<double>(m.end) / static_cast<double>(m.replay.makespan_ns));
  }
  return {median(measured), median(implied), median(ratio) - 1};
}

// Why a schedule's measured step is longer than its replay: for one step, each op's
// lateness (measured start − replayed start, with the measured compute durations), op
// by op in measured order per (rank, stream). Where lateness grows, the runtime (or the
// transfer) added time. `bench_exec --explain SCHEDULE [SLICES [threaded|cooperative [pin|no-pin]]]`.
void explain(const ir::Scenario& sc, const std::string& schedule, int slices, exec::Runtime runtime,
             Pinning pinning) {
  const auto built = planner::build_plan(sc, schedule, slices);
  const ir::Plan& plan = built.lowered;
  const auto r = run_traced(plan, runtime, pinning, 5);
  const Measured m(plan, r.step_traces.back());
  const auto& rep = m.replay;
  fmt::print("{} S={} step {}: measured {:.3f} ms, replay {:.3f} ms\n", schedule, plan.slices,
             r.step_traces.size() - 1, m.end * 1e-6, rep.makespan_ns * 1e-6);
  for (int rank = 0; rank < plan.num_ranks(); ++rank)
    for (int s = 0; s < 2; ++s) {
      fmt::print(" rank {} {} stream: op, measured start..end, replayed start..end, lateness (ms)\n", rank,
                 s == 0 ? "compute" : "p2p");
      for (std::size_t i = 0; i < plan.ranks[static_cast<std::size_t>(rank)].size(); ++i) {
        const ir::Op& op = plan.ranks[static_cast<std::size_t>(rank)][i];
        if (static_cast<int>(op.stream) != s) continue;
        const auto* e = m.event(op, rank);
        const auto& tm = rep.timing[static_cast<std::size_t>(rank)][i];
        if (!e) continue;
        fmt::print("   {:<22} {:8.3f}..{:8.3f}  {:8.3f}..{:8.3f}  {:+7.3f}\n", ir::op_to_text(op), e->start_ns * 1e-6,
                   e->end_ns() * 1e-6, tm.start_ns * 1e-6, tm.end_ns * 1e-6, (e->start_ns - tm.start_ns) * 1e-6);
      }
    }
}

void bench_iteration(const ir::Scenario& sc, const std::string& schedule, int slices) {
  const auto built = planner::build_plan(sc, schedule, slices);
  fmt::print("  {:<12} S={}", schedule, built.lowered.slices);
  for (auto [runtime, pinning] : {std::pair{exec::Runtime::threaded, Pinning::off},
                                  std::pair{exec::Runtime::cooperative, Pinning::off},
                                  std::pair{exec::Runtime::cooperative, Pinning::on}}) {
    const IterationFigures f = measure_iteration(built.lowered, runtime, pinning);
    fmt::print("  {:7.2f} ms {:+5.1f} % over {:6.2f}", f.measured * 1e3, f.overhead * 100, f.implied * 1e3);
  }
  fmt::print("\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (tdpipe::bench::help_requested(argc, argv)) return 0;
  const std::string root = argc > 1 && argv[1][0] != '-' ? argv[1] : TDPIPE_SOURCE_DIR;
  const ir::Scenario sc = ir::load_scenario(root + "/scenarios/tiny-gpt-cpu.yaml");
  if (argc > 2 && std::string(argv[1]) == "--explain") {
    explain(sc, argv[2], argc > 3 ? std::stoi(argv[3]) : 1,
            argc > 4 && std::string(argv[4]) == "threaded" ? exec::Runtime::threaded : exec::Runtime::cooperative,
            argc > 5 && std::string(argv[5]) == "pin" ? Pinning::on : Pinning::off);
    return 0;
  }
  double load = 0;
  if (std::ifstream in("/proc/loadavg"); in) in >> load;
  fmt::print("bench_exec: {} hardware threads, load average {:.2f}\n", std::thread::hardware_concurrency(), load);
  fmt::print("(1) runtime overhead per op (compute does nothing; interpreter + rendezvous transport), "
             "threads created per step: a thread per stream (--runtime threaded), the cooperative runtime with a "
             "thread per rank (unpinned), and with a pinned thread per core taking turns between its ranks (the "
             "default where ranks outnumber cores)\n");
  for (const char* s : {"1f1b", "zb-h1", "interleaved"}) {
    try {
      bench_overhead(sc, s, 2, 16);
      bench_overhead(sc, s, 4, 32);
    } catch (const std::exception& e) {
      fmt::print("  {:<12} skipped: {}\n", s, e.what());
    }
  }
  fmt::print("(2) tiny-gpt-cpu: measured iteration vs sum of op times + inherent bubble (ir::replay of "
             "the measured op durations, free communication); median of steps 2-11; each runtime against "
             "its own op times; columns: thread per stream, cooperative, cooperative with a core per rank (--pin, "
             "the default where ranks <= cores)\n");
  for (auto [s, S] : std::vector<std::pair<const char*, int>>{
           {"gpipe", 1}, {"1f1b", 1}, {"interleaved", 1}, {"zb-h1", 1}, {"zb-h2", 1}, {"zb-v", 1},
           {"tdpipe", 2}, {"tdpipe", 4}}) {
    try {
      bench_iteration(sc, s, S);
    } catch (const std::exception& e) {
      fmt::print("  {:<12} S={} skipped: {}\n", s, S, std::string(e.what()).substr(0, 100));
    }
  }
  return 0;
}
