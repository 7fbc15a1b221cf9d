// test_no_gpu.cpp — what the CUDA backend says on a machine without a GPU, and the
// parts of its front end that need none. The no-GPU messages are asserted on every
// machine: on one with a GPU the test re-runs itself in a child process that sees no
// device (CUDA_VISIBLE_DEVICES=""), so the case never silently passes for lack of a
// subject.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tdpipe/exec/cuda/calibrate.hpp"
#include "tdpipe/exec/cuda/run.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"

extern char** environ;

using namespace tdpipe;
using namespace tdpipe::exec::cuda;
using Catch::Matchers::Contains;

namespace {

ir::Scenario tiny() {
  std::ifstream in(std::string(TDPIPE_SOURCE_DIR) + "/tests/exec_cuda/data/tiny-gpt-cpu.json");
  REQUIRE(in.good());
  return ir::scenario_from_json(nlohmann::json::parse(in));
}

constexpr const char* kChildCase = "no-GPU child: every entry point says there is no GPU";

// Runs this test executable's hidden case `name` with every CUDA device hidden;
// returns its exit status and output.
std::pair<int, std::string> run_hidden_case_without_gpu(const std::string& name) {
  char out_path[] = "/tmp/tdpipe_no_gpu_XXXXXX";
  const int fd = mkstemp(out_path);
  REQUIRE(fd >= 0);
  close(fd);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::string(*e).rfind("CUDA_VISIBLE_DEVICES=", 0) != 0) env.emplace_back(*e);
  env.emplace_back("CUDA_VISIBLE_DEVICES=");
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe", test = name;
  std::vector<char*> argv{exe.data(), test.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path, O_WRONLY | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE(rc == 0);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  std::ifstream in(out_path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(out_path);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), text.str()};
}

}  // namespace

TEST_CASE("transport names", "[cuda-frontend]") {
  CHECK(transport_from_string("nccl") == TransportKind::Nccl);
  CHECK(transport_from_string("loopback") == TransportKind::Loopback);
  CHECK(to_string(TransportKind::Nccl) == "nccl");
  CHECK_THROWS_WITH(transport_from_string("gloo"), Contains("--transport gloo: expected loopback") &&
                                                       Contains("or nccl"));
}

TEST_CASE("plans the runner cannot take are refused before any GPU is touched", "[cuda-frontend]") {
  const auto built = planner::build_plan(tiny(), "1f1b", 1);
  CudaRunOptions o;
  o.train.steps = 1;
  CHECK_THROWS_WITH(run_cuda(built.compute_only, o), Contains("is not lowered"));
  o.train.steps = 0;
  CHECK_THROWS_WITH(run_cuda(built.lowered, o), Contains("--steps: expected at least 1"));
}

TEST_CASE("without a GPU every entry point says so instead of crashing", "[cuda-frontend]") {
  // Always in a child that sees no device: this process may have one (or may have
  // initialised CUDA already, after which hiding devices has no effect).
  const auto [status, output] = run_hidden_case_without_gpu(kChildCase);
  INFO("child output:\n" << output);
  CHECK(status == 0);
  CHECK_THAT(output, Contains("All tests passed") && Contains("assertions"));
}

TEST_CASE(kChildCase, "[.][cuda-frontend]") {
  const GpuInfo gpus = query_gpus();
  INFO("run this case through its parent, which hides every GPU");
  REQUIRE(gpus.count == 0);
  CHECK_FALSE(gpus.why_none.empty());
  const auto built = planner::build_plan(tiny(), "1f1b", 1);
  CudaRunOptions o;
  o.train.steps = 1;
  CHECK_THROWS_WITH(run_cuda(built.lowered, o), Contains("needs a GPU but none is visible") &&
                                                    Contains("--backend cpu"));
  o.transport = TransportKind::Nccl;
  CHECK_THROWS_WITH(run_cuda(built.lowered, o), Contains("needs a GPU but none is visible"));
  CHECK_THROWS_WITH(time_layer(LayerShape{}, 1, 1), Contains("no CUDA GPU 0"));
  CudaCalibrateOptions c;
  CHECK_THROWS_WITH(calibrate(built.lowered, c), Contains("needs a GPU but none is visible"));
}
