#!/usr/bin/env bash
# balance_cpu.sh — the load balancer in the loop, executed: the tiny scenario (and
# copies of it with more layers) with one pipeline rank slowed down, re-balanced every
# K steps from its measured stage times (`tdpipe exec --rank-speed --balance-every`).
# Usage: [SPEEDS="0.4 0.5"] bench/balance_cpu.sh [BUILD_DIR] [REPEATS]; prints one row per run: the
# stages' measured spread (slowest / fastest F+B+W per micro-batch, median over a
# segment's steps) and iteration before balancing and in the last segment, the
# partition the balancer chose and the spread it predicted for it.
set -euo pipefail
build=${1:-build/default}
repeats=${2:-3}
tdpipe="$build/apps/tdpipe"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

printf '%-7s %-6s %-4s | %-9s %8s %9s | %-9s %9s %8s %9s\n' layers speed run before spread iter after predicted spread iter
for layers in 4 8 12; do
  sed "s/^  layers: 4\$/  layers: $layers/; s/^name: tiny-gpt-cpu/name: tiny-gpt-cpu-${layers}l/" \
    scenarios/tiny-gpt-cpu.yaml > "$work/tiny-$layers.yaml"
  grep -q "^  layers: $layers\$" "$work/tiny-$layers.yaml"
  for speed in ${SPEEDS:-0.4 0.5 0.7}; do
    for run in $(seq 1 "$repeats"); do
      "$tdpipe" exec "$work/tiny-$layers.yaml" --pin --rank-speed "1:$speed" --balance-every 10 --steps 40 \
        >/dev/null 2>"$work/err"
      python3 - "$work/err" "$layers" "$speed" "$run" <<'PY'
import re, sys
seg = re.compile(r"^steps \d+-\d+ on layers \[([\d,]+)\]: .* slowest / fastest (\d+) % .*iteration ([\d.]+) ms")
reb = re.compile(r"re-balanced to layers \[([\d,]+)\] \((\d+) % predicted\)")
segments, predicted = [], "-"
for line in open(sys.argv[1]):
    if m := seg.search(line): segments.append(m.groups())
    if m := reb.search(line): predicted = m.group(2) + " %"
    if "staying with the fastest measured" in line: predicted = "(kept)"  # a layout it had measured
first, last = segments[0], segments[-1]
print(f"{sys.argv[2]:<7} {sys.argv[3]:<6} {sys.argv[4]:<4} | [{first[0]}]{'':<{8 - len(first[0])}} {first[1]:>6} % "
      f"{first[2]:>6} ms | [{last[0]}]{'':<{8 - len(last[0])}} {predicted:>9} {last[1]:>6} % {last[2]:>6} ms")
PY
    done
  done
done
