#!/usr/bin/env bash
# install-deps.sh — installs every Debian 12 package tdpipe needs to build and test.
# Idempotent: when everything is present it prints nothing and exits 0.
#   --fuzz   also clang-16 and its runtime (libFuzzer) for the `fuzz` preset / bench/fuzz.sh
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config python3
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libfmt-dev catch2
  libeigen3-dev libsimgrid-dev libopenmpi-dev openmpi-bin libboost-context-dev
  qt6-base-dev qt6-charts-dev libqt6opengl6-dev qt6-svg-dev libxkbcommon-dev
  libgl-dev libvulkan-dev xvfb zlib1g-dev
)
for arg in "$@"; do
  case "$arg" in
    --fuzz) packages+=(clang-16 libclang-rt-16-dev) ;;
    *) echo "install-deps: unknown option $arg (expected --fuzz)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
