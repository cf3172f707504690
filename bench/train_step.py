"""PyTorch peer of `trainer bench step`: one full scDINO training iteration, fp32.

The step is scDINO's `train_one_epoch` body (main_dino.py L371-431): set lr/wd, teacher on the
two global crops, student on all crops, DINOLoss (+ centre update), finite check, zero_grad,
backward, per-parameter clip_gradients, last-layer freeze (off), AdamW step with scDINO's two
parameter groups, teacher EMA. The networks are the DINO reference in
trainer/tests/py/dino_reference.py with `USE_SDPA = True` (the kernel the Rust model uses).

--loader none: random crops held in memory, times the step alone.
--loader real: a torch DataLoader (--workers processes, prefetch_factor 2) over a TIFF
  ImageFolder with scDINO's dataset semantics (tifffile.imread, float64, min–max per image and
  channel with the zero-max rule, NaN image → None dropped by the collate function,
  torchvision-based DataAugmentationDINO for multi-channel images, Normalize); times the wall
  clock of each step including the wait for its batch.
--channel-mode fixed|bag|tokens (with --loader none): the model of `model.channels`, as in
  `trainer bench step`: `tokens` is ChannelViT (trainer/tests/py/channel_reference.py) with each
  step's channel subset drawn by hierarchical sampling (k uniform on 1..C, then k channels;
  Python's `random`, seeded, so not the Rust draws, the same distribution); `bag` is a
  single-channel ViT on batch × channels single-channel items per crop. imgs/s counts images.
--channel-separate-blocks N, --channel-mixing-blocks N (tokens): channel_reference.py's
  block masks (`model.channel_separate_blocks`, `model.channel_mixing_blocks`).
--teacher-channels step|all (tokens; `train.teacher_channels`): `all` runs the teacher over
  every channel of the global crops, the student over the step's subset.
--channel-dino-weight W (tokens; `train.channel_dino_weight`): W × a second DINO loss (its own
  centre) on each channel's own token, the mean of its patch tokens after the final norm, from
  the same backbone passes as the CLS, through the DINO head in a call of its own
  (channel_reference.py's `crops_forward`, as train_step_reference.py). Not with
  `--teacher-channels all` (the config refuses the pair too).
--device cuda --precision fp32|bf16|fp16: the step on the GPU (crops made there), with scDINO's
  mixed precision (autocast; fp16 with a GradScaler, unscaled before the clip). The clip is
  scDINO's, with one `.item()` per parameter (a host sync each), as in scDINO.
--count-flops: also counts the FLOPs of student forward+backward and teacher forward with
  torch.utils.flop_counter.FlopCounterMode (matmul/conv/attention; elementwise ops are not
  counted). FlopCounterMode does not see the CPU SDPA kernel, so the count is taken once with
  explicit attention (`q @ k.T`, `attn @ v`: the same multiply-adds).

Prints one JSON line.
"""
import argparse
import json
import math
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "trainer", "tests", "py"))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dino_reference  # noqa: E402
from channel_reference import ChannelVisionTransformer, crops_forward  # noqa: E402
from dino_reference import DINOHead, MultiCropWrapper, VisionTransformer  # noqa: E402
from scdino_input import DataAugmentationDINO, TiffImageFolder, collate_fn  # noqa: E402

dino_reference.USE_SDPA = True

p = argparse.ArgumentParser()
p.add_argument("--arch", default="vit_small")
p.add_argument("--patch", type=int, default=16)
p.add_argument("--channels", type=int, default=5)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--local-crops", type=int, default=8)
p.add_argument("--global-size", type=int, default=224)
p.add_argument("--local-size", type=int, default=96)
p.add_argument("--out-dim", type=int, default=65536)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--warmup", type=int, default=1)
p.add_argument("--iters", type=int, default=3)
p.add_argument("--loader", choices=["none", "real"], default="none")
p.add_argument("--data", help="ImageFolder root of TIFFs (with --loader real)")
p.add_argument("--workers", type=int, default=1)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--count-flops", action="store_true")
p.add_argument("--channel-mode", choices=["fixed", "bag", "tokens"], default="fixed")
p.add_argument("--channel-separate-blocks", type=int, default=0)
p.add_argument("--channel-mixing-blocks", type=int, default=0)
p.add_argument("--teacher-channels", choices=["step", "all"], default="step")
p.add_argument("--channel-dino-weight", type=float, default=0.0)
p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
a = p.parse_args()
if a.device == "cpu" and a.precision != "fp32":
    sys.exit("--precision bf16|fp16 is measured on --device cuda")
DEV = torch.device(a.device)
if a.channel_mode != "fixed" and a.loader != "none":
    sys.exit("--channel-mode bag|tokens is measured with --loader none")
TOKENS_KEYS = (a.channel_separate_blocks or a.channel_mixing_blocks or a.teacher_channels == "all"
               or a.channel_dino_weight)
if TOKENS_KEYS and a.channel_mode != "tokens":
    sys.exit("--channel-separate-blocks, --channel-mixing-blocks, --teacher-channels all and "
             "--channel-dino-weight need --channel-mode tokens")
if min(a.channel_separate_blocks, a.channel_mixing_blocks, a.channel_dino_weight) < 0:
    sys.exit("--channel-separate-blocks, --channel-mixing-blocks and --channel-dino-weight are >= 0")
if a.teacher_channels == "all" and a.channel_dino_weight > 0:
    sys.exit("--channel-dino-weight is not measured with --teacher-channels all (the config "
             "refuses train.channel_dino_weight beside train.teacher_channels: all)")

# scDINO defaults (argparse / yaml): lr 5e-4 per 256 images, wd 0.04, momentum 0.996,
# clip 3.0, teacher temp 0.04, crop scales of the argparse defaults.
LR = 5e-4 * a.batch / 256
WD, MOMENTUM, CLIP, TEACHER_TEMP = 0.04, 0.996, 3.0, 0.04
NCROPS = 2 + a.local_crops


# ---- scDINO's loss, optimizer groups and helpers (main_dino.py, utils.py) ----
class DINOLoss(torch.nn.Module):
    def __init__(self, out_dim, ncrops, teacher_temp):
        super().__init__()
        self.student_temp, self.center_momentum, self.ncrops = 0.1, 0.9, ncrops
        self.register_buffer("center", torch.zeros(1, out_dim))
        self.teacher_temp = teacher_temp

    def forward(self, student_output, teacher_output, epoch):
        student_out = (student_output / self.student_temp).chunk(self.ncrops)
        teacher_out = F.softmax((teacher_output - self.center) / self.teacher_temp, dim=-1)
        teacher_out = teacher_out.detach().chunk(2)
        total_loss, n = 0, 0
        for iq, q in enumerate(teacher_out):
            for v in range(len(student_out)):
                if v == iq:
                    continue
                total_loss += torch.sum(-q * F.log_softmax(student_out[v], dim=-1), dim=-1).mean()
                n += 1
        total_loss /= n
        self.update_center(teacher_output)
        return total_loss

    @torch.no_grad()
    def update_center(self, teacher_output):
        batch_center = torch.sum(teacher_output, dim=0, keepdim=True) / len(teacher_output)
        self.center = self.center * self.center_momentum + batch_center * (1 - self.center_momentum)


def get_params_groups(model):
    regularized, not_regularized = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if name.endswith(".bias") or len(param.shape) == 1:
            not_regularized.append(param)
        else:
            regularized.append(param)
    return [{"params": regularized}, {"params": not_regularized, "weight_decay": 0.0}]


def clip_gradients(model, clip):
    norms = []
    for _, p in model.named_parameters():
        if p.grad is not None:
            param_norm = p.grad.data.norm(2)
            norms.append(param_norm.item())
            clip_coef = clip / (param_norm + 1e-6)
            if clip_coef < 1:
                p.grad.data.mul_(clip_coef)
    return norms


def cancel_gradients_last_layer(epoch, model, freeze_last_layer):
    if epoch >= freeze_last_layer:
        return
    for n, p in model.named_parameters():
        if "last_layer" in n:
            p.grad = None


def dataset_mean_std(ds, n):
    """Population mean/std per channel of the min–max-scaled pixels (untimed; values do
    not change the cost of the step)."""
    xs = [x for x in (ds.load(i) for i in range(min(n, len(ds)))) if x is not None]
    x = torch.stack(xs).double()
    return x.mean(dim=(0, 2, 3)).tolist(), x.std(dim=(0, 2, 3), unbiased=False).tolist()


# ---- networks, loss, optimizer ----
torch.set_num_threads(a.threads)
torch.manual_seed(a.seed)
random.seed(a.seed)
def backbone(**kw):
    if a.channel_mode == "tokens":
        return ChannelVisionTransformer(a.arch, a.patch, a.channels,
                                        separate_blocks=a.channel_separate_blocks,
                                        mixing_blocks=a.channel_mixing_blocks, **kw)
    return VisionTransformer(a.arch, a.patch, 1 if a.channel_mode == "bag" else a.channels, **kw)


vit_s = backbone(drop_path_rate=0.1)
student = MultiCropWrapper(vit_s, DINOHead(vit_s.embed_dim, a.out_dim, norm_last_layer=True))
vit_t = backbone()
teacher = MultiCropWrapper(vit_t, DINOHead(vit_t.embed_dim, a.out_dim))
teacher.load_state_dict(student.state_dict())
for q in teacher.parameters():
    q.requires_grad = False
student.train()
teacher.train()
student.to(DEV)
teacher.to(DEV)
dino_loss = DINOLoss(a.out_dim, NCROPS, TEACHER_TEMP).to(DEV)
channel_loss = DINOLoss(a.out_dim, NCROPS, TEACHER_TEMP).to(DEV) if a.channel_dino_weight > 0 else None
optimizer = torch.optim.AdamW(get_params_groups(student))
# scDINO's mixed precision (main_dino.py): autocast around the forwards and the loss, fp16 with
# a GradScaler (unscale before the clip); bf16 needs no scaler.
AMP_DTYPE = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[a.precision]
scaler = torch.amp.GradScaler("cuda") if a.precision == "fp16" else None


def step(images, epoch=0, teacher_images=None):
    """teacher_images: the teacher's global crops when they are not images[:2]
    (--teacher-channels all)."""
    for i, g in enumerate(optimizer.param_groups):
        g["lr"] = LR
        if i == 0:
            g["weight_decay"] = WD
    images = [im.to(DEV, non_blocking=True) for im in images]
    teacher_images = images[:2] if teacher_images is None else teacher_images
    with torch.autocast(a.device, dtype=AMP_DTYPE, enabled=AMP_DTYPE is not None):
        if channel_loss is None:
            teacher_output = teacher(teacher_images)
            student_output = student(images)
            loss = dino_loss(student_output, teacher_output, epoch)
        else:
            with torch.no_grad():
                teacher_output, _, t_chan = crops_forward(teacher, teacher_images)
            student_output, _, s_chan = crops_forward(student, images)
            loss = dino_loss(student_output, teacher_output, epoch)
            loss = loss + a.channel_dino_weight * channel_loss(s_chan, t_chan, epoch)
    if not math.isfinite(loss.item()):
        sys.exit(f"Loss is {loss.item()}, stopping training")
    optimizer.zero_grad()
    if scaler is None:
        loss.backward()
        clip_gradients(student, CLIP)
        cancel_gradients_last_layer(epoch, student, 0)  # freeze off: every epoch after the first
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        clip_gradients(student, CLIP)
        cancel_gradients_last_layer(epoch, student, 0)
        scaler.step(optimizer)
        scaler.update()
    with torch.no_grad():
        for param_q, param_k in zip(student.parameters(), teacher.parameters()):
            param_k.data.mul_(MOMENTUM).add_((1 - MOMENTUM) * param_q.detach().data)
    return loss.item()


def random_crops():
    b, c = (a.batch * a.channels, 1) if a.channel_mode == "bag" else (a.batch, a.channels)
    return ([torch.randn(b, c, a.global_size, a.global_size, device=DEV) for _ in range(2)]
            + [torch.randn(b, c, a.local_size, a.local_size, device=DEV)
               for _ in range(a.local_crops)])


def hierarchical_channels():
    """The step's channel subset: k uniform on 1..C, then k of the C channels, ascending."""
    k = random.randint(1, a.channels)
    return sorted(random.sample(range(a.channels), k))


def count_flops():
    """FLOPs of teacher forward (globals) + student forward and backward (all crops)."""
    from torch.utils.flop_counter import FlopCounterMode

    crops = random_crops()
    dino_reference.USE_SDPA = False
    center = dino_loss.center.clone()
    channel_center = channel_loss.center.clone() if channel_loss is not None else None
    try:
        with FlopCounterMode(display=False) as fc:
            if channel_loss is None:
                t = teacher(crops[:2])
                s = student(crops)
                dino_loss(s, t, 0).backward()
            else:  # the channel tokens' head call counted too
                t, _, t_chan = crops_forward(teacher, crops[:2])
                s, _, s_chan = crops_forward(student, crops)
                (dino_loss(s, t, 0) + channel_loss(s_chan, t_chan, 0)).backward()
    finally:
        dino_reference.USE_SDPA = True
        dino_loss.center = center
        if channel_loss is not None:
            channel_loss.center = channel_center
        student.zero_grad(set_to_none=True)
    return fc.get_total_flops()


flops = count_flops() if a.count_flops else None

# ---- timing ----
def sync():
    """Waits for the queued teacher EMA, so a step's time holds all its GPU work."""
    if a.device == "cuda":
        torch.cuda.synchronize()


timed = []  # (wall s, data wait s, images)
last_loss = float("nan")
total = a.warmup + a.iters
if a.loader == "none":
    crops = random_crops()
    for it in range(total):
        step_crops, teacher_crops = crops, None
        if a.channel_mode == "tokens":
            ch = hierarchical_channels()
            vit_s.channels = vit_t.channels = ch
            step_crops = [c[:, ch] for c in crops]
            if a.teacher_channels == "all":
                vit_t.channels = list(range(a.channels))
                teacher_crops = crops[:2]
        t = time.perf_counter()
        last_loss = step(step_crops, teacher_images=teacher_crops)
        sync()
        dt = time.perf_counter() - t
        if it >= a.warmup:
            timed.append((dt, 0.0, a.batch))
else:
    if not a.data:
        sys.exit("--loader real needs --data DIR")
    ds = TiffImageFolder(a.data, transform=None)
    if len(ds) < total * a.batch:
        sys.exit(f"{a.data} holds {len(ds)} images; need {total * a.batch}")
    mean, std = dataset_mean_std(ds, 64)
    ds.transform = DataAugmentationDINO(mean, std, a.global_size, a.local_size, a.local_crops)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=a.batch, shuffle=True, num_workers=a.workers, drop_last=False,
        collate_fn=collate_fn, generator=torch.Generator().manual_seed(a.seed),
        persistent_workers=False,
    )
    batches = iter(loader)
    for it in range(total):
        t = time.perf_counter()
        images, _ = next(batches)
        wait = time.perf_counter() - t
        last_loss = step(images)
        sync()
        dt = time.perf_counter() - t
        if it >= a.warmup:
            timed.append((dt, wait, len(images[0])))
    del batches

times = [t[0] for t in timed]
waits = [t[1] for t in timed]
median_s = sorted(times)[len(times) // 2]  # as the Rust side
out = {
    "impl": "pytorch", "bench": "step", "arch": a.arch, "channel_mode": a.channel_mode,
    "device": a.device, "precision": a.precision,
    "channels": a.channels, "loader": a.loader, "batch": a.batch,
    "threads": a.threads, "workers": a.workers if a.loader == "real" else 0,
    "crops": [a.global_size, a.local_size, a.local_crops], "out_dim": a.out_dim,
    "channel_separate_blocks": a.channel_separate_blocks,
    "channel_mixing_blocks": a.channel_mixing_blocks,
    "teacher_channels": a.teacher_channels, "channel_dino_weight": a.channel_dino_weight,
    "median_s": median_s, "imgs_per_s": a.batch / median_s,
    "throughput_imgs_per_s": sum(t[2] for t in timed) / sum(times),
    "times_s": times, "data_wait_s": waits, "data_wait_median_s": sorted(waits)[len(waits) // 2],
    "last_loss": last_loss,
}
if flops is not None:
    out["flops_per_step"] = flops
print(json.dumps(out))
