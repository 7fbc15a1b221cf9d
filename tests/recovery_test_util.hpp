// recovery_test_util.hpp — what the fault and checkpoint tests of every backend share:
// a fresh temporary folder, and the bit-for-bit comparison with a clean run.
#pragma once

#include <filesystem>
#include <string>
#include <system_error>

#include <unistd.h>

#include <catch2/catch.hpp>

#include "tdpipe/exec/cpu/run.hpp"

namespace tdpipe::test {

struct TempDir {
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tdpipe-test-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path;
};

/// The proof of a recovery: the same losses, weights, Adam moments, step count and loss
/// scaler as the run without the fault, bit for bit.
inline void require_identical(const exec::cpu::RunResult& got, const exec::cpu::RunResult& want) {
  REQUIRE(got.loss_per_step == want.loss_per_step);
  REQUIRE(got.weights == want.weights);
  REQUIRE(got.state.m1 == want.state.m1);
  REQUIRE(got.state.m2 == want.state.m2);
  REQUIRE(got.state.steps_done == want.state.steps_done);
  REQUIRE(got.state.loss_scale == want.state.loss_scale);
}

}  // namespace tdpipe::test
