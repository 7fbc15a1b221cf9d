// test_profile.cpp — calibration profiles: lookup by specificity, JSON round trip, errors.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>

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
  REQUIRE_THROWS_WITH(read_profile("/nonexistent/p.json"), Catch::Contains("cannot read profile '/nonexistent/p.json'"));

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
