// chrome_json.hpp — Trace ⇄ Chrome Trace Event JSON (opens in Perfetto).
//
// One pid per rank, one tid per stream, `M` events naming them, `X` events with
// ts/dur in µs and the op's fields in `args`; run metadata under "otherData".
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "tdpipe/traces/trace.hpp"

namespace tdpipe::traces {

nlohmann::json to_chrome_json(const Trace& trace);
/// Reads tdpipe traces and any Chrome trace with `X` events; throws tdpipe::Error
/// naming `source` and the offending event/field.
Trace trace_from_chrome_json(const nlohmann::json& j, const std::string& source);

/// Writes `trace` to `path` as Chrome JSON, atomically (trace_io.hpp's write_trace picks
/// the format).
void write_chrome_trace(const Trace& trace, const std::string& path);

}  // namespace tdpipe::traces
