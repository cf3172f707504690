"""PyTorch peer of `trainer bench model`: student forward+backward of one multi-crop batch.

Same shapes, init, threads and loss as the Rust side; prints one JSON line.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "trainer", "tests", "py"))
import torch  # noqa: E402
from dino_reference import DINOHead, MultiCropWrapper, VisionTransformer  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--arch", default="vit_small")
p.add_argument("--patch", type=int, default=16)
p.add_argument("--channels", type=int, default=5)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--local-crops", type=int, default=8)
p.add_argument("--out-dim", type=int, default=65536)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--warmup", type=int, default=1)
p.add_argument("--iters", type=int, default=3)
a = p.parse_args()

torch.set_num_threads(a.threads)
torch.manual_seed(0)
vit = VisionTransformer(a.arch, a.patch, a.channels, drop_path_rate=0.1)
net = MultiCropWrapper(vit, DINOHead(vit.embed_dim, a.out_dim)).train()
c = a.channels
crops = [torch.randn(a.batch, c, 224, 224) for _ in range(2)]
crops += [torch.randn(a.batch, c, 96, 96) for _ in range(a.local_crops)]


def step():
    out = net(crops)
    loss = out.square().mean()
    loss.backward()
    net.zero_grad(set_to_none=False)


for _ in range(a.warmup):
    step()
times = []
for _ in range(a.iters):
    t = time.perf_counter()
    step()
    times.append(time.perf_counter() - t)
times.sort()
print(json.dumps({"impl": "pytorch", "arch": a.arch, "batch": a.batch, "threads": a.threads,
                  "median_s": times[len(times) // 2], "times_s": times}))
