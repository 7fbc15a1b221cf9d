// atomic_file.hpp — how tdpipe writes every output: all of it or nothing.
#pragma once

#include <string>
#include <string_view>

namespace tdpipe::ir {

/// Writes `data` to `path` so that `path` either keeps what it had or holds all of
/// `data`: a temporary file in the same folder, every write checked, fsync, close
/// checked, rename over `path`. A path that exists and is not a regular file (a
/// device such as /dev/stdout or /dev/full, a FIFO) is written in place, every write
/// checked. Throws tdpipe::Error naming `what`, the path and the system's reason.
void write_file_atomic(const std::string& path, std::string_view data, std::string_view what);

/// Flushes standard output (C and C++ streams) and throws tdpipe::Error when anything
/// written to it was lost (a full disk, a closed pipe), so no command exits 0 with its
/// output gone.
void finish_stdout();

}  // namespace tdpipe::ir
