#!/usr/bin/env bash
# compare_cpu.sh — prediction vs measurement on this machine, every schedule of
# the tiny scenario: calibrate (cpu) → sim --profile (simgrid) → exec (cpu) → compare.
# Usage: bench/compare_cpu.sh [BUILD_DIR] [SCENARIO]; prints one row per schedule and
# the median |iteration-time error|.
set -euo pipefail
build=${1:-build/default}
scenario=${2:-scenarios/tiny-gpt-cpu.yaml}
tdpipe="$build/apps/tdpipe"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

printf '%-14s %12s %12s %9s %10s %10s %14s\n' schedule predicted measured "iter err" "bubble pp" "max rank pp" "op |err| med"
errors=()
for run in gpipe 1f1b interleaved zb-h1 zb-h2 zb-v tdpipe:2 tdpipe:4; do
  schedule=${run%%:*}
  slices=()
  [[ $run == *:* ]] && slices=(--slices "${run##*:}")
  tag=${run/:/-s}
  "$tdpipe" calibrate --backend cpu "$scenario" --schedule "$schedule" "${slices[@]}" \
      -o "$work/$tag.profile.json" >/dev/null
  "$tdpipe" sim "$scenario" --engine simgrid --schedule "$schedule" "${slices[@]}" \
      --profile "$work/$tag.profile.json" --trace-out "$work/$tag.pred.json" >/dev/null 2>&1
  "$tdpipe" exec "$scenario" --backend cpu --schedule "$schedule" "${slices[@]}" --steps 6 \
      --trace-out "$work/$tag.meas.json" >/dev/null
  "$tdpipe" compare "$work/$tag.pred.json" "$work/$tag.meas.json" --json > "$work/$tag.cmp.json"
  python3 - "$work/$tag.cmp.json" "$tag" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
ranks = max(abs(r["bubble_error_pp"]) for r in c["ranks"])
print(f'{sys.argv[2]:<14} {c["predicted_iteration_time"]*1e3:9.2f} ms {c["measured_iteration_time"]*1e3:9.2f} ms '
      f'{100*c["iteration_error"]:+8.2f}% {c["bubble_error_pp"]:+9.2f} {ranks:10.2f} '
      f'{100*c["compute_duration_error"]["median"]:13.2f}%')
PY
  errors+=("$(python3 -c 'import json,sys; print(abs(json.load(open(sys.argv[1]))["iteration_error"]))' "$work/$tag.cmp.json")")
done
python3 -c 'import statistics,sys; print(f"median |iteration-time error|: {100*statistics.median(map(float, sys.argv[1:])):.2f}%")' "${errors[@]}"
