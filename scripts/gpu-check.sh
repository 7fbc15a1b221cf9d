#!/usr/bin/env bash
# gpu-check.sh — the CUDA backend's check on a GPU machine (issue 5), ≤ 8 minutes on
# one H200. Prepared on a machine without a GPU; run it from the repository root on
# the GPU machine, after `scripts/gpu-carry.sh` ran on the dev machine and .carry/
# travelled with the tree (device tool: carry: [".carry"]):
#
#   scripts/gpu-check.sh [OUT_DIR]        (default: /tmp/gpu-check)
#
#  1. builds the `gpu` preset (CUDA toolkit + carried header-only libraries, no yaml-cpp);
#  2. CUDA vs CPU backend on the tiny scenario — 1f1b, zb-h1, tdpipe S=4, 4 stages,
#     loopback transport (GPU ctest cases; tolerances justified in
#     tests/exec_cuda/gpu/test_gpu_equivalence.cpp), plus `tdpipe exec --check` figures;
#  3. one decoder block's F, B, W (fused attention) at a GPT-3 175B per-tensor-shard width
#     (h = 12288 / t 8 = 1536, 12 heads of 128, ffn 4h, seq 2048) and a Llama-2 70B-like one
#     (h = 8192 / t 8 = 1024, 8 heads of 128, ffn 28672 / 8 = 3584, seq 4096) vs PyTorch
#     eager with materialised attention (goal: ratio ≤ 1.0) and with
#     F.scaled_dot_product_attention (goal ≤ 1.3);
#  4. a 4-stage pipeline of each main schedule on the loopback transport: measured
#     traces, `tdpipe calibrate --backend cuda`, `tdpipe sim --engine analytic --profile`
#     (SimGrid is not there) and `tdpipe compare` (median iteration-time error printed; goal ≤ 5 %),
#     and the executor's per-op host overhead from the measured traces
#     (scripts/trace-gaps.py: gaps between dependent ops on one stream; goal ≤ 5 µs median);
#     zb-h1 with CUDA graphs per op (--cuda-graphs on) against off, iteration times side
#     by side and the gaps of both traces.
# Everything lands in OUT_DIR (traces/, profiles/, *.json, *.log, summary.txt). Where
# $OUT is set (the device tool, which returns at most 8 files from it), the script
# also leaves there summary.txt and gpu-check.tar.gz of OUT_DIR — on every exit, a
# failed build's logs included. Unpack it into traces/samples/h200/DATE/ to commit.
#
# Rehearsal without a GPU, on a built tree (no preset build, no PyTorch layer, a small
# step-4 model): GPU_CHECK_BUILD=build/DIR with GPU_CHECK_BACKEND=emulated runs every
# step with the CUDA backend itself on the emulated GPU (build/DIR/tests/tdpipe-emulated-gpu,
# tests/exec_cuda/emu; step 2's ctest runs the GPU suite there), or with
# GPU_CHECK_BACKEND=cpu with the CPU backend (scripts/gpu-dryrun.sh runs this one on its
# device-like build) — so a broken step shows here and not in the minutes of a GPU loan.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="${1:-/tmp/gpu-check}"
mkdir -p "$out/traces" "$out/profiles"
pack() {
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ] && [ "$(cd "$OUT" && pwd)" != "$(cd "$out" && pwd)" ]; then
    cp "$out/summary.txt" "$OUT/summary.txt" 2>/dev/null
    tar czf "$OUT/gpu-check.tar.gz" -C "$out" . 2>/dev/null
  fi
}
trap pack EXIT
t_start=$(date +%s)
step() { echo; echo "== [$(( $(date +%s) - t_start )) s] $*" | tee -a "$out/summary.txt"; }
say() { echo "$*" | tee -a "$out/summary.txt"; }
: > "$out/summary.txt"

backend="${GPU_CHECK_BACKEND:-cuda}"
if [ "$backend" = cuda ]; then
  if ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1; then
    say "gpu-check: no GPU here (nvidia-smi failed) — nothing to check"; exit 77
  fi
  say "GPU: $(head -1 "$out/gpu.txt")"
  [ -d .carry/share/cmake ] || { say "gpu-check: .carry/ missing: run scripts/gpu-carry.sh on the dev machine and carry it"; exit 2; }
  transport=(--transport loopback)
  run_backend=cuda
elif [ "$backend" = emulated ]; then
  say "gpu-check: rehearsal with the CUDA backend on the emulated GPU (no GPU work)"
  transport=(--transport loopback)
  run_backend=cuda
else
  say "gpu-check: rehearsal with the $backend backend (no GPU work)"
  transport=()
  run_backend=$backend
fi

# ---------------------------------------------------------------------- 1. build
step "1/4 build the gpu preset"
if [ "$backend" != cuda ]; then
  build="${GPU_CHECK_BUILD:?GPU_CHECK_BUILD=build dir for a rehearsal}"
  say "  rehearsal: using $build as built"
else
build=build/gpu
if ! cmake --preset gpu > "$out/configure.log" 2>&1; then tail -30 "$out/configure.log"; exit 1; fi
if grep -qE "CUDA backend is not built|no CUDA compiler found" "$out/configure.log"; then
  grep -E -A2 "CUDA backend is not built|no CUDA compiler found" "$out/configure.log" | tee -a "$out/summary.txt"; exit 1
fi
grep -E "exec/cuda: NCCL" "$out/configure.log" | tee -a "$out/summary.txt"
if ! cmake --build --preset gpu -j "$(nproc)" > "$out/build.log" 2>&1; then
  grep -E "error|Error" "$out/build.log" | head -30; exit 1
fi
say "built in $(( $(date +%s) - t_start )) s"
fi
tdp=$build/apps/tdpipe
if [ "$backend" = emulated ]; then
  tdp=$build/tests/tdpipe-emulated-gpu
  [ -x "$tdp" ] || { say "gpu-check: $tdp not built (needs the exec tests: ninja -C $build tdpipe-emulated-gpu)"; exit 2; }
fi

# ------------------------------------------------------------- 2. CUDA vs CPU
step "2/4 CUDA backend vs CPU backend (tiny scenario, 4 stages, loopback)"
# One process per test case (ctest), so an illegal memory access in one case cannot
# take the later ones down with it.
case "$backend" in
  cuda) ctest --test-dir "$build" -L gpu --output-on-failure --timeout 120 2>&1 | tee "$out/gpu_tests.log" | tail -25 ;;
  emulated) ctest --test-dir "$build" -R "^emulated-gpu:" --output-on-failure --timeout 300 2>&1 \
              | tee "$out/gpu_tests.log" | tail -25 ;;
esac
tiny=tests/exec_cuda/data/tiny-gpt-cpu.json
python3 - "$tiny" "$out/tiny-p4.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["name"] = "tiny-gpt-p4"
s["parallel"]["pipeline"] = 4
s["parallel"]["global_batch"] = 16          # m = 8 micro-batches of 2
s["cluster"]["gpus_per_node"] = 4
json.dump(s, open(sys.argv[2], "w"), indent=2)
PY
# Expected with bf16 GEMM inputs: loss ~1e-3 and gradients ~1e-2 relative; weights up to
# ~1e-1 — Adam moves every weight by ~lr per step whatever its gradient's size, so a tiny
# gradient whose sign bf16 flips moves it the other way. The GPU tests hold loss 1e-2 and
# gradients 3e-2 (tests/exec_cuda/gpu/test_gpu_equivalence.cpp).
[ "$run_backend" = cuda ] && say "  (bf16 expectation: loss ~1e-3, grads ~1e-2, weights up to ~1e-1 after Adam steps)"
for spec in "1f1b 1" "zb-h1 1" "tdpipe 4"; do
  set -- $spec
  "$tdp" exec "$out/tiny-p4.json" --backend "$run_backend" "${transport[@]}" --schedule "$1" --slices "$2" \
      --steps 3 --lr 1e-3 --check --json > "$out/check-$1-s$2.json" 2> "$out/check-$1-s$2.err" || cat "$out/check-$1-s$2.err"
  python3 - "$out/check-$1-s$2.json" "$1 S=$2" <<'PY' | tee -a "$out/summary.txt"
import json, sys
try:
    j = json.load(open(sys.argv[1])); r = j["reference"]
    print(f"  {sys.argv[2]:12s} losses {['%.5f' % x for x in j['loss_per_step']]}  vs fp64 reference: "
          f"loss {r['max_rel_loss_error']:.1e}, grads {r['max_rel_grad_error']:.1e}, weights {r['max_rel_weight_error']:.1e}")
except Exception as e:
    print(f"  {sys.argv[2]}: no result ({e})")
PY
done

# The load balancer in the training loop on the GPU (loopback): rank 1 at a quarter
# speed, segments of 3 steps, weights and Adam moments carried across the re-partition.
"$tdp" exec scenarios/tiny-gpt-cpu.yaml --backend "$run_backend" --rank-speed 1:0.25 --balance-every 3 --steps 9 \
    --json > "$out/balance.json" 2> "$out/balance.err" || tail -3 "$out/balance.err"
grep -E "^steps|re-balanced|staying with" "$out/balance.err" | sed 's/^/  balance: /' | tee -a "$out/summary.txt"

# --------------------------------------------------------- 3. one layer vs PyTorch
step "3/4 one decoder block F/B/W vs PyTorch eager and SDPA (GPT-3-like and Llama-like shards)"
if [ "$backend" = emulated ]; then
  # tdpipe's side at a size the emulation runs in seconds; PyTorch's side needs the GPU.
  if "$build"/tests/bench-cuda-layer-emulated-gpu --hidden 64 --heads 4 --ffn 256 --seq 64 --micro-batch 2 \
       --warmup 1 --iters 3 > "$out/layer_tdpipe.json" 2> "$out/layer_tdpipe.err"; then
    python3 - "$out/layer_tdpipe.json" <<'PY' | tee -a "$out/summary.txt"
import json, sys
j = json.load(open(sys.argv[1]))
print(f"  rehearsal: tdpipe F {j['f_ms']:.3f} ms, B {j['b_ms']:.3f} ms, W {j['w_ms']:.3f} ms on {j['device']} "
      f"(h={j['shape']['hidden']}); PyTorch's side skipped (needs the GPU)")
PY
  else
    say "  layer timing failed: $(tail -2 "$out/layer_tdpipe.err")"
  fi
elif [ "$backend" != cuda ]; then
  say "  rehearsal: skipped (needs the GPU and PyTorch)"
else
  for shape in "gpt3 1536 12 6144 2048 2" "llama 1024 8 3584 4096 1"; do
    set -- $shape
    if "$build"/bench/bench_cuda_layer --hidden "$2" --heads "$3" --ffn "$4" --seq "$5" --micro-batch "$6" \
         --warmup 5 --iters 20 > "$out/layer_tdpipe_$1.json" 2> "$out/layer_tdpipe_$1.err"; then
      timeout 120 python3 scripts/gpu-layer-vs-torch.py --tdpipe "$out/layer_tdpipe_$1.json" \
          --json-out "$out/layer_compare_$1.json" 2>&1 | tee -a "$out/summary.txt"
    else
      cat "$out/layer_tdpipe_$1.err" | tee -a "$out/summary.txt"
    fi
  done
fi

# ------------------------------------- 4. pipelines: measure, calibrate, predict, compare
step "4/4 4-stage pipelines on loopback: measured vs predicted"
scen="$out/gpu-pipe.json"
python3 - "$tiny" "$scen" "$backend" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
# Large enough that ops are GEMM-bound on an H200 (ms, not launch latency), small
# enough for 7 schedules × (run + calibration) in the time budget.
s["name"] = "gpu-check-gpt"
s["model"].update({"name": "gpu-check-gpt", "layers": 8, "hidden": 1024, "heads": 8, "ffn": 4096,
                   "seq": 1024, "vocab": 96, "dtype": "bf16"})
if sys.argv[3] != "cuda":  # rehearsal: the same layout at a size the CPU runs in seconds
    s["model"].update({"hidden": 32, "heads": 4, "ffn": 64, "seq": 32})
s["parallel"].update({"pipeline": 4, "data": 1, "micro_batch": 4, "global_batch": 32, "chunks": 2, "slices": 4})
s["cluster"]["gpus_per_node"] = 4
json.dump(s, open(sys.argv[2], "w"), indent=2)
PY
: > "$out/compare.tsv"; rm -f "$out/compare-fit.tsv" "$out/compare-model.tsv"
# A schedule predicted a second way: one line under its row, its error in TSV as TAG.
# second_prediction COMPARE.json TSV TAG LABEL
second_prediction() {
  python3 - "$@" <<'PY' | tee -a "$out/summary.txt"
import json, sys
path, tsv, tag, label = sys.argv[1:5]
try:
    c = json.load(open(path))
    err = c["iteration_error"] * 100
    print(f"  {'':14s} {label}: predicted {c['predicted_iteration_time']*1e3:8.3f} ms, error {err:+6.2f} %, "
          f"bubble error {c['bubble_error_pp']:+5.2f} pp")
    open(tsv, "a").write(f"{tag}\t{err}\n")
except Exception as ex:
    print(f"  {'':14s} {label}: no comparison ({ex})")
PY
}
# One calibration for every schedule (issue 16 §2): the cost model's parameters fitted on
# the probe layouts, then each schedule below predicted with it beside its own profile.
"$tdp" calibrate "$scen" --backend "$run_backend" --probes zb-h1,zb-v,1f1b,interleaved,tdpipe:4 --steps 4 --warmup 3 \
    --show-fit -o "$out/profiles/model.profile.json" > "$out/calibrate-model.log" 2>&1 \
  && say "  one profile: $(head -1 "$out/calibrate-model.log")" \
  || say "  one profile: calibrate --probes failed: $(tail -2 "$out/calibrate-model.log")"
# CUDA graphs per op (--cuda-graphs on) against issuing each kernel, side by side in one
# run of each: zb-h1 (the most ops a step: F, B and W apart). The default stays off until
# this says graphs are faster; the gaps line shows the host overhead with them.
graph_modes=(off on)
[ "$run_backend" = cuda ] || { graph_modes=(); say "  graphs: the cpu backend has none (rehearsal)"; }
for graphs in "${graph_modes[@]}"; do
  "$tdp" exec "$scen" --backend "$run_backend" "${transport[@]}" --schedule zb-h1 --steps 6 --cuda-graphs "$graphs" \
      --trace-out "$out/traces/graphs-$graphs.zb-h1.json" --json > "$out/exec-graphs-$graphs.json" \
      2> "$out/exec-graphs-$graphs.err" || say "  graphs $graphs: exec failed: $(tail -2 "$out/exec-graphs-$graphs.err")"
done
[ "$run_backend" = cuda ] && python3 - "$out/exec-graphs-off.json" "$out/exec-graphs-on.json" <<'PY' | tee -a "$out/summary.txt"
import json, sys
try:
    off, on = (json.load(open(p)) for p in sys.argv[1:3])
    g = on.get("cuda_graphs", {})
    print(f"  zb-h1 --cuda-graphs off {off['iteration_time']*1e3:8.3f} ms/iter, on {on['iteration_time']*1e3:8.3f} ms/iter "
          f"(on/off {on['iteration_time']/off['iteration_time']:.3f}; {g.get('captures')} captures, "
          f"{g.get('replays')} replays); losses equal: {on['loss_per_step'] == off['loss_per_step']}")
except Exception as ex:
    print(f"  graphs: no comparison ({ex})")
PY
ls "$out"/traces/graphs-*.json > /dev/null 2>&1 \
  && python3 scripts/trace-gaps.py "$out"/traces/graphs-*.json 2>&1 | sed "s|$out/traces/||; s/^/  gaps: /" \
     | tee -a "$out/summary.txt"
for spec in "gpipe 1" "1f1b 1" "interleaved 1" "zb-h1 1" "zb-h2 1" "zb-v 1" "tdpipe 4"; do
  set -- $spec
  name="$1-s$2"
  if (( $(date +%s) - t_start > 450 )); then say "  $name: skipped (time budget)"; continue; fi
  "$tdp" exec "$scen" --backend "$run_backend" "${transport[@]}" --schedule "$1" --slices "$2" --steps 6 \
      --trace-out "$out/traces/$name.$backend.json" --json > "$out/exec-$name.json" 2> "$out/exec-$name.err" \
    || { say "  $name: exec failed: $(tail -2 "$out/exec-$name.err")"; continue; }
  "$tdp" calibrate "$scen" --backend "$run_backend" --schedule "$1" --slices "$2" --steps 4 --warmup 2 \
      -o "$out/profiles/$name.profile.json" > "$out/calibrate-$name.log" 2>&1 \
    || { say "  $name: calibrate failed: $(tail -2 "$out/calibrate-$name.log")"; continue; }
  # SimGrid is not on the GPU machine: the analytic engine predicts with the profile's
  # op times and loopback transport; `tdpipe sim --engine simgrid --profile` elsewhere
  # takes the same profile.
  "$tdp" sim "$scen" --engine analytic --schedule "$1" --slices "$2" --profile "$out/profiles/$name.profile.json" \
      --trace-out "$out/traces/$name.predicted.json" > "$out/predict-$name.log" 2>&1 \
    || { say "  $name: prediction failed: $(tail -2 "$out/predict-$name.log")"; continue; }
  "$tdp" compare "$out/traces/$name.predicted.json" "$out/traces/$name.$backend.json" --json > "$out/compare-$name.json" 2>&1
  python3 - "$out/compare-$name.json" "$out/exec-$name.json" "$name" "$out/compare.tsv" <<'PY' | tee -a "$out/summary.txt"
import json, sys
try:
    c = json.load(open(sys.argv[1])); e = json.load(open(sys.argv[2]))
    err = c["iteration_error"] * 100
    print(f"  {sys.argv[3]:14s} measured {e['iteration_time']*1e3:8.3f} ms/iter (trace step "
          f"{c['measured_iteration_time']*1e3:8.3f} ms), predicted {c['predicted_iteration_time']*1e3:8.3f} ms, "
          f"error {err:+6.2f} %, bubble error {c.get('bubble_error_pp', float('nan')):+5.2f} pp, final loss {e['final_loss']:.4f}")
    open(sys.argv[4], "a").write(f"{sys.argv[3]}\t{err}\n")
except Exception as ex:
    print(f"  {sys.argv[3]}: no comparison ({ex})")
PY
  # The same schedule predicted from the one probe-fitted profile.
  if [ -s "$out/profiles/model.profile.json" ]; then
    "$tdp" sim "$scen" --engine analytic --schedule "$1" --slices "$2" --profile "$out/profiles/model.profile.json" \
        --trace-out "$out/traces/$name.predicted-model.json" > "$out/predict-model-$name.log" 2>&1 \
      && "$tdp" compare "$out/traces/$name.predicted-model.json" "$out/traces/$name.$backend.json" --json \
        > "$out/compare-model-$name.json" 2>&1
    second_prediction "$out/compare-model-$name.json" "$out/compare-model.tsv" model "one profile (probes)"
  fi
  # The same with the device's sharing capacity fitted from the run instead of 1 (the
  # evidence for or against the default): calibrate again, predict, compare.
  if (( $(date +%s) - t_start > 420 )); then continue; fi
  "$tdp" calibrate "$scen" --backend "$run_backend" --schedule "$1" --slices "$2" --steps 4 --warmup 2 \
      --shared-capacity fit -o "$out/profiles/$name.fit.profile.json" > "$out/calibrate-fit-$name.log" 2>&1 \
    && "$tdp" sim "$scen" --engine analytic --schedule "$1" --slices "$2" \
      --profile "$out/profiles/$name.fit.profile.json" --trace-out "$out/traces/$name.predicted-fit.json" \
      > "$out/predict-fit-$name.log" 2>&1 \
    && "$tdp" compare "$out/traces/$name.predicted-fit.json" "$out/traces/$name.$backend.json" --json \
      > "$out/compare-fit-$name.json" 2>&1
  capacity=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["metadata"]["shared_capacity"])' \
      "$out/profiles/$name.fit.profile.json" 2>/dev/null || true)
  second_prediction "$out/compare-fit-$name.json" "$out/compare-fit.tsv" fit "fitted capacity${capacity:+ $capacity}"
done
# The executor's own overhead between dependent ops on one stream (stream order: the host
# does not wait for an op before issuing the next).
ls "$out"/traces/*."$backend".json > /dev/null 2>&1 \
  && python3 scripts/trace-gaps.py "$out"/traces/*."$backend".json 2>&1 | sed "s|$out/traces/||; s/^/  gaps: /" \
     | tee -a "$out/summary.txt"
for f in compare compare-model compare-fit; do
  [ -f "$out/$f.tsv" ] || continue
  python3 - "$out/$f.tsv" "$f" <<'PY' | tee -a "$out/summary.txt"
import statistics, sys
errs = [abs(float(l.split("\t")[1])) for l in open(sys.argv[1]) if l.strip()]
what = {"compare": "each schedule's own profile, default capacity (GPU 1, CPU its cores)",
        "compare-model": "one probe-fitted profile for every schedule",
        "compare-fit": "each schedule's own profile, fitted capacity"}[sys.argv[2]]
if errs:
    print(f"median |iteration-time error| over {len(errs)} schedules, {what}: {statistics.median(errs):.2f} % (goal <= 5 %)")
PY
done

step "done in $(( $(date +%s) - t_start )) s — results in $out (summary.txt)"
echo "To keep: traces/*.$backend.json, traces/*.predicted.json and profiles/*.json of $out (or of"
echo "\$OUT/gpu-check.tar.gz) go to traces/samples/h200/$(date +%Y-%m-%d)/, the figures to docs/BENCHMARKS.md"
