// fuzz_requests_json.cpp — a serving requests file (ir::parse_requests).
#include "fuzz_common.hpp"
#include "tdpipe/ir/serving.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return tdpipe::fuzz::run(data, size, [](std::string_view text) {
    tdpipe::ir::parse_requests(std::string(text), "fuzz.json");
  });
}
