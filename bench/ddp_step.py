"""PyTorch peer of bench/ddp.sh: scDINO's training step under
torch.nn.parallel.DistributedDataParallel over Gloo (as main_dino.py wraps the student), with
random crops held in memory. Run under torchrun; rank 0 prints one JSON line with the median
step time. The networks, loss, clipping and AdamW groups are bench/train_step.py's.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "trainer", "tests", "py"))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dino_reference  # noqa: E402
from dino_reference import DINOHead, MultiCropWrapper, VisionTransformer  # noqa: E402

dino_reference.USE_SDPA = True
p = argparse.ArgumentParser()
p.add_argument("--arch", default="vit_tiny")
p.add_argument("--patch", type=int, default=16)
p.add_argument("--channels", type=int, default=2)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--local-crops", type=int, default=2)
p.add_argument("--global-size", type=int, default=64)
p.add_argument("--local-size", type=int, default=32)
p.add_argument("--out-dim", type=int, default=4096)
p.add_argument("--warmup", type=int, default=2)
p.add_argument("--iters", type=int, default=6)
a = p.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
NCROPS = 2 + a.local_crops
vit_s = VisionTransformer(a.arch, a.patch, a.channels, drop_path_rate=0.1)
student = MultiCropWrapper(vit_s, DINOHead(vit_s.embed_dim, a.out_dim, norm_last_layer=True))
vit_t = VisionTransformer(a.arch, a.patch, a.channels)
teacher = MultiCropWrapper(vit_t, DINOHead(vit_t.embed_dim, a.out_dim))
teacher.load_state_dict(student.state_dict())
for q in teacher.parameters():
    q.requires_grad = False
ddp = torch.nn.parallel.DistributedDataParallel(student) if world > 1 else student
regularized = [q for n, q in student.named_parameters() if q.requires_grad and not (n.endswith(".bias") or q.dim() == 1)]
plain = [q for n, q in student.named_parameters() if q.requires_grad and (n.endswith(".bias") or q.dim() == 1)]
opt = torch.optim.AdamW([{"params": regularized}, {"params": plain, "weight_decay": 0.0}], lr=5e-4 * a.batch * world / 256, weight_decay=0.04)
center = torch.zeros(1, a.out_dim)
times = []
for it in range(a.warmup + a.iters):
    crops = [torch.randn(a.batch, a.channels, a.global_size, a.global_size) for _ in range(2)]
    crops += [torch.randn(a.batch, a.channels, a.local_size, a.local_size) for _ in range(a.local_crops)]
    t0 = time.perf_counter()
    with torch.no_grad():
        t_out = teacher(crops[:2])
    s_out = ddp(crops)
    s_chunks = (s_out / 0.1).chunk(NCROPS)
    t_chunks = F.softmax((t_out - center) / 0.04, dim=-1).chunk(2)
    loss, n = 0, 0
    for iq, q in enumerate(t_chunks):
        for v in range(NCROPS):
            if v != iq:
                loss += torch.sum(-q * F.log_softmax(s_chunks[v], dim=-1), dim=-1).mean()
                n += 1
    loss = loss / n
    with torch.no_grad():
        bc = t_out.sum(0, keepdim=True)
        dist.all_reduce(bc)
        center = center * 0.9 + bc / (len(t_out) * world) * 0.1
    opt.zero_grad()
    loss.backward()
    for q in student.parameters():
        if q.grad is not None:
            c = 3.0 / (q.grad.norm(2) + 1e-6)
            if c < 1:
                q.grad.mul_(c)
    opt.step()
    with torch.no_grad():
        for ps, pt in zip(student.parameters(), teacher.parameters()):
            pt.mul_(0.996).add_((1 - 0.996) * ps.detach())
    dist.barrier()
    if it >= a.warmup:
        times.append(time.perf_counter() - t0)
if rank == 0:
    print(json.dumps({"side": "pytorch", "world": world, "median_step_s": statistics.median(times), "steps": times}))
dist.destroy_process_group()
