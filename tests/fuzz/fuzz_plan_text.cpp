// fuzz_plan_text.cpp — the plan's text form (ir::plan_from_text) and the validator.
#include "fuzz_common.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "tdpipe/ir/validate.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return tdpipe::fuzz::run(data, size, [](std::string_view text) {
    tdpipe::ir::validate(tdpipe::ir::plan_from_text(text));
  });
}
