// test_profile.cpp — calibration profiles: lookup by specificity, JSON round trip, errors.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/traces/profile.hpp"

using namespace tdpipe;
using namespace tdpipe::traces;

namespace {

Profile sample() {
  Profile p;
  p.scenario = "tiny-gpt-cpu";
  p.stages = 2;
  p.platform = {"cpu", "x86_64", "2 cores shared by 2 rank threads", 2, 2, 1};
  p.ops = {{ir::OpKind::F, -1, -1, 2, 1e-3, 10},
           {ir::OpKind::F, 1, -1, 2, 1.5e-3, 10},
           {ir::OpKind::F, 1, 1, 2, 1.25e-3, 10},
           {ir::OpKind::B, -1, -1, 2, 2e-3, 10},
           {ir::OpKind::W, -1, 0, 2, 0.5e-3, 10}};
  p.p2p = {20e-6, 2e9};
  p.collective = {50e-6, 1e9};
  p.metadata = {{"steps", "5"}};
  return p;
}

// 1F1B of the tiny scenario's shape on 2 stages (one chunk each), one F per rank.
ir::Plan two_stage_plan() {
  ir::Plan plan;
  plan.schedule = "1f1b";
  plan.stages = 2;
  plan.microbatches = 1;
  plan.chunks = 1;
  plan.stage_of = {{0}, {1}};
  plan.scenario.name = "tiny-gpt-cpu";
  plan.scenario.model.layers = 4;
  ir::Op f;
  f.kind = ir::OpKind::F;
  f.mb = 0;
  plan.ranks = {{f}, {f}};
  return plan;
}

}  // namespace

TEST_CASE("Profile lookup takes the most specific entry", "[traces][profile]") {
  const Profile p = sample();
  CHECK(profile_seconds(p, ir::OpKind::F, 0, 0) == Approx(1e-3));
  CHECK(profile_seconds(p, ir::OpKind::F, 1, 0) == Approx(1.5e-3));
  CHECK(profile_seconds(p, ir::OpKind::F, 1, 1) == Approx(1.25e-3));
  CHECK(profile_seconds(p, ir::OpKind::W, 3, 0) == Approx(0.5e-3));
  CHECK_FALSE(profile_seconds(p, ir::OpKind::W, 3, 1));
  CHECK(profile_seconds(p, ir::OpKind::BW, 0, 0) == Approx(2.5e-3));  // B + W
  CHECK_FALSE(profile_seconds(p, ir::OpKind::OPT, 0, 0));
  CHECK(p.p2p.seconds(2e6) == Approx(20e-6 + 1e-3));
}

TEST_CASE("Profile JSON and file round trip - bad profiles are rejected", "[traces][profile]") {
  const Profile p = sample();
  REQUIRE(profile_from_json(to_json(p), "mem") == p);
  const std::string path = (std::filesystem::temp_directory_path() / "tdpipe_test_profile_roundtrip.json").string();
  write_profile(p, path);
  REQUIRE(read_profile(path) == p);
  std::remove(path.c_str());
  REQUIRE_THROWS_WITH(read_profile("/nonexistent/p.json"),
                      "cannot read profile '/nonexistent/p.json': no such file");

  nlohmann::json j = to_json(p);
  j.erase("tdpipe_profile");
  REQUIRE_THROWS_WITH(profile_from_json(j, "p.json"), Catch::Contains("p.json: tdpipe_profile: missing"));
  j = to_json(p);
  j["ops"][1]["kind"] = "SEND";
  REQUIRE_THROWS_WITH(profile_from_json(j, "p.json"),
                      Catch::Contains("p.json: ops[1].kind: expected F, B, W, BW or OPT, got \"SEND\""));
  j = to_json(p);
  j["ops"][0]["seconds"] = -1;
  REQUIRE_THROWS_WITH(profile_from_json(j, "p.json"), Catch::Contains("ops[0].seconds: expected a number ≥ 0"));
  j = to_json(p);
  j["p2p"]["bandwidth"] = "fast";
  REQUIRE_THROWS_WITH(profile_from_json(j, "p.json"), Catch::Contains("p2p.bandwidth: expected a number"));
  j = to_json(p);
  j["platform"]["cores"] = 1.5;
  REQUIRE_THROWS_WITH(profile_from_json(j, "p.json"), Catch::Contains("platform.cores: expected an integer"));
}

TEST_CASE("profile fields outside what a measurement can be are rejected", "[traces][profile]") {
  const nlohmann::json good = to_json(sample());
  REQUIRE_NOTHROW(profile_from_json(good, "p.json"));
  struct Case {
    nlohmann::json::json_pointer at;
    nlohmann::json value;
    std::string message;
  };
  using ptr = nlohmann::json::json_pointer;
  const std::vector<Case> cases = {
      {ptr("/ops/0/virtual_stage"), -2, "p.json: ops[0].virtual_stage: expected an integer in [-1, 1048576], got -2"},
      {ptr("/ops/0/slice"), -5, "p.json: ops[0].slice: expected an integer in [-1, 1048576], got -5"},
      {ptr("/ops/0/layers"), -1, "p.json: ops[0].layers: expected an integer in [0, 1048576], got -1"},
      {ptr("/ops/0/samples"), -1, "p.json: ops[0].samples: expected an integer in [0, 1048576], got -1"},
      {ptr("/ops/0/seconds"), 1e300, "p.json: ops[0].seconds: expected a number ≥ 0 and ≤ 86400, got 1e+300"},
      {ptr("/stages"), 0, "p.json: stages: expected an integer in [1, 1048576], got 0"},
      {ptr("/p2p/latency"), 1e9, "p.json: p2p.latency: expected a number ≥ 0 and ≤ 3600, got 1000000000.0"},
      {ptr("/platform/threads_per_rank"), 0, "p.json: platform.threads_per_rank: expected an integer in [1, 1048576]"},
      {ptr("/speed"), "fast", "p.json: speed: unknown key; known keys: tdpipe_profile, scenario, stages"},
      {ptr("/ops/1/secs"), 1.0, "p.json: ops[1].secs: unknown key; known keys: kind, virtual_stage"},
      {ptr("/platform/gpu"), "x", "p.json: platform.gpu: unknown key"},
      {ptr("/p2p/bw"), 1.0, "p.json: p2p.bw: unknown key; known keys: latency, bandwidth"},
  };
  for (const auto& c : cases) {
    nlohmann::json j = good;
    j[c.at] = c.value;
    INFO(c.message);
    REQUIRE_THROWS_WITH(profile_from_json(j, "p.json"), Catch::StartsWith(c.message));
  }
  // A profile without stages (unknown) is written without the key and read back as 0.
  Profile unknown = sample();
  unknown.stages = 0;
  CHECK_FALSE(to_json(unknown).contains("stages"));
  CHECK(profile_from_json(to_json(unknown), "p.json") == unknown);

  const std::string path = (std::filesystem::temp_directory_path() / "tdpipe_test_profile_dup.json").string();
  std::ofstream(path) << R"({"tdpipe_profile": 1, "stages": 2, "stages": 4})";
  CHECK_THROWS_WITH(read_profile(path), path + ": top level: key \"stages\" given twice; expected each key once");
  std::remove(path.c_str());
}

TEST_CASE("a profile of another stage partition is refused - the same one applies", "[traces][profile]") {
  // 4 layers on 2 stages: the profile measured 2 + 2; a plan of 1 + 3 must not take it.
  ir::Plan plan = two_stage_plan();
  Profile p = sample();
  p.ops = {{ir::OpKind::F, 0, -1, 2, 1e-3, 10}, {ir::OpKind::F, 1, -1, 2, 2e-3, 10}};
  ir::Plan even = plan;
  CHECK(apply_profile(p, even, true).ops_from_profile == 2);
  CHECK(even.ranks[1][0].est_seconds == Approx(2e-3));
  plan.stage_layers = {1, 3};
  CHECK_THROWS_WITH(apply_profile(p, plan, true),
                    "profile was measured with 2 layers on virtual stage 0, the plan puts 1 there "
                    "(parallel.layers_per_stage); calibrate with this partition first");
}

TEST_CASE("a profile of other slice cuts is refused for a plan with as many slices", "[traces][profile]") {
  ir::Plan plan;
  plan.schedule = "tdpipe";
  plan.stages = 2;
  plan.microbatches = 1;
  plan.slices = 2;
  plan.stage_of = {{0}, {1}};
  plan.scenario.name = "tiny-gpt-cpu";
  plan.scenario.model.layers = 4;
  plan.slice_tokens = {40, 24};
  Profile p = sample();
  p.metadata["slice_tokens"] = "40,24";
  ir::Plan same = plan;
  CHECK_NOTHROW(apply_profile(p, same, true));
  plan.slice_tokens = {36, 28};
  CHECK_THROWS_WITH(apply_profile(p, plan, true), "profile was measured with slices of [40,24] tokens, the plan "
                                                  "cuts [36,28]; calibrate with these slices first (same --slices)");
  plan.slices = 3;  // another S: matched by slice index as before
  plan.slice_tokens = {30, 20, 14};
  CHECK_NOTHROW(apply_profile(p, plan, true));
}

TEST_CASE("a software stack's profile (calibrate --from-run) round-trips and applies to scenarios on its GPUs only",
          "[traces][profile][from-run]") {
  Profile p;
  p.compute_efficiency = 0.87;
  p.platform.backend = "from-run";
  p.platform.device = "a100-80g,h100-80g";
  const Profile back = profile_from_json(to_json(p), "stack.json");
  CHECK(back == p);
  ir::Scenario sc;
  sc.name = "other";
  ir::GpuSpec a100, h100, h200;
  a100.name = "a100-80g", h100.name = "h100-80g", h200.name = "h200";
  sc.cluster.groups = {{a100, 2}, {h100, 1}};
  apply_profile_to_scenario(p, sc);
  CHECK(sc.cluster.compute_efficiency == 0.87);
  sc.cluster.groups.push_back({h200, 1});
  sc.cluster.compute_efficiency = 1;
  // Part of a mixed cluster fitted: one efficiency holds for all of it, so it is refused.
  CHECK_THROWS_WITH(apply_profile_to_scenario(p, sc),
                    Catch::Contains("fitted on a100-80g,h100-80g GPUs, but scenario 'other' also has h200") &&
                        Catch::Contains("cannot price a mixed one"));
  CHECK(sc.cluster.compute_efficiency == 1);
  sc.cluster.groups = {{h200, 2}};
  CHECK_THROWS_WITH(apply_profile_to_scenario(p, sc), Catch::Contains("calibrate from a run on h200"));
  // A measured op profile leaves the scenario alone.
  Profile ops = sample();
  apply_profile_to_scenario(ops, sc);
  CHECK(sc.cluster.compute_efficiency == 1);
  // Out of range in a file: named.
  nlohmann::json j = to_json(p);
  j["compute_efficiency"] = 0.001;
  CHECK_THROWS_WITH(profile_from_json(j, "stack.json"), Catch::Contains("compute_efficiency"));
  j["compute_efficiency"] = 500;
  CHECK_THROWS_WITH(profile_from_json(j, "stack.json"), Catch::Contains("compute_efficiency"));
}

TEST_CASE("a one-layout profile is refused for another layout, kept for another schedule of it", "[traces][profile]") {
  ir::Plan plan = two_stage_plan();
  Profile p = sample();
  p.ops = {{ir::OpKind::F, 0, -1, 0, 1e-3, 10}, {ir::OpKind::F, 1, -1, 0, 2e-3, 10}};
  p.metadata["schedule"] = "zb-h1";  // the same layout (v = 1, S = 1): B and W serve 1f1b's BW
  p.metadata["chunks"] = "1";
  p.metadata["slices"] = "1";
  ir::Plan same = plan;
  CHECK(apply_profile(p, same, true).ops_from_profile == 2);
  p.metadata["schedule"] = "zb-v";  // two chunks per rank: each op held half the layers
  p.metadata["chunks"] = "2";
  CHECK_THROWS_WITH(apply_profile(p, plan, true),
                    Catch::Contains("profile measured one layout (zb-v schedule, 2 chunks); the plan has 1 chunks") &&
                        Catch::Contains("calibrate without --schedule"));
  p.metadata["chunks"] = "1";
  p.metadata["slices"] = "4";
  CHECK_THROWS_WITH(apply_profile(p, plan, true), Catch::Contains("4 slices); the plan has 1 slices"));
}
