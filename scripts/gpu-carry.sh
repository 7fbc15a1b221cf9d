#!/usr/bin/env bash
# gpu-carry.sh — fills .carry/ (git-ignored) with what the `gpu` preset needs and the
# GPU machine lacks (it has CUDA, cmake, ninja and PyTorch but no -dev packages and
# no network): the header-only libraries from this machine's /usr/include —
# nlohmann-json, CLI11, Eigen, fmt (used header-only: FMT_HEADER_ONLY), Catch2 v2 —
# and a minimal CMake package config for each, so find_package() works unchanged.
# yaml-cpp is not header-only: the gpu preset builds with TDPIPE_WITH_YAML=OFF and
# reads JSON scenarios. Run it here, then pass carry: [".carry"] to the device run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
carry="$root/.carry"
rm -rf "$carry"
mkdir -p "$carry/include" "$carry/share/cmake"

for d in nlohmann CLI fmt catch2 eigen3; do
  [ -d "/usr/include/$d" ] || { echo "gpu-carry: /usr/include/$d missing (run scripts/install-deps.sh)" >&2; exit 1; }
  cp -r "/usr/include/$d" "$carry/include/"
done
# Eigen's unsupported/ and docs are not needed.
rm -rf "$carry/include/eigen3/unsupported"

version_file() {  # name version
  cat > "$carry/share/cmake/$1/$1ConfigVersion.cmake" <<CMAKE
set(PACKAGE_VERSION "$2")
if(PACKAGE_FIND_VERSION AND PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
CMAKE
}
config() {  # name target include-subdir [compile-definition]
  mkdir -p "$carry/share/cmake/$1"
  cat > "$carry/share/cmake/$1/$1Config.cmake" <<CMAKE
# Written by scripts/gpu-carry.sh: header-only $1 carried to the GPU machine.
get_filename_component(_carry "\${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET $2)
  add_library($2 INTERFACE IMPORTED)
  set_target_properties($2 PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "\${_carry}/include$3")
CMAKE
  if [ -n "${4:-}" ]; then
    echo "  set_target_properties($2 PROPERTIES INTERFACE_COMPILE_DEFINITIONS \"$4\")" >> "$carry/share/cmake/$1/$1Config.cmake"
  fi
  echo "endif()" >> "$carry/share/cmake/$1/$1Config.cmake"
}
config nlohmann_json nlohmann_json::nlohmann_json ""
version_file nlohmann_json 3.11.2
config CLI11 CLI11::CLI11 ""
version_file CLI11 2.1.2
config fmt fmt::fmt "" FMT_HEADER_ONLY=1
version_file fmt 9.1.0
config Eigen3 Eigen3::Eigen /eigen3
version_file Eigen3 3.4.0
config Catch2 Catch2::Catch2 ""
version_file Catch2 2.13.10
# `include(Catch)` (catch_discover_tests) comes with Catch2's own CMake scripts.
cp /usr/lib/cmake/Catch2/Catch.cmake /usr/lib/cmake/Catch2/CatchAddTests.cmake "$carry/share/cmake/Catch2/"
echo 'list(APPEND CMAKE_MODULE_PATH "${CMAKE_CURRENT_LIST_DIR}")' >> "$carry/share/cmake/Catch2/Catch2Config.cmake"

echo "gpu-carry: $(du -sh "$carry" | cut -f1) in $carry (pass carry: [\".carry\"] to the device run)"
