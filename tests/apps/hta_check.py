#!/usr/bin/env python3
"""hta_check.py KINETO_DIR STATS_JSON — runs Holistic Trace Analysis on a folder of
tdpipe's Kineto files and checks its temporal breakdown against `tdpipe trace stats
--json` of the same folder, rank by rank:

  HTA kernel_time      = tdpipe span          (the rank's first op start to last op end)
  HTA compute_time     = tdpipe compute       (union of compute kernels)
  HTA non_compute_time = tdpipe exposed_comm  (communication kernels not under compute)
  HTA idle_time        = tdpipe idle_in_span

HTA reads µs and truncates each event's ts and dur to whole µs, so each figure may be
off by up to 2 µs per event of the rank; nothing else may differ. Its idle-time
breakdown must also run on every rank and account for every stream, and HTA must put every
kernel in the rank's ProfilerStep iteration (through its correlated launch). Exit 0 when
all agree.
"""
import json
import logging
import os
import sys

logging.disable(logging.WARNING)  # HTA logs every file it parses
from hta.trace_analysis import TraceAnalysis  # noqa: E402


def main():
    folder, stats_path = sys.argv[1], sys.argv[2]
    stats = json.load(open(stats_path))
    analysis = TraceAnalysis(trace_dir=folder)
    df = analysis.get_temporal_breakdown(visualize=False)
    bad = []
    for row in stats["per_rank"]:
        r = row["rank"]
        hta = df[df["rank"] == r]
        if hta.empty:
            bad.append(f"rank {r}: missing from HTA's temporal breakdown")
            continue
        hta = hta.iloc[0]
        trace = json.load(open(os.path.join(folder, f"rank{r}.json")))
        events = sum(1 for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy"))
        tolerance = 2.0 * events
        for hta_col, ours in (("kernel_time(us)", "span"), ("compute_time(us)", "compute"),
                              ("non_compute_time(us)", "exposed_comm"), ("idle_time(us)", "idle_in_span")):
            a, b = float(hta[hta_col]), row[ours] * 1e6
            status = "ok" if abs(a - b) <= tolerance else "DIFFERS"
            print(f"rank {r}: HTA {hta_col:<22} {a:14.1f}   tdpipe {ours:<13} {b:14.1f} µs   {status}")
            if status != "ok":
                bad.append(f"rank {r}: {hta_col} {a} vs {ours} {b} (tolerance {tolerance} µs)")
        step = [e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
        kernels = analysis.t.get_trace(r)
        kernels = kernels[kernels["stream"].ne(-1)]
        iterations = sorted(int(i) for i in kernels["iteration"].unique())
        if len(step) != 1 or iterations != [int(step[0].split("#")[1])]:
            bad.append(f"rank {r}: HTA put kernels in iterations {iterations}; the trace's step is {step}")
        idle, _ = analysis.get_idle_time_breakdown(ranks=[r], visualize=False)
        streams = {e["args"]["stream"] for e in trace["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy")}
        if set(idle["stream"]) != streams:
            bad.append(f"rank {r}: idle-time breakdown streams {sorted(set(idle['stream']))}, trace {sorted(streams)}")
    for b in bad:
        print("FAIL:", b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
