// trace_io.hpp — reading and writing traces in every format tdpipe knows.
#pragma once

#include <string>

#include "tdpipe/traces/trace.hpp"

namespace tdpipe::traces {

/// Reads a trace from
///  - a Chrome/Perfetto JSON file (tdpipe's own, or any Chrome trace with `X` events),
///  - a Kineto JSON file (PyTorch profiler; `.json` or gzip-compressed `.json.gz`),
///  - a folder of Kineto files, one per rank (tdpipe's --trace-format kineto, or
///    torch.profiler's per-rank exports),
///  - an Nsight Systems SQLite export (NVTX ranges named like tdpipe ops).
/// Throws tdpipe::Error naming the file and what was expected.
Trace read_trace(const std::string& path);

enum class TraceFormat {
  Chrome,  ///< one Chrome/Perfetto JSON file
  Kineto,  ///< a folder, one Kineto JSON file per rank (HTA reads it)
};
/// "chrome" or "kineto"; throws tdpipe::Error naming the accepted values otherwise.
TraceFormat trace_format_from_string(const std::string& name);

/// Writes `trace` to `path` atomically: a file (Chrome) or a folder of per-rank files
/// (Kineto).
void write_trace(const Trace& trace, const std::string& path, TraceFormat format = TraceFormat::Chrome);

}  // namespace tdpipe::traces
