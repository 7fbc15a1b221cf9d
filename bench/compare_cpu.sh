#!/usr/bin/env bash
# calibration_transfer_cpu.sh — one calibration predicts every layout: `tdpipe calibrate`
# fits the cost model on its probe layouts once, then for every schedule of the tiny
# scenario `tdpipe sim --profile` (SimGrid) predicts the iteration and separate
# `tdpipe exec` runs measure it (the median trace span of steps 4–9 of each run; the
# median of RUNS runs). Schedules that
# were not among the probes are marked "held out". Also prints each probe's own
# measured span beside its prediction (the model's error without run-to-run noise).
# Usage: bench/compare_cpu.sh [BUILD_DIR] [RUNS] [PROBES]
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
build=${1:-build/default}
runs=${2:-3}
probes=${3:-}
tdpipe="$build/apps/tdpipe"
scenario=scenarios/tiny-gpt-cpu.yaml
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

probe_args=()
[[ -n $probes ]] && probe_args=(--probes "$probes")
"$tdpipe" calibrate "$scenario" "${probe_args[@]}" -o "$work/model.json" 2>/dev/null | head -1

span() {  # median trace span of one exec run's steps after the first three, seconds
  "$tdpipe" exec "$scenario" --backend cpu --schedule "$1" "${@:2}" --steps 9 --json --trace-out "$work/meas.json" \
      2>/dev/null | python3 -c 'import json,statistics,sys; print(statistics.median(json.load(sys.stdin)["trace_iteration_times"][3:]))'
}

printf '%-12s %11s %11s %9s %11s %9s %11s %10s %12s\n' schedule predicted measured error "run spread" "probe run" \
  error "bubble pp" "op |err| med"
errors=()
for run in gpipe 1f1b interleaved zb-h1 zb-h2 zb-v tdpipe:2 tdpipe:4; do
  schedule=${run%%:*}
  slices=()
  [[ $run == *:* ]] && slices=(--slices "${run##*:}")
  predicted=$("$tdpipe" sim "$scenario" --engine simgrid --schedule "$schedule" "${slices[@]}" \
      --profile "$work/model.json" --trace-out "$work/pred.json" --json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["iteration_time"])')
  measured=()
  for _ in $(seq "$runs"); do measured+=("$(span "$schedule" "${slices[@]}")"); done
  "$tdpipe" compare "$work/pred.json" "$work/meas.json" --json > "$work/cmp.json"
  errors+=("$(python3 - "$work/model.json" "$work/cmp.json" "$run" "$predicted" "${measured[@]}" <<'PY'
import json, statistics, sys
meta = json.load(open(sys.argv[1]))["metadata"]
c = json.load(open(sys.argv[2]))
run, pred = sys.argv[3], float(sys.argv[4])
meas = [float(x) for x in sys.argv[5:]]
m = statistics.median(meas)
err = (pred - m) / m
spread = (max(meas) - min(meas)) / m
own = meta.get(f"probe_{run}_median_trace_iteration_seconds")
probe = f"{float(own)*1e3:8.2f} ms {100*(pred-float(own))/float(own):+8.2f}%" if own else f"{'held out':>11} {'':>9}"
print(f"{run:<12} {pred*1e3:8.2f} ms {m*1e3:8.2f} ms {100*err:+8.2f}% {100*spread:10.1f}% {probe} "
      f"{c['bubble_error_pp']:+10.2f} {100*c['compute_duration_error']['median']:11.2f}%", file=sys.stderr)
print(abs(err))
PY
)")
done 2>&1
python3 -c 'import statistics,sys; v=[float(x) for x in sys.argv[1:]]; print(f"median |iteration-time error|: {100*statistics.median(v):.2f}% (max {100*max(v):.2f}%)")' "${errors[@]}"
