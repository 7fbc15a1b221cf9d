// text.hpp — small text helpers for command-line and file fields.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace tdpipe::ir {

/// The comma-separated items of `text`, empty ones kept ("" → {""}, "a,,b" → {"a", "", "b"}),
/// so that a caller can name the empty item it refuses.
inline std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  for (std::size_t at = 0; at <= text.size();) {
    const std::size_t end = std::min(text.find(',', at), text.size());
    out.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

}  // namespace tdpipe::ir
