// fuzz_common.hpp — what every libFuzzer target here does with an input: run one reader
// and accept a tdpipe::Error (a clear refusal) as the only way to fail. Anything else —
// another exception, a crash, a sanitizer report, a hang — is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>

#include "tdpipe/ir/error.hpp"

namespace tdpipe::fuzz {

template <class F>
int run(const std::uint8_t* data, std::size_t size, F&& reader) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    reader(text);
  } catch (const tdpipe::Error&) {
    // refused with a message: what bad input must get
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: a reader threw a non-tdpipe exception: %s\n", e.what());
    std::abort();
  }
  return 0;
}

}  // namespace tdpipe::fuzz
