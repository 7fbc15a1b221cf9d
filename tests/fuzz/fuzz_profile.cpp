// fuzz_profile.cpp — a calibration profile (traces::profile_from_json).
#include "fuzz_common.hpp"
#include "tdpipe/ir/json_read.hpp"
#include "tdpipe/traces/profile.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return tdpipe::fuzz::run(data, size, [](std::string_view text) {
    tdpipe::traces::profile_from_json(tdpipe::ir::parse_json(text, "fuzz.json"), "fuzz.json");
  });
}
