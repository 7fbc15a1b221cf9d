// fuzz_scenario_yaml.cpp — the YAML scenario reader and its checks (ir::parse_scenario).
#include "fuzz_common.hpp"
#include "tdpipe/ir/scenario_io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return tdpipe::fuzz::run(data, size, [](std::string_view text) { tdpipe::ir::parse_scenario(text, "fuzz.yaml"); });
}
