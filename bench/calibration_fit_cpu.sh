#!/usr/bin/env bash
# calibration_fit_cpu.sh — how well a calibration profile predicts the very run it was
# measured on (no run-to-run noise), every schedule of the tiny scenario: calibrate
# (cpu) → sim --profile → iteration vs the calibration run's median trace span. Twice:
# with the profile as written (hand-off latency fitted from the run) and with the
# ping-pong micro-benchmark's latency put back. Then the run-to-run spread of
# `tdpipe exec` itself (6 runs of 1f1b), the floor under any separate-run comparison.
# Usage: bench/calibration_fit_cpu.sh [BUILD_DIR] [ENGINE]
set -euo pipefail
build=${1:-build/default}
engine=${2:-simgrid}
tdpipe="$build/apps/tdpipe"
scenario=scenarios/tiny-gpt-cpu.yaml
work=$(mktemp -d)
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
iteration() { "$tdpipe" sim "$scenario" --engine "$engine" "$@" --json 2>/dev/null |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["iteration_time"])'; }

printf '%-12s %10s %11s %8s %12s %8s %11s %8s\n' schedule "run (ms)" "fitted λ" error "ping-pong λ" error "λ fit (µs)" samples
errors=()
for run in gpipe 1f1b interleaved zb-h1 zb-h2 zb-v tdpipe:2 tdpipe:4; do
  schedule=${run%%:*}
  slices=()
  [[ $run == *:* ]] && slices=(--slices "${run##*:}")
  tag=${run/:/-s}
  "$tdpipe" calibrate --backend cpu "$scenario" --schedule "$schedule" "${slices[@]}" -o "$work/$tag.json" >/dev/null
  python3 - "$work/$tag.json" "$work/$tag.pingpong.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
m = p["metadata"]
if "p2p_latency_microbenchmark_seconds" in m:
    p["p2p"]["latency"] = float(m["p2p_latency_microbenchmark_seconds"])
json.dump(p, open(sys.argv[2], "w"))
PY
  fitted=$(iteration --schedule "$schedule" "${slices[@]}" --profile "$work/$tag.json")
  pingpong=$(iteration --schedule "$schedule" "${slices[@]}" --profile "$work/$tag.pingpong.json")
  errors+=("$(python3 - "$work/$tag.json" "$fitted" "$pingpong" "$tag" <<'PY'
import json, sys
p = json.load(open(sys.argv[1])); m = p["metadata"]
run = float(m["median_trace_iteration_seconds"]); a = float(sys.argv[2]); b = float(sys.argv[3])
print(f'{sys.argv[4]:<12} {run*1e3:10.2f} {a*1e3:8.2f} ms {100*(a-run)/run:+7.2f}% {b*1e3:9.2f} ms {100*(b-run)/run:+7.2f}% '
      f'{p["p2p"]["latency"]*1e6:11.1f} {m.get("p2p_latency_samples", "-"):>8}', file=sys.stderr)
print(abs(a - run) / run, abs(b - run) / run)
PY
)")
done 2>&1
python3 -c '
import statistics, sys
pairs = [tuple(map(float, x.split())) for x in sys.argv[1:]]
print(f"median |error|: fitted λ {100*statistics.median(a for a, _ in pairs):.2f}%, "
      f"ping-pong λ {100*statistics.median(b for _, b in pairs):.2f}%")' "${errors[@]}"

runs=()
for i in 1 2 3 4 5 6; do
  runs+=("$("$tdpipe" exec "$scenario" --backend cpu --schedule 1f1b --steps 6 --json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["iteration_time"])')")
done
python3 -c '
import statistics, sys
v = [float(x) * 1e3 for x in sys.argv[1:]]
print("run-to-run, tdpipe exec 1f1b x6: " + " ".join(f"{x:.1f}" for x in v) +
      f" ms; spread {100*(max(v)-min(v))/statistics.median(v):.0f}% of the median")' "${runs[@]}"
