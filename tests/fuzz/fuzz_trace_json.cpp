// fuzz_trace_json.cpp — a Chrome/Perfetto trace (traces::trace_from_chrome_json), then the
// metrics and the comparison of it with itself, as `tdpipe compare` and the viewer use it.
#include "fuzz_common.hpp"
#include "tdpipe/ir/json_read.hpp"
#include "tdpipe/traces/chrome_json.hpp"
#include "tdpipe/traces/compare.hpp"
#include "tdpipe/traces/metrics.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return tdpipe::fuzz::run(data, size, [](std::string_view text) {
    const auto t = tdpipe::traces::trace_from_chrome_json(tdpipe::ir::parse_json(text, "fuzz.json"), "fuzz.json");
    tdpipe::traces::compute_metrics(t);
    tdpipe::traces::compare(t, t);
  });
}
