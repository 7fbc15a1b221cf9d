// closest.hpp — the known name a mistyped one most likely meant ("did you mean"), for
// scenario keys and values and for the command line.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tdpipe::ir {

/// The known name closest to `word`, if it is close enough to be a likely typo: the first
/// known name `word` begins ("a100" → "a100-80g") first, else the least case-insensitive
/// edit distance, at most max(2, |word| / 3).
std::optional<std::string> closest(std::string_view word, const std::vector<std::string>& known);

}  // namespace tdpipe::ir
