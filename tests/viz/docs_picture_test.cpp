// docs_picture_test.cpp — not a test: writes the synthetic traces behind
// docs/viewer.png (1F1B, p = 4, m = 8, predicted vs a jittered "measured" run).
// Hidden from ctest; run `test_viz "[.docs]"` with TDPIPE_VIZ_DOCS_DIR set, then
// `tdpipe-view --render docs/viewer.png DIR/predicted.json DIR/measured.json`.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "synthetic.hpp"
#include "tdpipe/traces/chrome_json.hpp"
#include "tdpipe/traces/trace_io.hpp"

TEST_CASE("write the synthetic traces for docs/viewer.png", "[.docs]") {
  const char* dir = std::getenv("TDPIPE_VIZ_DOCS_DIR");
  REQUIRE(dir != nullptr);
  tdpipe::viz::testing::OneFOneB c;
  c.p = 4;
  c.m = 8;
  tdpipe::traces::write_trace(tdpipe::viz::testing::make_1f1b(c), std::string(dir) + "/predicted.json");
  c.seed = 2026;
  c.jitter = 0.12;
  tdpipe::traces::write_trace(tdpipe::viz::testing::make_1f1b(c), std::string(dir) + "/measured.json");
}
