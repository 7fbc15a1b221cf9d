#!/usr/bin/env python3
"""trace-gaps.py — the executor's per-op host overhead, read from measured traces
(issue 15: goal <= 5 us median on a GPU).

For each rank, its compute-stream ops in time order: the gap between one op's end and
the next one's start, over the pairs where the next op waited for nothing but the first
(no RECV of that rank ended between them — the gap is then the executor's own: issuing,
host synchronisation, launch latency). A stream-ordered executor leaves ~launch latency
there; one that waits for each op on the host adds a round trip to every gap.

usage: trace-gaps.py TRACE.json [TRACE.json ...] [--json]
Prints per trace: pairs counted, median, p90 and max gap in us; exit 1 if a trace has no
compute ops.
"""
import json
import statistics
import sys


def gaps(path):
    doc = json.load(open(path))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    ops = [e for e in events if e.get("ph") == "X"]
    by_rank = {}
    for e in ops:
        by_rank.setdefault(e["pid"], []).append(e)
    out = []
    for rank_ops in by_rank.values():
        compute = sorted((e for e in rank_ops if e.get("cat") == "compute"), key=lambda e: e["ts"])
        recv_ends = sorted(e["ts"] + e["dur"] for e in rank_ops if e.get("args", {}).get("kind") == "RECV")
        for a, b in zip(compute, compute[1:]):
            a_end, b_start = a["ts"] + a["dur"], b["ts"]
            if any(a_end < t <= b_start for t in recv_ends):
                continue  # b may have waited for a transfer
            out.append(max(0.0, b_start - a_end))
    return out


def main():
    paths = [p for p in sys.argv[1:] if not p.startswith("--")]
    as_json = "--json" in sys.argv
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    results, bad = {}, 0
    for p in paths:
        g = sorted(gaps(p))
        if not g:
            print(f"{p}: no consecutive compute ops", file=sys.stderr)
            bad = 1
            continue
        r = {"pairs": len(g), "median_us": statistics.median(g), "p90_us": g[int(0.9 * (len(g) - 1))],
             "max_us": g[-1]}
        results[p] = r
        if not as_json:
            print(f"{p}: {r['pairs']} dependent pairs on one stream, gap median {r['median_us']:.1f} us, "
                  f"p90 {r['p90_us']:.1f} us, max {r['max_us']:.1f} us (goal: median <= 5 us on a GPU)")
    if as_json:
        print(json.dumps(results, indent=2))
    return bad


if __name__ == "__main__":
    sys.exit(main())
