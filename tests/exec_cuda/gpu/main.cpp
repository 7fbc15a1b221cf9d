// main.cpp — runs the GPU tests, or exits 77 (ctest's SKIP_RETURN_CODE) with a
// visible message when this machine has no usable CUDA GPU. Listing tests (what
// catch_discover_tests does at build time) never touches the GPU.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string_view>

#include <cuda_runtime.h>

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a.rfind("--list", 0) == 0 || a == "-l" || a == "-h" || a == "--help") listing = true;
  }
  if (!listing) {
    int devices = 0;
    cudaError_t status = cudaGetDeviceCount(&devices);
    if (status != cudaSuccess || devices == 0) {
      std::printf("SKIPPED: no CUDA GPU on this machine (%s) — GPU tests need one\n",
                  status != cudaSuccess ? cudaGetErrorString(status) : "0 devices");
      return 77;
    }
  }
  return Catch::Session().run(argc, argv);
}
