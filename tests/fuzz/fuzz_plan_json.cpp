// fuzz_plan_json.cpp — a plan file (ir::plan_from_json) and the validator over what it read.
#include "fuzz_common.hpp"
#include "tdpipe/ir/json_read.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "tdpipe/ir/validate.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return tdpipe::fuzz::run(data, size, [](std::string_view text) {
    tdpipe::ir::validate(tdpipe::ir::plan_from_json(tdpipe::ir::parse_json(text, "fuzz.json")));
  });
}
