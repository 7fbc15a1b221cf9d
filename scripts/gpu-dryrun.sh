#!/usr/bin/env bash
# gpu-dryrun.sh — builds the `gpu` preset on this (GPU-less) machine as the GPU machine
# would: in a private mount namespace that hides the Debian -dev packages (yaml-cpp,
# fmt, nlohmann, CLI11, Eigen, Catch2, SimGrid, Qt, OpenMPI, their CMake and pkg-config
# files) and moves NCCL out of the CUDA toolkit into a PyTorch-wheel layout
# (site-packages/nvidia/nccl with only libnccl.so.2), so only CUDA + .carry/ remain.
# Then runs the CPU-side tests of that build, scripts/gpu-check.sh, which must stop
# with "no GPU here" (exit 77), and gpu-check.sh's rehearsal with the CPU backend,
# whose every step must print its figures. Catches a missing carried header or CMake file without
# spending device time. Needs root (unshare -m); writes build/gpu-dryrun.
#
#   scripts/gpu-dryrun.sh            (after scripts/gpu-carry.sh)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[ "$(id -u)" = 0 ] || { echo "gpu-dryrun: needs root for unshare -m" >&2; exit 2; }
[ -d "$root/.carry/share/cmake" ] || { echo "gpu-dryrun: run scripts/gpu-carry.sh first" >&2; exit 2; }
if [ "${1:-}" != "--inside" ]; then
  exec unshare -m --propagation private "$0" --inside
fi

hide() { for d in "$@"; do [ -e "$d" ] && mount -t tmpfs none "$d"; done; return 0; }
hide /usr/include/nlohmann /usr/include/CLI /usr/include/fmt /usr/include/catch2 \
     /usr/include/eigen3 /usr/include/yaml-cpp /usr/include/simgrid /usr/include/xbt \
     /usr/include/x86_64-linux-gnu/qt6 /usr/lib/x86_64-linux-gnu/openmpi \
     /usr/lib/x86_64-linux-gnu/cmake /usr/lib/cmake /usr/share/cmake \
     /usr/lib/x86_64-linux-gnu/pkgconfig /usr/share/pkgconfig
for tool in mpicc mpicxx mpiexec mpirun; do
  [ -e "/usr/bin/$tool" ] && mount --bind /bin/false "/usr/bin/$tool"
done
# NCCL: out of the toolkit, into a wheel-like folder found through Python.
# Hard-linked copies (same file system, no symlink loops) of the toolkit's include/ and
# lib64/ without NCCL are mounted over the originals.
fake="$root/build/gpu-dryrun-fake"  # a fixed path keeps compile commands (and ccache hits) stable
rm -rf "$fake"; mkdir -p "$fake"
inc=$(readlink -f /usr/local/cuda/include); lib=$(readlink -f /usr/local/cuda/lib64)
mkdir -p "$fake/site/nvidia/nccl/include" "$fake/site/nvidia/nccl/lib"
cp -al "$inc" "$fake/inc"; cp -al "$lib" "$fake/lib"
mv "$fake"/inc/nccl* "$fake/site/nvidia/nccl/include/"
rm -f "$fake"/lib/libnccl*
ln "$lib/libnccl.so.2" "$fake/site/nvidia/nccl/lib/libnccl.so.2"
mount --bind "$fake/inc" "$inc"
mount --bind "$fake/lib" "$lib"
trap 'rm -rf "$fake"' EXIT
export PYTHONPATH="$fake/site"

cd "$root"
build=build/gpu-dryrun
rm -rf "$build"
# The preset's own settings, into a build dir of its own.
cmake --preset gpu -B "$build" > "$build.configure.log" 2>&1 || { tail -40 "$build.configure.log"; exit 1; }
grep -E "NCCL|not built|WARNING" "$build.configure.log" || true
cmake --build "$build" -j "$(nproc)" --target tdpipe test_exec_cuda test_exec_cuda_gpu bench_cuda_layer
"$build/tests/test_exec_cuda"
echo "gpu-dryrun: build and CPU tests OK; gpu-check.sh without a GPU:"
set +e
scripts/gpu-check.sh /tmp/gpu-dryrun-out; rc=$?
echo "gpu-check.sh exit $rc (77 = no GPU, as expected here)"
[ "$rc" = 77 ] || exit 1
echo "gpu-dryrun: gpu-check.sh rehearsed with the CPU backend on this build:"
GPU_CHECK_BACKEND=cpu GPU_CHECK_BUILD="$build" scripts/gpu-check.sh /tmp/gpu-dryrun-rehearsal
summary=/tmp/gpu-dryrun-rehearsal/summary.txt
if grep -qE "no result|no comparison|failed" "$summary" || ! grep -q "median |iteration-time error|" "$summary"; then
  echo "gpu-dryrun: the rehearsal left a step without its figures (see $summary)"; exit 1
fi
echo "gpu-dryrun: OK"
