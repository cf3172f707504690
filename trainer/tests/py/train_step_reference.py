"""scDINO's training iteration in PyTorch (main_dino.py train_one_epoch + utils), as the oracle
for the Rust step: K iterations from one initialisation on given crops and schedule values.

usage: train_step_reference.py OUT.safetensors STEPS FREEZE_EPOCHS [fixed|tokens|tokens_teacher_all] [KOLEO_WEIGHT] [ema|sinkhorn_knopp] [none|shared|separate MASKS.safetensors] [CHANNEL_DINO_WEIGHT]
Writes OUT (inputs, per-step losses, final weights) and OUT.init.safetensors (initial student).
With `tokens` the backbones are ChannelViT (channel_reference.py) and step i trains on the
channel subset SUBSETS[i] of the crops (as hierarchical channel sampling would draw it), for
the teacher and every crop alike; `tokens_teacher_all` shows the teacher every channel of
the global crops instead (`train.teacher_channels: all`), its masks (with iBOT) the student's
at the student's channels and none at the others. A KOLEO_WEIGHT above 0 adds DINOv2's KoLeo loss
(koleo_reference.py) of the student's backbone CLS on each global crop, times that weight;
`sinkhorn_knopp` takes DINOv2's Sinkhorn-Knopp targets (sinkhorn_reference.py) instead
of the EMA-centred softmax, and leaves the centre alone, as DINOv2 does.
`shared` or `separate` adds DINOv2's iBOT loss (weight IBOT_WEIGHT) on the masked patches of
the global crops, the masks of step i being MASKS' `step{i}` ([2·B, N] bool, drawn by the Rust
side's generator), as dinov2/train/ssl_meta_arch.py computes it: the teacher's unmasked patch
tokens at the masked positions through the DINO head (`shared`, one call together with the CLS
tokens) or a separate `ibot_head` with IBOT_OUT_DIM prototypes, centred with iBOTPatchLoss's
EMA centre (or Sinkhorn-Knopp), against the student's masked-input patch tokens.
A CHANNEL_DINO_WEIGHT above 0 (`tokens` only; `train.channel_dino_weight`) adds that weight
times a second DINO loss, with its own centre (or Sinkhorn-Knopp), on each channel's own
token: the mean of the channel's patch tokens after the final norm, from the same backbone
pass as the CLS (the student's global crops with their masked input), through the DINO head,
rows in (crop, image, channel) order, so every (image, channel) is a sample as in `bag`.
"""
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

import dino_reference
from channel_reference import ChannelVisionTransformer, channel_tokens, crops_forward
from dino_reference import DINOHead, MultiCropWrapper, VisionTransformer
from koleo_reference import KoLeoLoss
from ibot_reference import iBOTPatchLoss
from sinkhorn_reference import sinkhorn_knopp_teacher

dino_reference.USE_SDPA = True
out, steps, freeze_epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mode = sys.argv[4] if len(sys.argv) > 4 else "fixed"
koleo_weight = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
centering = sys.argv[6] if len(sys.argv) > 6 else "ema"
ibot = sys.argv[7] if len(sys.argv) > 7 else "none"
if ibot != "none":
    from safetensors.torch import load_file

    MASKS = load_file(sys.argv[8])
channel_dino_weight = float(sys.argv[9]) if len(sys.argv) > 9 else 0.0
IBOT_WEIGHT, IBOT_OUT_DIM = 1.0, 128
SUBSETS = [[0, 1, 2, 3], [1, 3], [2], [0, 2, 3], [0, 1], [3]]
torch.set_num_threads(2)
torch.manual_seed(0)
OUT_DIM, B, C = 256, 3, 4


def net(drop):
    backbone = ChannelVisionTransformer if mode.startswith("tokens") else VisionTransformer
    if ibot != "none":
        vit = backbone("vit_tiny", 16, C, drop_path_rate=drop, mask_token=True)
    else:
        vit = backbone("vit_tiny", 16, C, drop_path_rate=drop)
    wrapper = MultiCropWrapper(vit, DINOHead(vit.embed_dim, OUT_DIM))
    if ibot == "separate":
        wrapper.ibot_head = DINOHead(vit.embed_dim, IBOT_OUT_DIM)
    return wrapper


def ibot_forward(net, crops, masks, mask_input):
    """ssl_meta_arch.py: global crops with (student) or without (teacher) masked input, their
    CLS and masked patch tokens, the local crops' CLS; heads as configured. With the channel
    DINO term also each channel's token of every crop through the DINO head (else None)."""
    k = crops[0].shape[1]
    cls, patches = net.backbone.forward_features(torch.cat(crops[:2]), masks if mask_input else None)
    tokens = [channel_tokens(patches, k)]
    if len(crops) > 2:
        if channel_dino_weight > 0:
            local_cls, local_patches = net.backbone.forward_features(torch.cat(crops[2:]))
            tokens.append(channel_tokens(local_patches, k))
        else:
            local_cls = net.backbone(torch.cat(crops[2:]))
        cls = torch.cat((cls, local_cls))
    channel_out = net.head(torch.cat(tokens)) if channel_dino_weight > 0 else None
    idx = masks.flatten().nonzero().flatten()
    masked = torch.index_select(patches.flatten(0, 1), 0, idx)
    if ibot == "separate":
        return net.head(cls), cls, net.ibot_head(masked), channel_out
    out = net.head(torch.cat((cls, masked)))
    return out[: len(cls)], cls, out[len(cls):], channel_out


student, teacher = net(0.1), net(0.0)
teacher.load_state_dict(student.state_dict())
for p in teacher.parameters():
    p.requires_grad = False
init = {k: v.clone().contiguous() for k, v in student.state_dict().items()}


class DINOLoss(torch.nn.Module):
    def __init__(self, out_dim, ncrops, temps):
        super().__init__()
        self.student_temp, self.center_momentum, self.ncrops = 0.1, 0.9, ncrops
        self.register_buffer("center", torch.zeros(1, out_dim))
        self.temps = temps

    def forward(self, student_output, teacher_output, epoch):
        student_out = (student_output / self.student_temp).chunk(self.ncrops)
        temp = self.temps[epoch]
        if centering == "sinkhorn_knopp":
            # DINOv2: the assignment replaces the centred softmax; the centre is not updated.
            teacher_out = sinkhorn_knopp_teacher(teacher_output, temp).chunk(2)
        else:
            teacher_out = F.softmax((teacher_output - self.center) / temp, dim=-1).detach().chunk(2)
        total_loss, n = 0, 0
        for iq, q in enumerate(teacher_out):
            for v in range(len(student_out)):
                if v == iq:
                    continue
                total_loss += torch.sum(-q * F.log_softmax(student_out[v], dim=-1), dim=-1).mean()
                n += 1
        total_loss /= n
        if centering == "sinkhorn_knopp":
            return total_loss
        with torch.no_grad():
            batch_center = torch.sum(teacher_output, dim=0, keepdim=True) / len(teacher_output)
            self.center = self.center * self.center_momentum + batch_center * (1 - self.center_momentum)
        return total_loss


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
    for _, p in model.named_parameters():
        if p.grad is not None:
            param_norm = p.grad.data.norm(2)
            clip_coef = clip / (param_norm + 1e-6)
            if clip_coef < 1:
                p.grad.data.mul_(clip_coef)


ncrops = 4
temps = np.concatenate((np.linspace(0.04, 0.07, 2), np.ones(3) * 0.07))
loss_fn = DINOLoss(OUT_DIM, ncrops, temps)
channel_loss_fn = DINOLoss(OUT_DIM, ncrops, temps)
ibot_loss = iBOTPatchLoss(IBOT_OUT_DIM if ibot == "separate" else OUT_DIM)
opt = torch.optim.AdamW(get_params_groups(student))
gen = torch.Generator().manual_seed(1)
tensors = {}
losses = []
for it in range(steps):
    epoch = it // 2  # two iterations per "epoch": exercises the temperature and freeze schedules
    lr, wd, m = 1e-3 * (it + 1), 0.04 + 0.01 * it, 0.99 + 0.001 * it
    crops = [torch.rand(B, C, 64, 64, generator=gen) for _ in range(2)]
    crops += [torch.rand(B, C, 32, 32, generator=gen) for _ in range(ncrops - 2)]
    for i, c in enumerate(crops):
        tensors[f"in.step{it}.crop{i}"] = c
    tensors[f"in.step{it}.params"] = torch.tensor([lr, wd, m, epoch], dtype=torch.float64)
    for i, g in enumerate(opt.param_groups):
        g["lr"] = lr
        if i == 0:
            g["weight_decay"] = wd
    teacher_crops = crops[:2]
    if mode.startswith("tokens"):
        ch = SUBSETS[it % len(SUBSETS)]
        tensors[f"in.step{it}.channels"] = torch.tensor(ch, dtype=torch.int64)
        crops = [c[:, ch] for c in crops]
        student.backbone.channels = teacher.backbone.channels = ch
        if mode == "tokens_teacher_all":
            teacher.backbone.channels = list(range(C))
        else:
            teacher_crops = crops[:2]
    torch.manual_seed(1000 + it)
    if ibot != "none":
        masks = MASKS[f"step{it}"].bool()  # tokens: already [2B, k·N], channel-major
        teacher_masks = masks
        if mode == "tokens_teacher_all":
            per_channel = masks.reshape(2 * B, len(ch), -1)
            teacher_masks = torch.zeros(2 * B, C, per_channel.shape[2], dtype=torch.bool)
            teacher_masks[:, ch] = per_channel
            teacher_masks = teacher_masks.flatten(1)
        with torch.no_grad():
            teacher_output, _, t_patch, t_chan = ibot_forward(teacher, teacher_crops, teacher_masks, False)
        student_output, cls, s_patch, s_chan = ibot_forward(student, crops, masks, True)
        temp = temps[epoch]
        if centering == "sinkhorn_knopp":
            targets = ibot_loss.sinkhorn_knopp_teacher(t_patch, temp, len(t_patch))
        else:
            targets = ibot_loss.softmax_center_teacher(t_patch, temp)
            # DINOv2 passes [1, M, K] (after its unsqueeze(0)): the mean over the patches.
            ibot_loss.update_center(t_patch.unsqueeze(0))
        loss = loss_fn(student_output, teacher_output, epoch)
        loss = loss + IBOT_WEIGHT * ibot_loss.forward_masked(s_patch, targets, masks)
        if channel_dino_weight > 0:
            loss = loss + channel_dino_weight * channel_loss_fn(s_chan, t_chan, epoch)
        if koleo_weight > 0:
            loss = loss + koleo_weight * sum(KoLeoLoss()(c) for c in cls[: 2 * B].chunk(2))
    elif channel_dino_weight > 0:
        with torch.no_grad():
            teacher_output, _, t_chan = crops_forward(teacher, teacher_crops)
        student_output, cls, s_chan = crops_forward(student, crops)
        loss = loss_fn(student_output, teacher_output, epoch)
        loss = loss + channel_dino_weight * channel_loss_fn(s_chan, t_chan, epoch)
        if koleo_weight > 0:
            loss = loss + koleo_weight * sum(KoLeoLoss()(c) for c in cls[: 2 * B].chunk(2))
    elif koleo_weight > 0:
        teacher_output = teacher(teacher_crops)
        # DINOv2 (ssl_meta_arch.py): weight × Σ over the global crops of KoLeo(CLS).
        student.return_backbone = True
        student_output, cls = student(crops)
        loss = loss_fn(student_output, teacher_output, epoch)
        loss = loss + koleo_weight * sum(KoLeoLoss()(c) for c in cls[: 2 * B].chunk(2))
    else:
        teacher_output = teacher(teacher_crops)
        student_output = student(crops)
        loss = loss_fn(student_output, teacher_output, epoch)
    opt.zero_grad()
    loss.backward()
    clip_gradients(student, 3.0)
    if epoch < freeze_epochs:
        for n, p in student.named_parameters():
            if "last_layer" in n:
                p.grad = None
    opt.step()
    with torch.no_grad():
        for pq, pk in zip(student.parameters(), teacher.parameters()):
            pk.data.mul_(m).add_((1 - m) * pq.detach().data)
    losses.append(loss.item())

tensors["out.losses"] = torch.tensor(losses, dtype=torch.float64)
tensors["out.center"] = loss_fn.center
if channel_dino_weight > 0:
    tensors["out.channel_center"] = channel_loss_fn.center
if ibot != "none":
    tensors["out.ibot_center"] = ibot_loss.center.reshape(1, -1)
for k, v in student.state_dict().items():
    tensors[f"out.student.{k}"] = v
for k, v in teacher.state_dict().items():
    tensors[f"out.teacher.{k}"] = v
save_file({k: v.contiguous() for k, v in tensors.items()}, out)
save_file(init, out + ".init.safetensors")
