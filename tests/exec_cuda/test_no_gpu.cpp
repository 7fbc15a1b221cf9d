// test_no_gpu.cpp — what the CUDA backend says on a machine without a GPU (this CI
// machine), and the parts of its front end that need none.
#include <catch2/catch.hpp>

#include "tdpipe/exec/cuda/calibrate.hpp"
#include "tdpipe/exec/cuda/run.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"

#include <fstream>

#include <nlohmann/json.hpp>

using namespace tdpipe;
using namespace tdpipe::exec::cuda;
using Catch::Matchers::Contains;

TEST_CASE("transport names", "[cuda-frontend]") {
  CHECK(transport_from_string("nccl") == TransportKind::Nccl);
  CHECK(transport_from_string("loopback") == TransportKind::Loopback);
  CHECK(to_string(TransportKind::Nccl) == "nccl");
  CHECK_THROWS_WITH(transport_from_string("gloo"), Contains("--transport gloo: expected loopback") &&
                                                       Contains("or nccl"));
}

TEST_CASE("without a GPU every entry point says so instead of crashing", "[cuda-frontend]") {
  const GpuInfo gpus = query_gpus();
  if (gpus.count > 0) {
    WARN("this machine has a GPU: the no-GPU messages are not exercised here");
    return;
  }
  CHECK_FALSE(gpus.why_none.empty());
  std::ifstream in(std::string(TDPIPE_SOURCE_DIR) + "/tests/exec_cuda/data/tiny-gpt-cpu.json");
  REQUIRE(in.good());
  const ir::Scenario sc = ir::scenario_from_json(nlohmann::json::parse(in));
  const auto built = planner::build_plan(sc, "1f1b", 1);
  CudaRunOptions o;
  o.train.steps = 1;
  CHECK_THROWS_WITH(run_cuda(built.lowered, o), Contains("needs a GPU but none is visible") &&
                                                    Contains("--backend cpu"));
  o.transport = TransportKind::Nccl;
  CHECK_THROWS_WITH(run_cuda(built.lowered, o), Contains("needs a GPU but none is visible"));
  CHECK_THROWS_WITH(time_layer(LayerShape{}, 1, 1), Contains("no CUDA GPU 0"));
  ir::Plan unlowered = built.compute_only;
  CHECK_THROWS_WITH(run_cuda(unlowered, o), Contains("is not lowered"));
}
