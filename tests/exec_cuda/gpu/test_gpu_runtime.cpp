// test_gpu_runtime.cpp — what the CUDA runtime reports: well-formed event traces,
// clear errors for layouts the machine cannot run.
#include <catch2/catch.hpp>

#include <algorithm>
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
