// error.hpp — the one exception type that crosses tdpipe's module boundaries.
#pragma once

#include <stdexcept>
#include <string>

namespace tdpipe {

/// An error a user can act on: the message names the file, line, field or ops
/// involved and what was expected.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace tdpipe
