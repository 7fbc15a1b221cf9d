// test_faults.cpp — faults injected into CPU runs (issue 17 §1): every kind is noticed,
// retried or recovered from by a restart, and the weights and per-step losses after
// recovery are bit-identical to a run without faults; checkpoints on disk and resume.
#include <cmath>
#include <cstdlib>
#include <limits>
#include <filesystem>
#include <fstream>

#include <tuple>

#include <catch2/catch.hpp>

#include "../recovery_test_util.hpp"

#include "exec_test_util.hpp"
#include "tdpipe/exec/checkpoint.hpp"
#include "tdpipe/exec/faults.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec {
namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;

using tdpipe::test::TempDir;

ir::Plan plan_of(const std::string& schedule, int p, int d, int m = 4, int v = 1, int slices = 1) {
  ir::Scenario sc = test::small_scenario(p, d, m, 1);
  sc.parallel.chunks = v;
  sc.parallel.slices = slices;
  return planner::build_plan(sc, schedule).lowered;
}

cpu::CpuRunOptions options(int steps, const std::vector<std::string>& inject = {}) {
  cpu::CpuRunOptions o;
  o.train = test::train_options(steps);
  for (const auto& s : inject) o.faults.inject.push_back(parse_fault_spec(s));
  // Fast detection for the tests; a false alarm on a loaded machine only costs a restart.
  o.faults.heartbeat_period = 0.05;
  o.faults.heartbeat_timeout = 0.5;
  o.faults.retry_timeout = 0.005;
  return o;
}

// Checkpoints into `dir` every `every` steps.
void checkpoint_into(cpu::CpuRunOptions& o, const std::string& dir, int every) {
  o.faults.checkpoint_dir = dir;
  o.faults.checkpoint_every = every;
}

using tdpipe::test::require_identical;

// Flips every bit of byte 1000 of `path` (past the header: in the arrays).
void damage(const fs::path& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f);
  f.seekg(1000);
  const char c = static_cast<char>(f.get());
  f.seekp(1000);
  f.put(static_cast<char>(~c));
}

int count_kind(const cpu::RunResult& r, const std::string& kind) {
  int n = 0;
  for (const auto& f : r.faults) n += f.kind == kind;
  return n;
}

}  // namespace

TEST_CASE("fault specs parse, and bad ones are refused with the key and what was expected", "[exec][faults]") {
  const FaultSpec k = parse_fault_spec("kill:rank=1,step=3,op=F5");
  CHECK(k.kind == FaultSpec::Kind::Kill);
  CHECK(k.rank == 1);
  CHECK(k.step == 3);
  CHECK(k.op == "F5");
  const FaultSpec d = parse_fault_spec("drop:rank=0,peer=1,step=1,message=2,times=4");
  CHECK(d.kind == FaultSpec::Kind::Drop);
  CHECK(d.peer == 1);
  CHECK(d.message == 2);
  CHECK(d.times == 4);
  CHECK(parse_fault_spec("slow:rank=1,factor=3").factor == 3.0);
  CHECK(parse_fault_spec("ckpt-fail:step=4").kind == FaultSpec::Kind::CheckpointFail);
  CHECK_THROWS_WITH(parse_fault_spec("explode:rank=1"), Contains("unknown fault kind \"explode\""));
  CHECK_THROWS_WITH(parse_fault_spec("kill:rank=1"), Contains("kill needs step="));
  CHECK_THROWS_WITH(parse_fault_spec("kill:rank=1,step=x"), Contains("step=x is not an integer"));
  CHECK_THROWS_WITH(parse_fault_spec("kill:rank=1,step=2,step=3"), Contains("key \"step\" given twice"));
  CHECK_THROWS_WITH(parse_fault_spec("kill:rank=1,step=2,peer=0"), Contains("kill takes no key \"peer\""));
  CHECK_THROWS_WITH(parse_fault_spec("drop:rank=1,peer=1,step=0"), Contains("is the rank itself"));
  CHECK_THROWS_WITH(parse_fault_spec("slow:rank=1,factor=0.5"), Contains("not a number in (1, 100]"));
  CHECK_THROWS_WITH(parse_fault_spec("kill:rank=-1,step=0"), Contains("rank=-1 is not an integer in [0"));
}

TEST_CASE("fault specs that cannot fire in the run are refused before it starts", "[exec][faults]") {
  const ir::Plan plan = plan_of("1f1b", 2, 1);
  CHECK_THROWS_WITH(check_fault_spec(parse_fault_spec("kill:rank=2,step=0"), plan, 0, 3),
                    Contains("rank 2 is not in the run, whose world ranks are 0 to 1"));
  CHECK_THROWS_WITH(check_fault_spec(parse_fault_spec("kill:rank=0,step=3"), plan, 0, 3),
                    Contains("step 3 is not in this run, which takes steps 0 to 2"));
  CHECK_THROWS_WITH(check_fault_spec(parse_fault_spec("kill:rank=0,step=1,op=F9"), plan, 0, 3),
                    Contains("pipeline rank 0 has no op \"F9\""));
  CHECK_NOTHROW(check_fault_spec(parse_fault_spec("kill:rank=1,step=1,op=BW3"), plan, 0, 3));
  CHECK_THROWS_WITH(check_fault_spec(parse_fault_spec("drop:rank=0,peer=5,step=1"), plan, 0, 3),
                    Contains("peer 5 is not in the run"));
  auto o = options(3, {"ckpt-fail:step=2"});
  CHECK_THROWS_WITH(cpu::run_cpu(plan, o), Contains("no checkpoint is written after 2 steps"));
  o = options(3);
  o.faults.heartbeat_timeout = 0.05;  // under two periods
  CHECK_THROWS_WITH(cpu::run_cpu(plan, o), Contains("expected at least two periods"));
  o = options(3, {"kill:rank=0,step=1"});
  o.faults.heartbeat_timeout = 40;  // the watchdog (30 s) would end the run first
  CHECK_THROWS_WITH(cpu::run_cpu(plan, o), Contains("is not below the watchdog's 30 s"));
  o = options(3);
  o.faults.retry_timeout = 5;  // 5 + 10 + 20 s of backoff before the fourth failure escalates
  CHECK_THROWS_WITH(cpu::run_cpu(plan, o), Contains("3 retries wait 35.0 s in all"));
}

TEST_CASE("a killed rank is found by its missing heartbeats and the run restarts from the last checkpoint, "
          "bit-identical",
          "[exec][faults]") {
  const ir::Plan plan = plan_of("1f1b", 2, 1);
  const cpu::RunResult clean = cpu::run_cpu(plan, options(6));
  TempDir dir;
  auto o = options(6, {"kill:rank=1,step=3,op=BW2"});
  checkpoint_into(o, dir.path, 2);
  const cpu::RunResult r = cpu::run_cpu(plan, o);
  require_identical(r, clean);
  REQUIRE(r.restarts >= 1);
  const auto lost = std::find_if(r.faults.begin(), r.faults.end(), [](const FaultRecord& f) { return f.kind == "rank lost"; });
  REQUIRE(lost != r.faults.end());
  CHECK(lost->step == 3);
  CHECK(lost->rank == 1);
  CHECK_THAT(lost->detail, Contains("rank 1 sent no heartbeat"));
  CHECK(lost->restart_from == 2);  // the checkpoint after steps 0 and 1
  CHECK(lost->redone_steps == 1);
  CHECK(lost->detect_seconds >= 0.5 - 0.05);  // the timeout, less the period (its last beat came before it died)
  CHECK(lost->lost_seconds() > lost->detect_seconds);
  CHECK(r.unfired_faults.empty());
  CHECK(r.checkpoints_written == 3);
  CHECK(r.loss_per_step.size() == 6);  // each step once
}

TEST_CASE("a hung rank without checkpoints restarts the run from its start, bit-identical", "[exec][faults]") {
  const ir::Plan plan = plan_of("gpipe", 2, 1);
  const cpu::RunResult clean = cpu::run_cpu(plan, options(4));
  const cpu::RunResult r = cpu::run_cpu(plan, options(4, {"hang:rank=0,step=2"}));
  require_identical(r, clean);
  REQUIRE(r.restarts >= 1);
  CHECK(count_kind(r, "rank lost") >= 1);
  CHECK(r.faults.front().restart_from == 0);
  CHECK(r.faults.front().redone_steps == 2);
}

TEST_CASE("a lost and a corrupt message are sent again: no restart, bit-identical, retries in the trace",
          "[exec][faults]") {
  const ir::Plan plan = plan_of("1f1b", 2, 1);
  // Either poster does the due retries of a pair: the same under both runtimes, and with
  // both ranks taking turns on one thread.
  for (const auto& [runtime, threads, name] : {std::tuple{Runtime::cooperative, 2, "cooperative"},
                                               std::tuple{Runtime::cooperative, 1, "cooperative, one thread"},
                                               std::tuple{Runtime::threaded, 2, "threaded"}}) DYNAMIC_SECTION(name) {
    auto o = options(4);
    o.trace_step = 1;
    o.runtime = runtime;
    o.rank_threads = threads;
    const cpu::RunResult clean = cpu::run_cpu(plan, o);
    auto f = options(4, {"drop:rank=0,peer=1,step=1", "corrupt:rank=1,peer=0,step=1,message=2,times=2"});
    f.trace_step = 1;
    f.runtime = runtime;
    f.rank_threads = threads;
    const cpu::RunResult r = cpu::run_cpu(plan, f);
    require_identical(r, clean);
    CHECK(r.restarts == 0);
    CHECK(r.retries == 3);  // one lost delivery, two corrupt ones
    REQUIRE(count_kind(r, "retry") == 3);
    CHECK_THAT(r.faults[0].detail, Contains("lost"));
    int corrupt = 0;
    for (const auto& rec : r.faults) corrupt += rec.detail.find("corrupt") != std::string::npos;
    CHECK(corrupt == 2);
    CHECK(r.retry_seconds >= 0.005 + 0.005 + 0.010);  // the backoffs: 5 ms, then 5 and 10 ms
    int in_trace = 0;
    for (const auto& e : r.trace.events) in_trace += e.name.rfind("retry ", 0) == 0;
    CHECK(in_trace == 3);
  }
}

TEST_CASE("a transfer that keeps failing escalates after 3 retries and the run restarts, bit-identical",
          "[exec][faults]") {
  const ir::Plan plan = plan_of("1f1b", 2, 1);
  const cpu::RunResult clean = cpu::run_cpu(plan, options(4));
  const cpu::RunResult r = cpu::run_cpu(plan, options(4, {"drop:rank=1,peer=0,step=2,times=4"}));
  require_identical(r, clean);
  REQUIRE(r.restarts >= 1);
  CHECK(count_kind(r, "retry") == 3);
  REQUIRE(count_kind(r, "transfer failed") == 1);
  for (const auto& rec : r.faults)
    if (rec.kind == "transfer failed") CHECK_THAT(rec.detail, Contains("failed 4 times (lost): more than 3 retries"));
}

TEST_CASE("data-parallel transfers are retried too, and 1-bit Adam's error feedback survives a restart",
          "[exec][faults]") {
  ir::Scenario sc = test::small_scenario(2, 2, 4, 1);
  sc.parallel.optimizer = "onebit-adam";
  sc.parallel.onebit_warmup_steps = 2;
  const ir::Plan plan = planner::build_plan(sc, "1f1b").lowered;
  const cpu::RunResult clean = cpu::run_cpu(plan, options(6));
  TempDir dir;
  // World rank 2 is replica 1's rank 0: rank 0 → 2 is the data-parallel ring.
  auto o = options(6, {"corrupt:rank=0,peer=2,step=1", "kill:rank=3,step=4"});
  checkpoint_into(o, dir.path, 3);  // after the warm-up: the error feedback is in the checkpoint
  const cpu::RunResult r = cpu::run_cpu(plan, o);
  require_identical(r, clean);
  CHECK(r.retries >= 1);
  REQUIRE(r.restarts >= 1);
  CHECK(r.replica_divergence == 0);
}

TEST_CASE("interleaved chunks and fp16's loss scaler come back from a checkpoint exactly", "[exec][faults]") {
  ir::Scenario sc = test::small_scenario(2, 1, 4, 1);
  sc.parallel.chunks = 2;
  sc.parallel.slices = 2;
  sc.model.dtype = "fp16";
  sc.parallel.initial_loss_scale = 1024;
  sc.parallel.loss_scale_window = 2;  // the scales move while the run goes
  const ir::Plan plan = planner::build_plan(sc, "interleaved").lowered;
  const cpu::RunResult clean = cpu::run_cpu(plan, options(6));
  TempDir dir;
  auto o = options(6, {"kill:rank=0,step=4"});
  checkpoint_into(o, dir.path, 3);
  const cpu::RunResult r = cpu::run_cpu(plan, o);
  require_identical(r, clean);
  CHECK(r.loss_scale == clean.loss_scale);
}

TEST_CASE("a straggler changes the time, not the result, and stands out in the compute times", "[exec][faults]") {
  const ir::Plan plan = plan_of("1f1b", 2, 1);
  const cpu::RunResult clean = cpu::run_cpu(plan, options(3));
  const cpu::RunResult r = cpu::run_cpu(plan, options(3, {"slow:rank=1,factor=4"}));
  require_identical(r, clean);
  REQUIRE(r.rank_compute_seconds.size() == 2);
  // Rank 1's ops take 4× their work; its stage is no lighter than rank 0's (it holds the head).
  CHECK(r.rank_compute_seconds[1] > 2 * r.rank_compute_seconds[0]);
  CHECK(r.unfired_faults.empty());
}

TEST_CASE("a checkpoint that dies half-way is not used: the restart goes back to the one before", "[exec][faults]") {
  const ir::Plan plan = plan_of("1f1b", 2, 1);
  const cpu::RunResult clean = cpu::run_cpu(plan, options(6));
  TempDir dir;
  auto o = options(6, {"ckpt-fail:step=4", "kill:rank=0,step=4"});
  checkpoint_into(o, dir.path, 2);
  o.faults.checkpoint_keep = 5;
  const cpu::RunResult r = cpu::run_cpu(plan, o);
  require_identical(r, clean);
  REQUIRE(count_kind(r, "ckpt-fail") == 1);
  for (const auto& rec : r.faults) {
    if (rec.kind == "ckpt-fail") CHECK_THAT(rec.detail, Contains("the last complete checkpoint is the one after step 1"));
    if (rec.kind == "rank lost") CHECK(rec.restart_from == 2);  // not 4: that one never finished
  }
}

TEST_CASE("a rank that fails every time is given up on after --max-restarts, with the history", "[exec][faults]") {
  const ir::Plan plan = plan_of("1f1b", 2, 1);
  auto o = options(3, {"kill:rank=1,step=1,times=10"});
  o.faults.max_restarts = 1;
  CHECK_THROWS_WITH(cpu::run_cpu(plan, o), Contains("gave up after 1 restart (--max-restarts 1)") &&
                                               Contains("rank 1 sent no heartbeat"));
}

TEST_CASE("resume after the process died: the rest of the run from the last complete checkpoint, bit-identical",
          "[exec][faults]") {
  const ir::Plan plan = plan_of("1f1b", 2, 1);
  const cpu::RunResult clean = cpu::run_cpu(plan, options(6));
  TempDir dir;
  auto first = options(4);  // the run that "died" after its 4th step
  checkpoint_into(first, dir.path, 2);
  const cpu::RunResult before = cpu::run_cpu(plan, first);
  // A checkpoint a dying process left half-written, newer than the last complete one.
  fs::create_directories(checkpoint_folder(dir.path, 6));
  std::ofstream(fs::path(checkpoint_folder(dir.path, 6)) / ".rank-0000.ckpt.tmp-partial") << "TDPCKPT1\n{";

  auto again = options(6);
  again.faults.checkpoint_dir = dir.path;
  again.faults.resume = true;
  const cpu::RunResult r = cpu::run_cpu(plan, again);
  CHECK(r.first_step == 4);
  REQUIRE(r.loss_per_step.size() == 2);
  CHECK(r.earlier_loss_per_step == before.loss_per_step);
  std::vector<double> all = r.earlier_loss_per_step;
  all.insert(all.end(), r.loss_per_step.begin(), r.loss_per_step.end());
  CHECK(all == clean.loss_per_step);
  CHECK(r.weights == clean.weights);
  CHECK(r.state.m1 == clean.state.m1);
  CHECK(r.state.m2 == clean.state.m2);
  CHECK(r.state.steps_done == 6);

  // Another run's options are refused, naming what differs.
  auto other = again;
  other.train.data_seed = 99;
  CHECK_THROWS_WITH(cpu::run_cpu(plan, other), Contains("belongs to another run: its seeds is \"data=7"));
  ir::Scenario sharded = test::small_scenario(2, 1, 4, 1);
  sharded.parallel.bucket_mb = 1;  // shapes the optimizer's state: another run
  CHECK_THROWS_WITH(cpu::run_cpu(planner::build_plan(sharded, "1f1b").lowered, again),
                    Contains("its optimizer is") && Contains("bucket_mb=40"));
  // A fresh run into a folder with checkpoints would mix two runs.
  auto fresh = options(6);
  checkpoint_into(fresh, dir.path, 2);
  CHECK_THROWS_WITH(cpu::run_cpu(plan, fresh), Contains("holds another run's checkpoints"));
}

TEST_CASE("a damaged checkpoint file is found by its CRC and the one before it is used", "[exec][faults]") {
  const ir::Plan plan = plan_of("1f1b", 2, 1);
  TempDir dir;
  auto o = options(4);
  checkpoint_into(o, dir.path, 2);
  cpu::run_cpu(plan, o);
  const auto path = fs::path(checkpoint_folder(dir.path, 4)) / "rank-0001.ckpt";
  damage(path);
  std::vector<std::string> skipped;
  const auto latest = latest_checkpoint(dir.path, {}, &skipped);
  REQUIRE(latest);
  CHECK(latest->steps_done == 2);
  REQUIRE(skipped.size() == 1);
  CHECK_THAT(skipped[0], Contains("rank-0001.ckpt: its CRC-32 is not the manifest's"));
  // Read directly, a damaged file is refused by name.
  damage(fs::path(checkpoint_folder(dir.path, 2)) / "rank-0000.ckpt");
  CHECK_THROWS_WITH(read_rank_checkpoint(dir.path, *latest, 0), Contains("rank-0000.ckpt") && Contains("damaged"));
}

TEST_CASE("a rank's checkpoint is its whole state: written and read back equal", "[exec][faults]") {
  TempDir dir;
  RankCheckpoint a{0, {{"c0.params", {1.5, -2.25, 1e-300}}, {"c0.m1", {}}}, {{1024, 2048}, {3, 0}, 1}};
  RankCheckpoint b{1, {{"c0.params", {0.1}}}, {}};
  CheckpointManifest m;
  m.steps_done = 3;
  m.run = {{"schedule", "1f1b"}};
  m.loss_per_step = {4.5, 4.25, std::numeric_limits<double>::quiet_NaN()};  // a diverged step, too
  m.iteration_seconds = {0.1, 0.1, 0.1};
  write_checkpoint(dir.path, m, {a, b});
  const auto got = latest_checkpoint(dir.path, {{"schedule", "1f1b"}});
  REQUIRE(got);
  REQUIRE(got->loss_per_step.size() == 3);
  CHECK(got->loss_per_step[1] == 4.25);
  CHECK(std::isnan(got->loss_per_step[2]));
  CHECK(read_rank_checkpoint(dir.path, *got, 0) == a);
  CHECK(read_rank_checkpoint(dir.path, *got, 1) == b);
  CHECK_THROWS_WITH(latest_checkpoint(dir.path, {{"schedule", "gpipe"}}),
                    Contains("its schedule is \"1f1b\", this run's is \"gpipe\""));
  // Pruning keeps the newest complete ones.
  for (int s : {6, 9}) {
    m.steps_done = s;
    write_checkpoint(dir.path, m, {a, b});
  }
  prune_checkpoints(dir.path, 2);
  CHECK(!fs::exists(checkpoint_folder(dir.path, 3)));
  CHECK(fs::exists(checkpoint_folder(dir.path, 6)));
  CHECK(fs::exists(checkpoint_folder(dir.path, 9)));
}

}  // namespace tdpipe::exec
