// bench_faults.cpp — what fault tolerance costs and how fast it reacts, on the CPU
// executor (tiny-gpt-cpu, 1F1B, p = 2), side by side in one run:
//  1. CRC-32 throughput (zlib) and what the checksum plus acknowledgement of every
//     message costs: per-message time of the fabric against a run's median step;
//  2. detection: a killed rank found by its heartbeats (period, timeout, measured);
//  3. recovery: the time a kill at step K costs, by checkpoint interval (restart from
//     the start, every 4 steps, every step), and the steps redone;
//  4. checkpoints: bytes and write time per checkpoint;
//  5. a lost message: what its retry adds to the step.
//
//   build/<dir>/bench/bench_faults [SOURCE_DIR] [STEPS]
#include "bench_help.hpp"
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/exec/faults.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"

using namespace tdpipe;
namespace fs = std::filesystem;

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

exec::cpu::CpuRunOptions options(const std::string& root, int steps, const std::vector<std::string>& inject = {}) {
  exec::cpu::CpuRunOptions o;
  o.train.steps = steps;
  o.train.corpus_path = root + "/data/tiny_corpus.txt";
  for (const auto& s : inject) o.faults.inject.push_back(exec::parse_fault_spec(s));
  return o;
}

double wall(const ir::Plan& plan, const exec::cpu::CpuRunOptions& o, exec::cpu::RunResult* out = nullptr) {
  const auto t0 = std::chrono::steady_clock::now();
  exec::cpu::RunResult r = exec::cpu::run_cpu(plan, o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (out) *out = std::move(r);
  return s;
}

std::string temp_dir() {
  std::string tmpl = (fs::temp_directory_path() / "bench-faults-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  return tmpl;
}

}  // namespace

int main(int argc, char** argv) {
  if (tdpipe::bench::help_requested(argc, argv)) return 0;
  const std::string root = argc > 1 ? argv[1] : TDPIPE_SOURCE_DIR;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 12;
  if (steps < 4) {
    fmt::print(stderr, "bench_faults: STEPS must be at least 4 (a kill two steps before the end)\n");
    return 2;
  }
  const ir::Scenario sc = ir::load_scenario(root + "/scenarios/tiny-gpt-cpu.yaml");
  const ir::Plan plan = planner::build_plan(sc, "1f1b").lowered;
  int messages = 0;
  for (const auto& rank : plan.ranks)
    for (const auto& op : rank) messages += op.kind == ir::OpKind::SEND;

  // 1. CRC-32 and the fabric's per-message cost.
  std::vector<unsigned char> buf(64 << 20, 0x5a);
  const auto c0 = std::chrono::steady_clock::now();
  std::uint32_t crc = 0;
  for (int i = 0; i < 4; ++i) crc = exec::crc32_of(buf.data(), buf.size());
  const double crc_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
  exec::cpu::RunResult clean;
  wall(plan, options(root, steps), &clean);
  const double step_s = median({clean.iteration_seconds.begin() + 1, clean.iteration_seconds.end()});
  const double msg_bytes = 65536;  // the tiny model's activation: b · seq · hidden doubles
  const double crc_per_msg = 2 * msg_bytes / (4.0 * buf.size() / crc_s);  // sender and receiver
  fmt::print("tiny-gpt-cpu, 1F1B p=2 m=4, {} steps; {} messages per step\n", steps, messages);
  fmt::print("1. CRC-32 (zlib): {:.2f} GB/s (check {:08x}); per 64 KiB message, sender + receiver: {:.1f} us = "
             "{:.3f} % of a {:.1f} ms step for all {} messages\n",
             4.0 * buf.size() / crc_s / 1e9, crc, crc_per_msg * 1e6, 100 * crc_per_msg * messages / step_s,
             step_s * 1e3, messages);

  // 2. Detection of a killed rank, by heartbeat settings.
  exec::cpu::RunResult clean4;
  wall(plan, options(root, 4), &clean4);
  fmt::print("2. a killed rank found by its heartbeats\n   period   timeout   detected after\n");
  for (auto [period, timeout] : {std::pair{0.1, 1.0}, std::pair{0.05, 0.5}, std::pair{0.02, 0.2}}) {
    auto o = options(root, 4, {"kill:rank=1,step=2"});
    o.faults.heartbeat_period = period;
    o.faults.heartbeat_timeout = timeout;
    exec::cpu::RunResult r;
    wall(plan, o, &r);
    double detect = -1;
    for (const auto& f : r.faults)
      if (f.kind == "rank lost") detect = f.detect_seconds;
    fmt::print("   {:5.2f} s  {:6.2f} s  {:8.3f} s{}\n", period, timeout, detect,
               r.weights == clean4.weights ? "  same weights" : "  WEIGHTS DIFFER");
  }

  // 3. + 4. Recovery by checkpoint interval: a kill at the last step but one.
  const int kill_at = steps - 2;
  const double clean_wall = wall(plan, options(root, steps));
  fmt::print("3. a kill at step {} of {} (heartbeat timeout 1 s); a clean run takes {:.2f} s\n", kill_at, steps,
             clean_wall);
  fmt::print("   checkpoints      wall s   lost s  (detect  partial  restart  redo)  steps redone  ckpt KiB  ckpt ms "
             " same weights\n");
  for (int every : {0, 4, 1}) {
    auto o = options(root, steps, {fmt::format("kill:rank=1,step={}", kill_at)});
    std::string dir;
    if (every > 0) {
      dir = temp_dir();
      o.faults.checkpoint_dir = dir;
      o.faults.checkpoint_every = every;
    }
    exec::cpu::RunResult r;
    const double w = wall(plan, o, &r);
    exec::FaultRecord lost;
    for (const auto& f : r.faults)
      if (f.kind == "rank lost") lost = f;
    fmt::print("   {:<14}  {:6.2f}  {:6.2f}   ({:.2f}    {:.3f}    {:.3f}   {:.3f})  {:12d}  {:8.0f}  {:7.1f}  {}\n",
               every == 0 ? "none (start)" : fmt::format("every {}", every), w, lost.lost_seconds(),
               lost.detect_seconds, lost.partial_seconds, lost.restart_seconds, lost.redo_seconds, lost.redone_steps,
               r.checkpoints_written ? static_cast<double>(r.checkpoint_bytes) / r.checkpoints_written / 1024 : 0.0,
               r.checkpoints_written ? 1e3 * r.checkpoint_seconds / r.checkpoints_written : 0.0,
               r.weights == clean.weights && r.loss_per_step == clean.loss_per_step ? "yes" : "NO");
    if (!dir.empty()) fs::remove_all(dir);
  }

  // 5. A lost message and its retry.
  exec::cpu::RunResult dropped;
  wall(plan, options(root, 4, {"drop:rank=0,peer=1,step=2"}), &dropped);
  fmt::print("5. one lost message at step 2 (retry timeout 20 ms): {} retry, {:.1f} ms waited; step 2 took {:.1f} ms, "
             "the median step {:.1f} ms\n",
             dropped.retries, dropped.retry_seconds * 1e3, dropped.iteration_seconds.at(2) * 1e3,
             median(dropped.iteration_seconds) * 1e3);
  return 0;
}
