// test_scenario_json.cpp — the GPU machine has no yaml-cpp, so its tests and
// scripts read JSON copies of the scenarios they need; this keeps the copies equal
// to the YAML originals (run with TDPIPE_REGENERATE=1 to rewrite them).
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

TEST_CASE("JSON copies of the GPU-check scenarios match their YAML", "[scenario][gpu-inputs]") {
#if !defined(TDPIPE_TEST_HAVE_YAML)
  WARN("built without YAML: nothing to compare the JSON copies with");
  return;
#else
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
#endif
}
