// nsys.hpp — a measured trace from an Nsight Systems report exported to SQLite.
#pragma once

#include <string>

#include "tdpipe/traces/trace.hpp"

namespace tdpipe::traces {

/// Whether a file's first bytes are SQLite's header.
bool is_sqlite_file(const std::string& head);

/// The NVTX ranges named like tdpipe ops in `path` (`nsys export --type sqlite`), one
/// rank per process in ascending process id. Throws tdpipe::Error naming the file.
Trace trace_from_nsys_sqlite(const std::string& path);

}  // namespace tdpipe::traces
