#!/usr/bin/env python3
"""torch_kineto_sample.py — a real Kineto trace of a tdpipe plan, written by torch.profiler.

Runs a tdpipe plan (the text form `tdpipe plan -o PLAN.txt` writes) with PyTorch on the
CPU: one process per pipeline rank (gloo), each running its rank's ops in the plan's
order — F/B/W/BW on two Linear+GELU layers per stage, SEND/RECV with torch.distributed
(a "+" group as one batch_isend_irecv), OPT as an SGD step — each inside
`torch.profiler.record_function(<the op's text form>)`, so the ranges carry tdpipe's op
names. torch.profiler writes one Kineto JSON per rank (with distributedInfo) into OUT.

Usage: torch_kineto_sample.py PLAN.txt OUT_DIR [--steps N]
Needs torch (pip install torch); not part of the build or the tests — its output is
shipped under traces/samples/ for tdpipe's Kineto import tests.
"""
import argparse
import os
import re
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile, record_function, schedule

HIDDEN, BATCH = 256, 64


def parse_plan(path):
    ranks = {}
    for line in open(path):
        m = re.match(r"rank(\d+):\s*(.*)", line)
        if m:
            ranks[int(m.group(1))] = m.group(2).split()
    return ranks


OP = re.compile(r"^(SEND|RECV)\((F|B)(\d+)([<>])r(\d+)\)$")


def run(rank, world, plan_path, out_dir, steps):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    stage = torch.nn.Sequential(torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.GELU(),
                                torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.GELU())
    opt = torch.optim.SGD(stage.parameters(), lr=1e-3)
    program = parse_plan(plan_path)[rank]
    last = rank == world - 1

    def one_step():
        inputs, outputs, grads_in, recv_bufs = {}, {}, {}, {}
        for group in program:
            p2p = []
            for op in group.split("+"):
                m = OP.match(op)
                if m:
                    kind, payload, mb, _, peer = m.group(1), m.group(2), int(m.group(3)), m.group(4), int(m.group(5))
                    if kind == "SEND":
                        t = outputs[mb].detach() if payload == "F" else inputs[mb].grad
                        p2p.append((op, dist.P2POp(dist.isend, t.contiguous(), peer)))
                    else:
                        buf = torch.empty(BATCH, HIDDEN)
                        recv_bufs[(payload, mb)] = buf
                        p2p.append((op, dist.P2POp(dist.irecv, buf, peer)))
                    continue
                with record_function(op):
                    if op.startswith("F"):
                        mb = int(op[1:])
                        x = recv_bufs.pop(("F", mb), None)
                        x = torch.randn(BATCH, HIDDEN) if x is None else x
                        x.requires_grad_(rank > 0)
                        inputs[mb] = x
                        outputs[mb] = stage(x)
                    elif op.startswith("BW") or op.startswith("B"):
                        mb = int(re.sub(r"^BW?", "", op))
                        g = torch.ones_like(outputs[mb]) if last else recv_bufs.pop(("B", mb))
                        outputs[mb].backward(g)
                    elif op == "OPT":
                        opt.step()
                        opt.zero_grad()
            if p2p:
                with record_function("+".join(name for name, _ in p2p)):
                    for w in dist.batch_isend_irecv([o for _, o in p2p]):
                        w.wait()

    # One warm-up step unrecorded, then `steps` recorded ones (ProfilerStep#1 …), written
    # when the cycle ends.
    path = os.path.join(out_dir, f"rank{rank}.json")
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=steps),
                 on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for _ in range(steps + 1):
            dist.barrier()
            one_step()
            prof.step()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=2)
    a = ap.parse_args()
    world = len(parse_plan(a.plan))
    if world < 1:
        sys.exit(f"{a.plan}: no 'rankN:' lines (expected `tdpipe plan -o PLAN.txt` output)")
    os.makedirs(a.out, exist_ok=True)
    mp.spawn(run, args=(world, a.plan, a.out, a.steps), nprocs=world)


if __name__ == "__main__":
    main()
