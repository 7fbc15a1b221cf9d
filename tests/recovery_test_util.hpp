// temp_dir.hpp — a fresh, empty folder under the temp dir for one test, removed with the
// object (checkpoint tests).
#pragma once

#include <filesystem>
#include <string>
#include <system_error>

#include <unistd.h>

#include <catch2/catch.hpp>

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

}  // namespace tdpipe::test
