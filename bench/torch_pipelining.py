#!/usr/bin/env python3
"""bench/torch_pipelining.py: tdpipe's CPU executor beside what users would pick instead.

It runs the same GPT shape and the same schedules with torch.distributed.pipelining, one
CPU process per pipeline rank over gloo, and prints the iteration times side by side
from one run. The GPT shape is scenarios/tiny-gpt-cpu.yaml: 4 layers, hidden 64, 4 heads,
ffn 256, 64 tokens, vocabulary 96, p = 2, 4 micro-batches of 2 sequences. The arithmetic
is fp64, as in tdpipe's CPU executor, with Adam after every step. Each process (and
tdpipe's rank) gets one intra-op thread, and the two ranks share the machine's cores.

  schedule     tdpipe            torch.distributed.pipelining
  1f1b         1f1b              Schedule1F1B
  interleaved  interleaved v=2   ScheduleInterleaved1F1B (4 stages, 2 per rank)
  zb-v         zb-v              ScheduleZBVZeroBubble (V-shaped, 2 stages per rank)

Usage: python3 bench/torch_pipelining.py [--tdpipe build/default/apps/tdpipe] [--steps 20]
Needs PyTorch (pip install torch); it is not a dependency of the build or the tests.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = dict(layers=4, hidden=64, heads=4, ffn=256, seq=64, vocab=96, micro_batch=2, microbatches=4, p=2)
SCHEDULES = ["1f1b", "interleaved", "zb-v"]


def build_stage_module(torch, nn, stage, stages, layers_per_stage):
    s = SHAPE

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            h = s["hidden"]
            self.ln1 = nn.LayerNorm(h, eps=1e-5)
            self.q = nn.Linear(h, h, bias=False)
            self.k = nn.Linear(h, h, bias=False)
            self.v = nn.Linear(h, h, bias=False)
            self.o = nn.Linear(h, h)
            self.ln2 = nn.LayerNorm(h, eps=1e-5)
            self.up = nn.Linear(h, s["ffn"])
            self.down = nn.Linear(s["ffn"], h)

        def forward(self, x):
            b, t, h = x.shape
            nh = s["heads"]
            y = self.ln1(x)
            q, k, v = (m(y).view(b, t, nh, h // nh).transpose(1, 2) for m in (self.q, self.k, self.v))
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, t, h))
            return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x)), approximate="tanh"))

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.last = stage == 0, stage == stages - 1
            if self.first:
                self.tok = nn.Embedding(s["vocab"], s["hidden"])
                self.pos = nn.Embedding(s["seq"], s["hidden"])
            self.blocks = nn.ModuleList(Block() for _ in range(layers_per_stage))
            if self.last:
                self.ln = nn.LayerNorm(s["hidden"], eps=1e-5)
                self.head = nn.Linear(s["hidden"], s["vocab"])

        def forward(self, x):
            if self.first:
                x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
            for blk in self.blocks:
                x = blk(x)
            if self.last:
                x = self.head(self.ln(x))
            return x

    return Stage().double()


def torch_worker(rank, world, schedule, steps, port, out_path):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed import pipelining as pp

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1234)
    s = SHAPE
    v = 1 if schedule == "1f1b" else 2
    stages = world * v
    per = s["layers"] // stages
    if schedule == "1f1b":
        mine = [rank]
    elif schedule == "interleaved":
        mine = [rank, rank + world]  # round robin
    else:
        mine = [rank, stages - 1 - rank]  # V shape
    dev = torch.device("cpu")
    mods = [build_stage_module(torch, nn, i, stages, per) for i in mine]
    pstages = [pp.PipelineStage(m, i, stages, dev) for m, i in zip(mods, mine)]
    loss_fn = lambda out, y: nn.functional.cross_entropy(out.reshape(-1, s["vocab"]), y.reshape(-1))
    m = s["microbatches"]
    if schedule == "1f1b":
        sched = pp.Schedule1F1B(pstages[0], m, loss_fn=loss_fn)
    elif schedule == "interleaved":
        sched = pp.ScheduleInterleaved1F1B(pstages, m, loss_fn=loss_fn)
    else:
        sched = pp.ScheduleZBVZeroBubble(pstages, m, loss_fn=loss_fn)
    opt = torch.optim.Adam([q for mod in mods for q in mod.parameters()], lr=3e-3)
    batch = s["micro_batch"] * m
    gen = torch.Generator().manual_seed(7)
    times = []
    for _ in range(steps):
        x = torch.randint(0, s["vocab"], (batch, s["seq"]), generator=gen)
        y = torch.randint(0, s["vocab"], (batch, s["seq"]), generator=gen)
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        args = (x,) if 0 in mine else ()
        kwargs = {"target": y, "losses": []} if any(i == stages - 1 for i in mine) else {}
        sched.step(*args, **kwargs)
        opt.step()
        dist.barrier()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(times, f)
    dist.destroy_process_group()


def run_torch(schedule, steps, port):
    import torch.multiprocessing as mp

    out = f"/tmp/tdpipe-torch-{os.getpid()}-{schedule}.json"
    mp.spawn(torch_worker, args=(SHAPE["p"], schedule, steps, port, out), nprocs=SHAPE["p"], join=True)
    with open(out) as f:
        times = json.load(f)
    os.remove(out)
    return times


def run_tdpipe(binary, schedule, steps):
    out = subprocess.run([binary, "exec", os.path.join(ROOT, "scenarios/tiny-gpt-cpu.yaml"), "--schedule", schedule,
                          "--steps", str(steps), "--json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)["iteration_times"]


def median_after_first(times):
    return statistics.median(times[1:] if len(times) > 1 else times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tdpipe", default=os.path.join(ROOT, "build/default/apps/tdpipe"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch_pipelining: PyTorch is not installed (pip install torch); nothing measured", file=sys.stderr)
        return 2
    print(f"tiny-gpt-cpu shape {SHAPE}, fp64, {a.steps} steps, median after step 0; torch {torch.__version__}, "
          f"{os.cpu_count()} cores")
    print(f"{'schedule':<12} {'tdpipe ms':>10} {'torch ms':>10} {'torch/tdpipe':>13}")
    port = 29500 + os.getpid() % 1000
    for i, sched in enumerate(a.schedules.split(",")):
        td = median_after_first(run_tdpipe(a.tdpipe, sched, a.steps))
        tp = median_after_first(run_torch(sched, a.steps, port + i))
        print(f"{sched:<12} {td * 1e3:>10.2f} {tp * 1e3:>10.2f} {tp / td:>13.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
