// planner_test_util.hpp — shared helpers of the planner tests.
#pragma once

#include <string>

namespace tdpipe::planner::test {

/// A shipped scenario file by name ("gpt3-175b-a100-8x8.yaml").
inline std::string scenario_path(const std::string& name) {
  return std::string(TDPIPE_SOURCE_DIR) + "/scenarios/" + name;
}

}  // namespace tdpipe::planner::test
