"""Oracle for the Rust `.pth` reader.

  scdino OUT IN_CHANS SEED EPOCH SEL   a training checkpoint saved as scDINO's main_dino.py saves
                                       it (DDP student, teacher, AdamW with two param groups,
                                       epoch, argparse.Namespace args, dino_loss, fp16_scaler)
  bare OUT IN_CHANS SEED DTYPE         a bare backbone state dict (DINO's released weights)
  zoo DIR                              DIR/proto{2,4}.pth: views, dtypes and Python values, with
                                       pickle protocols 2 (torch's default) and 4; DIR/expected.
                                       safetensors: the same tensors as contiguous copies;
                                       DIR/legacy.pth: the pre-1.6 (non-zip) format
  features CKPT KEY PATHS SEL MEANSTD RESIZE ADAPT OUT
                                       CLS features as compute_CLS_features.py computes them
                                       (load_pretrained_weights, patch-embedding adaptation,
                                       min-max, bilinear resize, normalise, L2) -> OUT safetensors
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

from dino_reference import DINOHead, MultiCropWrapper, VisionTransformer

ARCH, PATCH, OUT_DIM = "vit_tiny", 16, 64


def get_params_groups(model):
    """scDINO utils.get_params_groups: no weight decay on biases and norms."""
    regularized, not_regularized = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if name.endswith(".bias") or len(param.shape) == 1:
            not_regularized.append(param)
        else:
            regularized.append(param)
    return [{"params": regularized}, {"params": not_regularized, "weight_decay": 0.0}]


class DINOLoss(nn.Module):
    """Only what main_dino.py saves of it: the `center` buffer."""

    def __init__(self, out_dim):
        super().__init__()
        self.register_buffer("center", torch.zeros(1, out_dim))


def save_scdino(out, in_chans, seed, epoch, sel):
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as tmp:
        # One gloo rank, so the student is a real DDP module with DDP's state-dict keys.
        dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
        student = MultiCropWrapper(
            VisionTransformer(ARCH, PATCH, in_chans, drop_path_rate=0.1), DINOHead(192, OUT_DIM, hidden_dim=64, bottleneck_dim=32)
        )
        teacher = MultiCropWrapper(VisionTransformer(ARCH, PATCH, in_chans), DINOHead(192, OUT_DIM, hidden_dim=64, bottleneck_dim=32))
        student = nn.parallel.DistributedDataParallel(student)
        teacher.load_state_dict(student.module.state_dict())
        for p in teacher.parameters():
            p.requires_grad = False
        optimizer = torch.optim.AdamW(get_params_groups(student))
        crops = [torch.randn(2, in_chans, 32, 32) for _ in range(2)]
        student(crops).pow(2).mean().backward()
        optimizer.step()
        with torch.no_grad():
            # Move the student well away from the teacher so the tests can tell them apart.
            for p in student.parameters():
                p.add_(0.05 * torch.randn_like(p))
        dino_loss = DINOLoss(OUT_DIM)
        dino_loss.center.normal_()
        args = argparse.Namespace(
            arch=ARCH,
            patch_size=PATCH,
            out_dim=OUT_DIM,
            norm_last_layer=True,
            momentum_teacher=0.996,
            use_fp16=True,
            lr=0.0005,
            global_crops_scale=(0.14, 1.0),
            selected_channels=[int(c) for c in sel],
            channel_dict={0: "aTub", 1: "BF", 2: "DAPI", 3: "Oct4", 4: "PE"},
            norm_per_channel="[(0.1, 0.2), (0.3, 0.4)]",
            output_dir="/outputdir",
            seed=40,
        )
        save_dict = {
            "student": student.state_dict(),
            "teacher": teacher.state_dict(),
            "optimizer": optimizer.state_dict(),
            "epoch": epoch,
            "args": args,
            "dino_loss": dino_loss.state_dict(),
            "fp16_scaler": torch.amp.GradScaler("cpu").state_dict(),
        }
        torch.save(save_dict, out)
        dist.destroy_process_group()
    print(json.dumps(sorted(save_dict["student"].keys())[:3]))


def save_bare(out, in_chans, seed, dtype):
    torch.manual_seed(seed)
    vit = VisionTransformer(ARCH, PATCH, in_chans)
    state = {k: v.to(getattr(torch, dtype)) for k, v in vit.state_dict().items()}
    torch.save(state, out)


def save_zoo(out_dir):
    torch.manual_seed(0)
    base = torch.randn(6, 10)
    tensors = {
        "base": base,
        # Views share base's storage: offset and strides must be honoured.
        "rows": base[2:5],
        "cols_t": base[1:, 3:7].t(),
        "step": base.view(-1)[5::7],
        "half": torch.randn(3, 4).half(),
        "bf16": torch.randn(5).bfloat16(),
        "f64": torch.randn(2, 2, dtype=torch.float64),
        "i64": torch.arange(-3, 4),
        "param": nn.Parameter(torch.randn(4, 2)),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
    }
    obj = {
        "tensors": tensors,
        "nested": {"list": [1, -2, 2**40, -(2**40), 0.25, None, True, False], "tuple": ("a", "é" * 3)},
        "long_text": "x" * 300,
        "args": argparse.Namespace(arch="vit_small", patch_size=8, selected_channels=["0", "3"]),
        "shared": [tensors["rows"], tensors["rows"]],
    }
    for protocol in (2, 4):
        torch.save(obj, os.path.join(out_dir, f"proto{protocol}.pth"), pickle_protocol=protocol)
    expected = {k: v.detach().clone().contiguous() for k, v in tensors.items()}
    save_file(expected, os.path.join(out_dir, "expected.safetensors"))
    torch.save(obj, os.path.join(out_dir, "legacy.pth"), _use_new_zipfile_serialization=False)


def features(ckpt, key, paths, sel, mean_std, resize, adapt, out):
    import tifffile

    sel = json.loads(sel)
    adapt = json.loads(adapt)
    ms = json.load(open(mean_std))
    # scDINO utils.load_pretrained_weights
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    if key in state:
        state = state[key]
    state = {k.replace("module.", ""): v for k, v in state.items()}
    state = {k.replace("backbone.", ""): v for k, v in state.items()}
    in_chans = state["patch_embed.proj.weight"].shape[1]
    model = VisionTransformer(ARCH, PATCH, in_chans).eval()
    msg = model.load_state_dict(state, strict=False)
    assert not msg.missing_keys, msg
    # compute_CLS_features.py: adjusting the patch embedding
    num_channels = len(sel)
    if adapt == "mean":
        average = torch.mean(model.patch_embed.proj.weight, 1, keepdim=True)
        model.patch_embed.proj.weight = nn.Parameter(average.repeat(1, num_channels, 1, 1))
    elif isinstance(adapt, dict):
        seq = [int(adapt[str(c)]) for c in sel]
        model.patch_embed.proj.weight = nn.Parameter(model.patch_embed.proj.weight[:, seq, :, :])
    mean = torch.tensor([ms["mean"][c] for c in sel]).view(-1, 1, 1)
    std = torch.tensor([ms["std"][c] for c in sel]).view(-1, 1, 1)
    rows = []
    for p in open(paths).read().split():
        x = tifffile.imread(p).astype(np.float64)[:, :, sel]
        mn, mx = x.min(axis=(0, 1)), x.max(axis=(0, 1))
        x = torch.from_numpy(((x - mn) / (mx - mn)).astype(np.float32)).permute(2, 0, 1)
        x = F.interpolate(x[None], size=(int(resize), int(resize)), mode="bilinear", align_corners=False)[0]
        rows.append((x - mean) / std)
    with torch.no_grad():
        f = model(torch.stack(rows).float())
    save_file({"features": F.normalize(f, dim=1, p=2).contiguous()}, out)


if __name__ == "__main__":
    cmd, rest = sys.argv[1], sys.argv[2:]
    if cmd == "scdino":
        out, in_chans, seed, epoch, sel = rest
        save_scdino(out, int(in_chans), int(seed), int(epoch), sel)
    elif cmd == "bare":
        out, in_chans, seed, dtype = rest
        save_bare(out, int(in_chans), int(seed), dtype)
    elif cmd == "zoo":
        save_zoo(*rest)
    elif cmd == "features":
        features(*rest)
    else:
        sys.exit(f"unknown command {cmd}")
