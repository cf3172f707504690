"""fp32 matmul throughput of PyTorch on this machine (n×n · n×n, best of REPS); the peak
that bench/train_step.sh compares achieved FLOP/s against. Prints one JSON line."""
import argparse
import json
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--n", type=int, default=2048)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--reps", type=int, default=10)
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
x, y = torch.randn(a.n, a.n), torch.randn(a.n, a.n)
out = torch.empty(a.n, a.n)
torch.matmul(x, y, out=out)  # warm-up
best = float("inf")
for _ in range(max(a.reps, 1)):
    t = time.perf_counter()
    torch.matmul(x, y, out=out)
    best = min(best, time.perf_counter() - t)
print(json.dumps({"impl": "pytorch", "bench": "matmul", "n": a.n, "threads": a.threads,
                  "best_s": best, "gflops": 2 * a.n ** 3 / best / 1e9}))
