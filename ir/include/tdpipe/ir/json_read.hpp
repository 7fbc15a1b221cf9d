// json_read.hpp — strict JSON input for every tdpipe file (scenarios, plans, traces,
// profiles): bounded nesting, no duplicate keys, errors that name the file and quote
// at most a short excerpt of the value.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace tdpipe::ir {

/// Deepest nesting of arrays and objects a tdpipe file may have (its own files need 6).
inline constexpr int kMaxJsonDepth = 64;

/// Parses `text`; throws tdpipe::Error "SOURCE: …" on a syntax error, on nesting deeper
/// than kMaxJsonDepth and on a key given twice in one object (naming the key and the
/// object's path), where nlohmann would silently keep the last value.
nlohmann::json parse_json(std::string_view text, const std::string& source);

/// Reads a whole regular file; throws tdpipe::Error naming `what` and the OS's reason.
std::string read_file(const std::string& path, std::string_view what);

/// A value as an error message quotes it: numbers, booleans and null as written,
/// strings up to 60 characters, arrays and objects by their size only.
std::string quote_json(const nlohmann::json& value);

}  // namespace tdpipe::ir
