#!/usr/bin/env bash
# fuzz.sh — runs every libFuzzer target of tests/fuzz for SECONDS each (default 60) on
# seed corpora made from the shipped scenarios and from files tdpipe itself writes,
# and prints, per target, the executions, the speed and the findings (crash / leak /
# timeout files libFuzzer leaves). Needs clang-16 (scripts/install-deps.sh --fuzz).
#
#   bench/fuzz.sh [SECONDS] [TARGET…]      e.g. bench/fuzz.sh 120 fuzz_plan_json
#
# Builds build/fuzz (cmake --preset fuzz) and, for the seeds, uses build/default's
# tdpipe (./scripts/demo.sh builds it). Findings land in build/fuzz/findings/TARGET/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(fuzz_scenario_yaml fuzz_scenario_json fuzz_plan_json fuzz_plan_text
                                     fuzz_trace_json fuzz_profile fuzz_megatron_args fuzz_requests_json)
command -v clang++-16 > /dev/null || { echo "fuzz.sh: clang++-16 not found (scripts/install-deps.sh --fuzz)" >&2; exit 1; }
[ -f build/fuzz/build.ninja ] || cmake --preset fuzz > /dev/null
cmake --build build/fuzz --target "${targets[@]}" > /dev/null
tdpipe=build/default/apps/tdpipe
[ -x "$tdpipe" ] || { echo "fuzz.sh: $tdpipe missing (run ./scripts/demo.sh or cmake --build build/default)" >&2; exit 1; }

seeds=build/fuzz/seeds
rm -rf "$seeds"
mkdir -p "$seeds"/{fuzz_scenario_yaml,fuzz_scenario_json,fuzz_plan_json,fuzz_plan_text,fuzz_trace_json,fuzz_profile,fuzz_megatron_args,fuzz_requests_json}
cp scenarios/*.yaml "$seeds/fuzz_scenario_yaml/"
cp tests/exec_cuda/data/*.json "$seeds/fuzz_scenario_json/"
for sc in scenarios/tiny-gpt-cpu.yaml scenarios/synthetic-zb-p8-m24.yaml; do
  for s in 1f1b interleaved zb-v tdpipe; do
    n=$(basename "$sc" .yaml)-$s
    "$tdpipe" plan "$sc" --schedule "$s" --format json -o "$seeds/fuzz_plan_json/$n.json" 2> /dev/null || true
    "$tdpipe" plan "$sc" --schedule "$s" -o "$seeds/fuzz_plan_text/$n.txt" 2> /dev/null || true
    "$tdpipe" sim "$sc" --schedule "$s" --engine analytic --trace-out "$seeds/fuzz_trace_json/$n.json" \
        > /dev/null 2>&1 || true
  done
done
"$tdpipe" exec scenarios/tiny-gpt-cpu.yaml --steps 2 --trace-out "$seeds/fuzz_trace_json/measured.json" > /dev/null
# Serving: plans of the three planners (with a serving table), their traces, a requests file.
"$tdpipe" serve scenarios/serve-tiny-cpu.yaml --planner all --engine analytic \
    --plan-out "$seeds/fuzz_plan_json/serve.json" --trace-out "$seeds/fuzz_trace_json/serve.json" > /dev/null
printf '[{"prompt": 12, "output": 30}, {"prompt": 1024, "output": 1}]\n' > "$seeds/fuzz_requests_json/two.json"
"$tdpipe" calibrate scenarios/tiny-gpt-cpu.yaml -o "$seeds/fuzz_profile/tiny.json" > /dev/null 2>&1
"$tdpipe" calibrate scenarios/tiny-gpt-cpu.yaml --schedule 1f1b --steps 1 -o "$seeds/fuzz_profile/tiny-table.json" > /dev/null 2>&1
printf '%s\n' "--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --micro-batch-size 1 --vocab-size 50000 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --bf16 --num-layers-per-virtual-pipeline-stage 1" \
    > "$seeds/fuzz_megatron_args/a.txt"
printf '%s\n' "--num-layers=30 --hidden-size=2048 --num-attention-heads=16 --seq-length=2048 --micro-batch-size=1 --pipeline-model-parallel-size=4 --decoder-first-pipeline-num-layers=6 --recompute-granularity full --recompute-method block --recompute-num-layers 9 --vocab-size 50000 --swiglu --group-query-attention --num-query-groups 4" \
    > "$seeds/fuzz_megatron_args/b.txt"

printf '%-22s %8s %12s %10s %9s\n' target seconds executions exec/s findings
for t in "${targets[@]}"; do
  work=build/fuzz/corpus/$t
  found=build/fuzz/findings/$t
  mkdir -p "$work" "$found"
  log=build/fuzz/$t.log
  # -rss_limit_mb: a reader must refuse an absurd input, not allocate for it.
  "build/fuzz/tests/fuzz/$t" "$work" "$seeds/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -max_len=65536 -artifact_prefix="$found/" -print_final_stats=1 > "$log" 2>&1 || true
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  findings=$(find "$found" -type f | wc -l)
  printf '%-22s %8s %12s %10s %9s\n' "$t" "$seconds" "$execs" "$((execs / (seconds > 0 ? seconds : 1)))" "$findings"
done
