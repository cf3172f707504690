"""PyTorch peer of `trainer collectives-bench`: the same ops, sizes, fill, timing and busbw
formulas with torch.distributed (gloo on CPU), so bench/collectives.sh can compare the two in
one run. Start it with torchrun; rank 0 writes one JSON line in the trainer's report format.

usage: torchrun --nproc_per_node 2 bench/collectives.py --op all_reduce --min-bytes 1048576 \
           --max-bytes 67108864 --factor 2 --iters 20 --warmup 5 --json out.json
"""
import argparse
import json
import time

import torch
import torch.distributed as dist

OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]
FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


def sizes(lo, hi, f):
    out = [lo]
    while out[-1] * f <= hi and f > 1:
        out.append(out[-1] * f)
    return out


def effective(op, b, n):
    unit = 4 * (n if op in ("all_gather", "reduce_scatter") else 1)
    return max(b // unit, 1) * unit


def pattern(start, count):
    return torch.arange(start, start + count, dtype=torch.float32).fmod(7) + 1


def buffers(op, count, rank, n):
    w = rank + 1.0
    shard = count // n
    if op in ("all_reduce", "broadcast"):
        t = pattern(0, count) * w
        return t, t
    if op == "all_gather":
        return pattern(0, shard) * w, torch.zeros(count)
    return pattern(0, count) * w, torch.zeros(shard)


def expected(op, count, rank, n):
    shard = count // n
    s = n * (n + 1) / 2
    if op == "all_reduce":
        return pattern(0, count) * s
    if op == "broadcast":
        return pattern(0, count)
    if op == "all_gather":
        return (torch.arange(1, n + 1, dtype=torch.float32)[:, None] * pattern(0, shard)[None]).flatten()
    return pattern(rank * shard, shard) * s


def once(op, inp, out):
    if op == "all_reduce":
        dist.all_reduce(out)
    elif op == "broadcast":
        dist.broadcast(out, 0)
    elif op == "all_gather":
        dist.all_gather_into_tensor(out, inp)
    else:
        dist.reduce_scatter_tensor(out, inp)


def over_ranks(x):
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--op", default="all", choices=OPS + ["all"])
    p.add_argument("--min-bytes", type=int, default=1 << 20)
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--factor", type=int, default=2)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json", required=True)
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    ops = OPS if a.op == "all" else [a.op]
    report = {"kind": "torch.distributed", "backend": "gloo", "world": n, "dtype": "float32",
              "iters": a.iters, "warmup": a.warmup, "ops": []}
    for op in ops:
        rows = []
        for req in sizes(a.min_bytes, a.max_bytes, a.factor):
            b = effective(op, req, n)
            count = b // 4
            inp, out = buffers(op, count, rank, n)
            for _ in range(a.warmup):
                once(op, inp, out)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(a.iters):
                once(op, inp, out)
            sec = over_ranks((time.perf_counter() - t0) / a.iters) / n
            inp, out = buffers(op, count, rank, n)
            once(op, inp, out)
            wrong = int(over_ranks(float((out != expected(op, count, rank, n)).sum())))
            alg = b / 1e9 / sec
            rows.append({"size_bytes": b, "count": count, "time_us": sec * 1e6, "algbw_gbps": alg,
                         "busbw_gbps": alg * FACTOR[op](n), "wrong": wrong})
        report["ops"].append({"op": op, "bus_factor": FACTOR[op](n), "sizes": rows,
                              "avg_busbw_gbps": sum(r["busbw_gbps"] for r in rows) / len(rows)})
    if rank == 0:
        with open(a.json, "w") as f:
            f.write(json.dumps(report) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
