#!/usr/bin/env bash
# install-deps.sh — installs every Debian 12 package tdpipe needs to build and test.
# Idempotent: when everything is present it prints nothing and exits 0.
#   --fuzz    also clang-16 and its runtime (libFuzzer) for the `fuzz` preset / bench/fuzz.sh
#   --python  also a Python virtual environment in .venv/ with Holistic Trace Analysis
#             (from PyPI, versions pinned below), which the test cli.trace-hta runs on
#             tdpipe's Kineto traces; without it that test reports itself skipped
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build ccache pkg-config python3
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libfmt-dev catch2
  libeigen3-dev libsimgrid-dev libopenmpi-dev openmpi-bin libboost-context-dev
  qt6-base-dev qt6-charts-dev libqt6opengl6-dev qt6-svg-dev libxkbcommon-dev
  libgl-dev libvulkan-dev xvfb zlib1g-dev libsqlite3-dev
)
python_env=0
for arg in "$@"; do
  case "$arg" in
    --fuzz) packages+=(clang-16 libclang-rt-16-dev) ;;
    --python) python_env=1; packages+=(python3-venv) ;;
    *) echo "install-deps: unknown option $arg (expected --fuzz or --python)" >&2; exit 2 ;;
  esac
done

# HTA and what it imports (its wheel also asks for jupyterlab and pytest, which its
# analyses do not import: installed without them).
install_python_env() {
  [ "$python_env" = 1 ] || return 0
  if [ -x .venv/bin/python ] && .venv/bin/python -c "import hta.trace_analysis" 2>/dev/null; then return 0; fi
  echo "install-deps: Python environment .venv/ with Holistic Trace Analysis" >&2
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check numpy==2.4.6 pandas==3.1.1 plotly==7.1.0 \
    networkx==3.6.1 pydot==4.0.1 PyYAML==6.0.4 psutil==7.2.2
  # (pip then reports the two requirements left out as conflicts: not shown.)
  local log
  if ! log=$(.venv/bin/pip install -q --disable-pip-version-check --no-deps holistictraceanalysis==0.5.0 2>&1); then
    echo "$log" >&2
    return 1
  fi
  .venv/bin/python -c "import hta.trace_analysis"
}

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  install_python_env
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
install_python_env
