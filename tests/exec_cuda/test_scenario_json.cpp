// test_scenario_json.cpp — the GPU machine has no yaml-cpp, so its tests and
// scripts read JSON copies of the scenarios they need. On every build the copy must
// read back into the tiny model the GPU tests describe; where YAML is built in, it
// must also equal the YAML original (run with TDPIPE_REGENERATE=1 to rewrite it).
// A build without YAML (the `gpu` preset) has no original to compare with, so that
// case is not compiled there — it is never reported as a pass it did not earn.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tdpipe/ir/scenario_io.hpp"

namespace {
std::string src(const std::string& rel) { return std::string(TDPIPE_SOURCE_DIR) + "/" + rel; }
}  // namespace

TEST_CASE("the JSON copy of tiny-gpt-cpu reads back into the GPU tests' model", "[scenario][gpu-inputs]") {
  const std::string copy = src("tests/exec_cuda/data/tiny-gpt-cpu.json");
  std::ifstream in(copy);
  INFO("missing " << copy);
  REQUIRE(in.good());
  const tdpipe::ir::Scenario sc = tdpipe::ir::scenario_from_json(nlohmann::json::parse(in));
  // What tests/exec_cuda/gpu/gpu_test_util.hpp and scripts/gpu-check.sh rely on.
  CHECK(sc.name == "tiny-gpt-cpu");
  CHECK(sc.model.layers == 4);
  CHECK(sc.model.hidden == 64);
  CHECK(sc.model.heads == 4);
  CHECK(sc.model.ffn == 256);
  CHECK(sc.model.seq == 64);
  CHECK(sc.model.vocab == 96);
  CHECK(sc.parallel.micro_batch == 2);
}

#if defined(TDPIPE_TEST_HAVE_YAML)
TEST_CASE("JSON copies of the GPU-check scenarios match their YAML", "[scenario][gpu-inputs]") {
  for (const char* stem : {"tiny-gpt-cpu"}) {
    const std::string yaml = src(std::string("scenarios/") + stem + ".yaml");
    const std::string copy = src(std::string("tests/exec_cuda/data/") + stem + ".json");
    nlohmann::json want = tdpipe::ir::to_json(tdpipe::ir::load_scenario(yaml));
    want["source_file"] = std::string("scenarios/") + stem + ".yaml";  // not this checkout's absolute path
    if (std::getenv("TDPIPE_REGENERATE") != nullptr) std::ofstream(copy) << want.dump(2) << "\n";
    std::ifstream in(copy);
    INFO("missing " << copy << ": run this test with TDPIPE_REGENERATE=1");
    REQUIRE(in.good());
    nlohmann::json got = nlohmann::json::parse(in);
    INFO(copy << " is stale: rerun with TDPIPE_REGENERATE=1");
    CHECK(got == want);
    // And the copy reads back into the same scenario.
    CHECK(tdpipe::ir::scenario_from_json(got).model == tdpipe::ir::load_scenario(yaml).model);
  }
}
#endif
