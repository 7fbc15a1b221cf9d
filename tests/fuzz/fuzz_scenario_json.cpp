// fuzz_scenario_json.cpp — strict JSON (ir::parse_json) into the scenario reader and checks.
#include "fuzz_common.hpp"
#include "tdpipe/ir/json_read.hpp"
#include "tdpipe/ir/scenario_io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return tdpipe::fuzz::run(data, size, [](std::string_view text) {
    tdpipe::ir::scenario_from_json(tdpipe::ir::parse_json(text, "fuzz.json"));
  });
}
