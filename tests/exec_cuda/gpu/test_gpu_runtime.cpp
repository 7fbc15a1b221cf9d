// test_gpu_runtime.cpp — what the CUDA runtime reports: well-formed event traces,
// clear errors for layouts the machine cannot run.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <tuple>
#include <utility>

#include "gpu_test_util.hpp"
#include "tdpipe/exec/cuda/run.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/planner/build_plan.hpp"

using namespace tdpipe;
using namespace tdpipe::exec;
using Catch::Matchers::Contains;

TEST_CASE("a loopback run's trace has one event per op, ordered per stream", "[gpu][trace]") {
  const ir::Scenario sc = cuda::test::tiny_scenario(4, 1, 8);
  const auto built = planner::build_plan(sc, "zb-h1", 1);
  cuda::CudaRunOptions o;
  o.train = cuda::test::train_options(2);
  const cuda::CudaRunResult r = cuda::run_cuda(built.lowered, o);
  const traces::Trace& t = r.run.trace;
  CHECK(t.origin == "cuda");
  CHECK(t.ranks == 4);
  CHECK(t.metadata.at("backend") == "cuda");
  CHECK(t.metadata.at("transport") == "loopback");
  std::size_t ops = 0;
  for (const auto& rank : built.lowered.ranks) ops += rank.size();
  CHECK(t.events.size() == ops);
  std::map<std::pair<int, int>, std::int64_t> last_end;
  std::int64_t first = -1;
  for (const auto& e : t.events) {
    CHECK(e.dur_ns >= 0);
    CHECK(e.start_ns >= 0);
    if (first < 0 || e.start_ns < first) first = e.start_ns;
  }
  CHECK(first == 0);
  // Events of one (rank, stream) in trace order never overlap (ops of a stream are serial).
  std::vector<traces::TraceEvent> sorted = t.events;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return std::tie(a.rank, a.stream, a.start_ns) < std::tie(b.rank, b.stream, b.start_ns);
  });
  // (Comm ops posted as one batch share their interval: same start.)
  std::map<std::pair<int, int>, std::int64_t> last_start;
  for (const auto& e : sorted) {
    auto key = std::make_pair(e.rank, e.stream);
    if (last_end.count(key) && e.start_ns != last_start[key])
      CHECK(e.start_ns >= last_end[key] - 1000);  // 1 µs: event resolution
    last_end[key] = std::max(last_end[key], e.end_ns());
    last_start[key] = e.start_ns;
  }
  CHECK(r.run.iteration_seconds.size() == 2);
  CHECK(r.run.iteration_seconds[1] > 0);
}

TEST_CASE("NCCL transport without enough processes says how to launch", "[gpu][errors]") {
  const ir::Scenario sc = cuda::test::tiny_scenario(4, 1, 8);
  const auto built = planner::build_plan(sc, "1f1b", 1);
  cuda::CudaRunOptions o;
  o.train = cuda::test::train_options(1);
  o.transport = cuda::TransportKind::Nccl;
  CHECK_THROWS_WITH(cuda::run_cuda(built.lowered, o),
                    Contains("the plan needs 4 GPUs") && Contains("mpirun -np 4") && Contains("--transport loopback"));
}

TEST_CASE("a model too large for the GPU is refused with sizes in GiB", "[gpu][errors]") {
  ir::Scenario sc = cuda::test::tiny_scenario(2, 1, 2);
  sc.model.hidden = 16384;
  sc.model.ffn = 65536;
  sc.model.heads = 128;
  sc.model.layers = 64;
  sc.model.vocab = 96;
  const auto built = planner::build_plan(sc, "1f1b", 1);
  cuda::CudaRunOptions o;
  o.train = cuda::test::train_options(1);
  CHECK_THROWS_WITH(cuda::run_cuda(built.lowered, o), Contains("GiB free of") && Contains("needs about"));
}

TEST_CASE("query_gpus sees this GPU", "[gpu]") {
  const cuda::GpuInfo g = cuda::query_gpus();
  CHECK(g.count >= 1);
  CHECK_FALSE(g.name.empty());
  CHECK(g.total_bytes > 0);
}

namespace {
// Index of the first SEND of `payload`/`mb` on `rank` of a lowered plan.
std::size_t find_send(const ir::Plan& plan, int rank, int mb) {
  const auto& ops = plan.ranks.at(static_cast<std::size_t>(rank));
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (ops[i].kind == ir::OpKind::SEND && ops[i].payload == ir::OpKind::F && ops[i].mb == mb) return i;
  FAIL("rank " << rank << " has no SEND of the activation of mb " << mb);
  return 0;
}
}  // namespace

TEST_CASE("an order mismatch between two stage threads fails the loopback run, naming both", "[gpu][errors]") {
  const ir::Scenario sc = cuda::test::tiny_scenario(4, 1, 8);
  ir::Plan plan = planner::build_plan(sc, "1f1b", 1).lowered;
  // Rank 0 sends mb 1's activation where rank 1 expects mb 0's (its 1st and 2nd SENDs swapped).
  std::swap(plan.ranks[0][find_send(plan, 0, 0)].mb, plan.ranks[0][find_send(plan, 0, 1)].mb);
  cuda::CudaRunOptions o;
  o.train = cuda::test::train_options(1);
  o.watchdog_seconds = 30;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(cuda::run_cuda(plan, o), Contains("order mismatch between rank 0 and rank 1") &&
                                                 Contains("activation of mb 1") && Contains("activation of mb 0"));
  // Every other thread stopped at once: no watchdog, no hang.
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
}

TEST_CASE("a SEND nobody receives ends in the watchdog's report, not a hang", "[gpu][errors]") {
  const ir::Scenario sc = cuda::test::tiny_scenario(4, 1, 8);
  ir::Plan plan = planner::build_plan(sc, "1f1b", 1).lowered;
  plan.ranks[0][find_send(plan, 0, 0)].peer = 2;  // rank 2 never posts a RECV from rank 0
  cuda::CudaRunOptions o;
  o.train = cuda::test::train_options(1);
  o.watchdog_seconds = 2;
  CHECK_THROWS_WITH(cuda::run_cuda(plan, o), Contains("watchdog") && Contains("unmatched: rank 0: SEND") &&
                                                 Contains("to rank 2"));
  // The device is still usable afterwards: a correct run of the same shape succeeds.
  const auto good = planner::build_plan(sc, "1f1b", 1).lowered;
  o.watchdog_seconds = 120;
  const cuda::CudaRunResult r = cuda::run_cuda(good, o);
  CHECK(r.run.loss_per_step.size() == 1);
  CHECK(std::isfinite(r.run.loss_per_step[0]));
}

TEST_CASE("per-step origins: every step's events fit inside its own iteration time", "[gpu][trace]") {
  const ir::Scenario sc = cuda::test::tiny_scenario(4, 1, 8);
  const auto built = planner::build_plan(sc, "1f1b", 1);
  cuda::CudaRunOptions o;
  o.train = cuda::test::train_options(3);
  o.keep_step_traces = true;
  const cuda::CudaRunResult r = cuda::run_cuda(built.lowered, o);
  REQUIRE(r.run.step_traces.size() == 3);
  for (std::size_t s = 0; s < 3; ++s) {
    std::int64_t last_end = 0;
    for (const auto& e : r.run.step_traces[s].events) last_end = std::max(last_end, e.end_ns());
    INFO("step " << s);
    // Within the step's own iteration time (plus 1 ms of host slack around the threads).
    CHECK(last_end <= static_cast<std::int64_t>(r.run.iteration_seconds[s] * 1e9) + 1000000);
  }
}

TEST_CASE("the NCCL transport runs a one-process plan like the loopback transport", "[gpu][nccl]") {
  // One GPU can hold only one NCCL rank, so this is the most of the NCCL path a
  // single-GPU machine exercises: id, ncclCommInitRank, warm-up, the barrier and loss
  // all-reduces, the per-step origin, teardown with ncclCommDestroy.
  const ir::Scenario sc = cuda::test::tiny_scenario(1, 1, 4);
  const auto built = planner::build_plan(sc, "1f1b", 1);
  REQUIRE(built.lowered.num_ranks() == 1);
  cuda::CudaRunOptions o;
  o.train = cuda::test::train_options(2);
  const cuda::CudaRunResult loop = cuda::run_cuda(built.lowered, o);
  o.transport = cuda::TransportKind::Nccl;
  const cuda::CudaRunResult nccl = cuda::run_cuda(built.lowered, o);
  CHECK(nccl.world_size == 1);
  CHECK(nccl.root);
  CHECK(nccl.run.trace.metadata.at("transport") == "nccl");
  REQUIRE(nccl.run.loss_per_step.size() == 2);
  for (int s = 0; s < 2; ++s) {
    INFO("step " << s);
    // Same kernels and data; only atomics' summation order may differ.
    CHECK(nccl.run.loss_per_step[s] == Approx(loop.run.loss_per_step[s]).epsilon(1e-5));
  }
  std::size_t ops = built.lowered.ranks[0].size();
  CHECK(nccl.run.trace.events.size() == ops);
  CHECK(nccl.weights_l2 == Approx(loop.weights_l2).epsilon(1e-5));
}
