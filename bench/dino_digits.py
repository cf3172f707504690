"""Does DINO learn? A full PyTorch reference scDINO training run on the digits dataset, with a
weighted-kNN probe of the teacher's CLS features after every epoch.

    .venv/bin/python scripts/digits.py --out /tmp/digits --size 16
    .venv/bin/python bench/dino_digits.py --data /tmp/digits [hyperparameters...]

The data is the folder `scripts/digits.py` writes: `DATA/Training/<class>/*.tiff` trains DINO
and is the kNN memory bank; `DATA/Test/**/<class>/*.tiff` are the kNN queries. The label of a
file is the name of its parent folder.

What is reused (imported, not copied):
  * trainer/tests/py/dino_reference.py: VisionTransformer, DINOHead, MultiCropWrapper;
  * trainer/tests/py/koleo_reference.py, sinkhorn_reference.py, ibot_reference.py: DINOv2's
    KoLeo, Sinkhorn-Knopp and iBOT patch loss (--koleo-weight, --centering sinkhorn_knopp,
    --ibot-weight; with --num-register-tokens the ViT's register tokens), the same oracles the
    trainer's step is tested against; DINOv2's MaskingGenerator and mask collation are
    re-stated below (Python's `random`, seeded, draws the masks); the teacher's iBOT forward
    sees the global crops only, as ssl_meta_arch.py and train_step_reference.py;
  * trainer/tests/py/channel_reference.py: ChannelVisionTransformer (its channel-separate and
    channel-mixing block masks) and tokens_pooled_features (--channel-mode tokens,
    --separate-blocks, --mixing-blocks, --tokens-pool);
  * bench/scdino_input.py: TiffImageFolder (tifffile.imread, float64, min–max per image and
    channel with scDINO's zero-max rule) and DataAugmentationDINO (multi-channel multi-crop:
    RandomResizedCrop bicubic, horizontal + vertical flips p=0.5, per-channel brightness p=0.8,
    Gaussian blur p=1.0/0.1/0.5, solarisation p=0.2 on global crop 2, Normalize).
What is re-stated here because bench/train_step.py is a script (it parses argv and runs at
import) and keeps lr/wd/momentum/temperature constant: scDINO's DINOLoss with the per-epoch
teacher-temperature schedule, `cosine_scheduler`, the two AdamW parameter groups, per-parameter
`clip_gradients`, `cancel_gradients_last_layer` and the teacher EMA (main_dino.py L300-487,
utils.py L320-386, L824-835), the same code as in bench/train_step.py.

Departures from scDINO, all for a 1,437-image CPU run:
  * the images are decoded and min–max scaled once and kept in memory (same values as reading
    each epoch); DataLoader with num_workers 0, shuffled by a seeded generator, drop_last False
    (True with --use-bn-in-head, where a batch of one cannot be normalised);
  * the whole Training folder is trained on (no 80/20 split inside it; the Test folder is the
    held-out part) and the dataset mean/std is taken over every Training pixel (scDINO: a
    seed-42 20 % subset). A channel with std 0 (a constant stain) gets std 1, because
    torchvision's Normalize refuses std 0 (scDINO would stop there);
  * the geometric and photometric augmentations can be switched off one by one (--no-flips,
    --no-blur, --no-solarize, --no-brightness): the built DataAugmentationDINO is kept and the
    switched-off transforms are removed from its Compose lists. scDINO itself always applies
    all of them (flips turn a 6 into a 9 upside-down; a 2 into an S-like shape mirrored).

Evaluation (epoch -1 = untrained, then after each epoch): the teacher backbone (as
compute_CLS_features.py, checkpoint_key "teacher") in eval mode on the eval transform
(min–max per image and channel, Resize to --global-size bilinear, Normalize), rows
L2-normalised; DINO's weighted kNN (eval_knn.py: cosine similarity, top-k, weights
exp(sim/T), votes summed per class, argmax) with the Training features as the bank and the Test
features as queries, T = 0.07, k = 20 and 10. Next to it a linear probe on the same
L2-normalised features: scikit-learn LogisticRegression (lbfgs, max_iter 1000; multinomial, which
is lbfgs's only multi-class mode in current scikit-learn) with C chosen from 0.1, 1, 10, 100 by
accuracy on a seeded (--seed), stratified 20 % validation split of the Training features (ties:
the smaller C), then refit on all Training features and scored on the Test features
(`probe_top1`, percent; `probe_c`, the chosen C). Raw-pixel kNN and linear probe (the same
eval-transformed pixels, flattened, L2-normalised) are reported once as a baseline.

Channel-adaptive models (`--channel-mode`, the trainer's `model.channels`): `tokens` is
ChannelViT (trainer/tests/py/channel_reference.py, the oracle of the trainer's tests) with the
trainer's orthogonal channel embedding (`--channel-embed-std`), optional channel-separate
blocks (`--separate-blocks N`, `model.channel_separate_blocks`: in the first N blocks a patch
token attends only to its own channel's patch tokens, the CLS and registers to everything)
followed by optional channel-mixing blocks (`--mixing-blocks`, `model.channel_mixing_blocks`:
a patch token attends to its position in every channel and to the CLS and registers), both
channel_reference.py's masks (`block_masks`; N + mixing <= depth), each step on a subset drawn
by hierarchical channel sampling (k uniform on 1..C, then k channels; iBOT masks a position in
every channel) or, with probability `--single-channel-steps F` (`train.single_channel_steps`),
one channel alone drawn uniformly (the trainer's draw from its own stream, here from Python's
`random`: the same distribution); `bag` trains a single-channel ViT on every channel of every image as its own
sample (an epoch is C× the steps), each augmented and normalised with its channel's mean/std.
`--channel-dino-weight W` (tokens, `train.channel_dino_weight`) adds W × a second DINO loss
(a DINOLoss of its own: its own EMA centre, or Sinkhorn-Knopp; the same temperatures) on each
channel's own token, the mean of its patch tokens after the final norm (registers left out),
from the same backbone pass as the CLS (the student's global crops with iBOT: the masked-input
pass), through the DINO head in a call of its own, rows in (crop, image, channel) order so
every (image, channel) is a sample: channel_reference.py's `channel_tokens` and
`crops_forward`, which trainer/tests/py/train_step_reference.py uses too, and its
`ibot_forward` re-stated here (that file is a script). The epoch line then holds
`loss_channel_dino` (unweighted). At 0 (the default) the step
is the one without the option, forward for forward. `--ibot-separate-head` sends iBOT's
masked patch tokens through a head of their own (DINOv2's `ibot_head`; the trainer's
`train.ibot.separate_head`), and the DINO head sees the CLS rows alone. Both are probed on every combination
(`--combinations`): `tokens` by the CLS over the combination's channels (`--tokens-pool cls`)
or, with `--tokens-pool cls_and_channels` (`downstream.features.tokens_pool`),
channel_reference.py's `tokens_pooled_features`: the CLS and each channel's mean patch token,
each L2-normalised, concatenated ((k+1)·D; the prototype diagnostics still read the CLS), or
with `--tokens-pool joint_and_alone` its `tokens_joint_and_alone_features` (that feature of the
pass over the combination, then each channel's from a pass over it alone); `bag`
by the concatenated L2-normalised per-channel CLS tokens; the epoch lines hold each
combination's kNN and probe under `combinations`, and their top-level `knn20` etc. are the
all-channel combination's. `--img-size` sets the position table's size (the trainer's
`model.img_size`, 224 unless set; this script's default is the global crop size, as before).

Collapse diagnostics, per epoch over the training batches: mean loss; `t_ent`, mean entropy of
the centred, sharpened teacher distribution of one image (→ ln(out_dim) is the uniform
collapse: loss → ln(out_dim) too; → 0 with one prototype for all is the other collapse);
`t_ent_batch`, entropy of the batch-averaged teacher distribution (how many prototypes the batch
spreads over, as exp); `protos_batch`, mean number of distinct teacher argmax prototypes per
batch (of 2B global crops); `protos_epoch`, distinct argmax prototypes over the epoch. With
each kNN probe: `protos_eval`, distinct prototypes the teacher (eval mode, centred) assigns to
the un-augmented Training images, and `purity`, the share of those images whose prototype's
majority digit is their own (clusters that follow the digits give a high purity with few
prototypes).

Defaults are scDINO's (argparse) hyperparameters scaled to this data: vit_tiny, 16-px global /
8-px local crops, patch 4, out_dim 1024, 10 epochs. scDINO's defaults collapse here; see the
report of the recipe search (the module only measures).

Prints a header JSON line (configuration, dataset mean/std, raw-pixel kNN and probe), one line
per epoch (epoch -1 = untrained) and a summary line; with --json-out also appends each line to
that file as it is printed (flushed, so a killed run leaves its lines; the file is truncated at
the start). The summary's `best` is the whole record (epoch, kNN, probe, prototypes) of the
evaluated epoch with the highest knn20 (the earliest on ties; epoch -1 if training never beats
the untrained network).
"""
import argparse
import json
import math
import os
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "trainer", "tests", "py"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dino_reference  # noqa: E402
from channel_reference import (  # noqa: E402
    ChannelVisionTransformer, channel_tokens, crops_forward, tokens_joint_and_alone_features,
    tokens_pooled_features)
from dino_reference import ARCHS, DINOHead, MultiCropWrapper, VisionTransformer  # noqa: E402
from ibot_reference import iBOTPatchLoss  # noqa: E402
from koleo_reference import KoLeoLoss  # noqa: E402
from sinkhorn_reference import sinkhorn_knopp_teacher  # noqa: E402
from scdino_input import DataAugmentationDINO, TiffImageFolder  # noqa: E402


def pair(s):
    lo, hi = (float(v) for v in s.split(","))
    return lo, hi


def str2bool(s):
    if s.lower() in ("1", "true", "yes", "on"):
        return True
    if s.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {s}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="PyTorch reference DINO run on the digits dataset "
                                "with a per-epoch kNN probe (see the module docstring).")
    p.add_argument("--data", required=True, help="root written by scripts/digits.py")
    # model (scDINO keys: arch, patch_size, out_dim, norm_last_layer, use_bn_in_head,
    # drop_path_rate)
    p.add_argument("--arch", default="vit_tiny", choices=["vit_tiny", "vit_small", "vit_base"])
    p.add_argument("--patch-size", type=int, default=4)
    p.add_argument("--out-dim", type=int, default=1024)
    p.add_argument("--norm-last-layer", type=str2bool, default=True)
    p.add_argument("--use-bn-in-head", type=str2bool, default=False)
    p.add_argument("--drop-path-rate", type=float, default=0.1)
    # optimisation (epochs, batch_size_per_gpu, lr, min_lr, warmup_epochs, weight_decay,
    # weight_decay_end, clip_grad, freeze_last_layer, momentum_teacher)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64, help="batch_size_per_gpu (world 1)")
    p.add_argument("--lr", type=float, default=5e-4, help="peak lr per 256 images (scaled "
                   "linearly by batch/256)")
    p.add_argument("--min-lr", type=float, default=1e-6)
    p.add_argument("--warmup-epochs", type=int, default=10)
    p.add_argument("--weight-decay", type=float, default=0.04)
    p.add_argument("--weight-decay-end", type=float, default=0.4)
    p.add_argument("--clip-grad", type=float, default=3.0)
    p.add_argument("--freeze-last-layer", type=int, default=1)
    p.add_argument("--momentum-teacher", type=float, default=0.996)
    # DINO loss (warmup_teacher_temp, teacher_temp, warmup_teacher_temp_epochs; student 0.1)
    p.add_argument("--warmup-teacher-temp", type=float, default=0.04)
    p.add_argument("--teacher-temp", type=float, default=0.04)
    p.add_argument("--warmup-teacher-temp-epochs", type=int, default=0)
    p.add_argument("--student-temp", type=float, default=0.1)
    # DINOv2's stabilisers (issue 22), each off by default as in the trainer.
    p.add_argument("--koleo-weight", type=float, default=0.0,
                   help="KoLeo on the student's global-crop CLS, per crop (DINOv2: 0.1)")
    p.add_argument("--centering", choices=["ema", "sinkhorn_knopp"], default="ema")
    p.add_argument("--ibot-weight", type=float, default=0.0,
                   help="iBOT masked-patch loss weight, shared head (DINOv2: 1.0; 0 = off)")
    p.add_argument("--ibot-separate-head", type=str2bool, default=False,
                   help="iBOT's masked patches through a head of their own (train.ibot."
                   "separate_head: the DINO head's layout with --out-dim prototypes, without "
                   "BatchNorm), its own last layer frozen and EMA'd as the DINO head's")
    p.add_argument("--ibot-mask-probability", type=float, default=0.5)
    p.add_argument("--ibot-mask-ratio", type=pair, default=(0.1, 0.5))
    p.add_argument("--num-register-tokens", type=int, default=0)
    # channel-adaptive models (model.channels, channel_mixing_blocks, channel_embed_std,
    # img_size)
    p.add_argument("--channel-mode", choices=["fixed", "tokens", "bag"], default="fixed",
                   help="fixed: one ViT over all channels (scDINO); tokens: ChannelViT, each "
                   "step on a hierarchical channel subset; bag: each channel of each image its "
                   "own single-channel sample")
    p.add_argument("--combinations", default=None,
                   help="tokens/bag: the channel combinations probed, comma-separated strings "
                   "of channel indices (e.g. 0,1,2,3,0123,02; default: each channel alone and "
                   "all together); knn20 etc. at the top level are the all-channel one's")
    p.add_argument("--mixing-blocks", type=int, default=0, help="tokens: channel-mixing blocks "
                   "(model.channel_mixing_blocks), after the --separate-blocks ones")
    p.add_argument("--separate-blocks", type=int, default=0,
                   help="tokens: channel-separate blocks (model.channel_separate_blocks): the "
                   "first N blocks, where a patch token attends only to its own channel's patch "
                   "tokens (the CLS and registers to everything); N + --mixing-blocks <= depth")
    p.add_argument("--channel-dino-weight", type=float, default=0.0,
                   help="tokens: weight of a second DINO loss (own centre, or Sinkhorn-Knopp) on "
                   "each channel's mean patch token through the DINO head "
                   "(train.channel_dino_weight; 0 = off)")
    p.add_argument("--tokens-pool", default="cls",
                   help="tokens: the probed features of a combination "
                   "(downstream.features.tokens_pool): cls, the CLS token; cls_and_channels, "
                   "the CLS and each channel's mean patch token, each L2-normalised, "
                   "concatenated; joint_and_alone, that feature of the pass over the "
                   "combination, then each channel's from a pass over it alone. A "
                   "comma-separated list probes each: the first as `combinations`, every "
                   "other as `combinations_<pool>`")
    p.add_argument("--single-channel-steps", type=float, default=0.0,
                   help="tokens: the fraction of steps on one channel alone, drawn uniformly "
                   "(train.single_channel_steps; 0 = every step hierarchical)")
    p.add_argument("--channel-embed-std", type=float, default=0.02,
                   help="tokens: the channel embedding's init scale (orthogonal rows)")
    p.add_argument("--img-size", type=int, default=None,
                   help="the position table's image size (model.img_size; the trainer's "
                   "default is 224); default here: the global crop size")
    # multi-crop (global_crops_scale, global_crop_size, local_crops_number, local_crops_scale,
    # local_crop_size)
    p.add_argument("--global-crop-size", type=int, default=16)
    p.add_argument("--local-crop-size", type=int, default=8)
    p.add_argument("--global-crops-scale", type=pair, default=(0.4, 1.0))
    p.add_argument("--local-crops-scale", type=pair, default=(0.05, 0.4))
    p.add_argument("--local-crops-number", type=int, default=8)
    # augmentation switches (scDINO: all on)
    p.add_argument("--no-flips", action="store_true", help="drop the horizontal/vertical flips")
    p.add_argument("--no-blur", action="store_true")
    p.add_argument("--no-solarize", action="store_true")
    p.add_argument("--no-brightness", action="store_true")
    # run
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=1, help="kNN probe every N epochs "
                   "(the last epoch is always evaluated)")
    p.add_argument("--knn-t", type=float, default=0.07)
    p.add_argument("--sdpa", action="store_true", help="fused attention kernel (faster; the "
                   "Rust model uses it too)")
    p.add_argument("--json-out", help="also write the JSON lines to this file (each line "
                   "appended and flushed as it is printed)")
    a = p.parse_args(argv)
    depth = ARCHS[a.arch][1]
    if a.separate_blocks < 0 or a.mixing_blocks < 0:
        p.error("--separate-blocks and --mixing-blocks must be >= 0")
    if a.separate_blocks + a.mixing_blocks > depth:
        p.error(f"--separate-blocks {a.separate_blocks} + --mixing-blocks {a.mixing_blocks} "
                f"exceed {a.arch}'s {depth} blocks")
    a.tokens_pools = a.tokens_pool.split(",")
    for pool in a.tokens_pools:
        if pool not in ("cls", "cls_and_channels", "joint_and_alone"):
            p.error(f"--tokens-pool: {pool} is not cls, cls_and_channels or joint_and_alone")
    a.tokens_pool = a.tokens_pools[0]
    if a.channel_dino_weight < 0:
        p.error("--channel-dino-weight must be >= 0")
    if not 0.0 <= a.single_channel_steps <= 1.0:
        p.error("--single-channel-steps must be in [0, 1]")
    if a.ibot_separate_head and a.ibot_weight <= 0:
        p.error("--ibot-separate-head needs --ibot-weight > 0")
    if a.channel_mode != "tokens":
        for flag, on in (("--separate-blocks", a.separate_blocks > 0),
                         ("--channel-dino-weight", a.channel_dino_weight > 0),
                         ("--single-channel-steps", a.single_channel_steps > 0),
                         ("--tokens-pool " + a.tokens_pool, a.tokens_pools != ["cls"])):
            if on:
                p.error(f"{flag} needs --channel-mode tokens (got {a.channel_mode})")
    return a


# ---- scDINO's loss, schedules and optimiser helpers (main_dino.py, utils.py) ----
class DINOLoss(torch.nn.Module):
    def __init__(self, out_dim, ncrops, warmup_teacher_temp, teacher_temp,
                 warmup_teacher_temp_epochs, nepochs, student_temp=0.1, center_momentum=0.9,
                 centering="ema"):
        super().__init__()
        self.centering = centering
        self.student_temp, self.center_momentum, self.ncrops = student_temp, center_momentum, ncrops
        self.register_buffer("center", torch.zeros(1, out_dim))
        self.teacher_temp_schedule = np.concatenate((
            np.linspace(warmup_teacher_temp, teacher_temp, warmup_teacher_temp_epochs),
            np.ones(nepochs - warmup_teacher_temp_epochs) * teacher_temp))
        self.last_teacher_probs = None

    def forward(self, student_output, teacher_output, epoch):
        student_out = (student_output / self.student_temp).chunk(self.ncrops)
        temp = self.teacher_temp_schedule[epoch]
        if self.centering == "sinkhorn_knopp":
            # DINOv2: the assignment replaces the centred softmax; the centre is not updated.
            teacher_probs = sinkhorn_knopp_teacher(teacher_output, temp).detach()
        else:
            teacher_probs = F.softmax((teacher_output - self.center) / temp, dim=-1).detach()
        self.last_teacher_probs = teacher_probs
        teacher_out = teacher_probs.chunk(2)
        total_loss, n = 0, 0
        for iq, q in enumerate(teacher_out):
            for v in range(len(student_out)):
                if v == iq:
                    continue
                total_loss += torch.sum(-q * F.log_softmax(student_out[v], dim=-1), dim=-1).mean()
                n += 1
        total_loss /= n
        if self.centering != "sinkhorn_knopp":
            self.update_center(teacher_output)
        return total_loss

    @torch.no_grad()
    def update_center(self, teacher_output):
        batch_center = torch.sum(teacher_output, dim=0, keepdim=True) / len(teacher_output)
        self.center = self.center * self.center_momentum + batch_center * (1 - self.center_momentum)


# ---- DINOv2's masking (dinov2/data/masking.py, collate.py) and iBOT forward (ssl_meta_arch.py) ----
class MaskingGenerator:
    """dinov2/data/masking.py: block masks of aspect 0.3..1/0.3, at least 4 patches a block."""

    def __init__(self, size, max_num_patches, min_num_patches=4, min_aspect=0.3):
        self.height = self.width = size
        self.min_num_patches, self.max_num_patches = min_num_patches, max_num_patches
        self.log_aspect_ratio = (math.log(min_aspect), math.log(1 / min_aspect))

    def _mask(self, mask, max_mask_patches):
        delta = 0
        for _ in range(10):
            target_area = random.uniform(self.min_num_patches, max_mask_patches)
            aspect_ratio = math.exp(random.uniform(*self.log_aspect_ratio))
            h = int(round(math.sqrt(target_area * aspect_ratio)))
            w = int(round(math.sqrt(target_area / aspect_ratio)))
            if w < self.width and h < self.height:
                top = random.randint(0, self.height - h)
                left = random.randint(0, self.width - w)
                num_masked = mask[top:top + h, left:left + w].sum()
                if 0 < h * w - num_masked <= max_mask_patches:
                    for i in range(top, top + h):
                        for j in range(left, left + w):
                            if mask[i, j] == 0:
                                mask[i, j] = 1
                                delta += 1
                if delta > 0:
                    break
        return delta

    def __call__(self, num_masking_patches=0):
        mask = np.zeros((self.height, self.width), dtype=bool)
        count = 0
        while count < num_masking_patches:
            delta = self._mask(mask, min(num_masking_patches - count, self.max_num_patches))
            if delta == 0:
                break
            count += delta
        return mask


def draw_masks(n_images, generator, probability, ratio):
    """collate_data_and_cast: int(n·probability) images masked, their ratios spread over
    `ratio` in equal bins, the rest unmasked, shuffled; [n, N] bool."""
    n_tokens = generator.height * generator.width
    n_masked = int(n_images * probability)
    probs = torch.linspace(ratio[0], ratio[1], n_masked + 1)
    masks = [torch.from_numpy(generator(int(n_tokens * random.uniform(probs[i], probs[i + 1]))))
             for i in range(n_masked)]
    masks += [torch.from_numpy(generator(0)) for _ in range(n_masked, n_images)]
    random.shuffle(masks)
    return torch.stack(masks).flatten(1)


def ibot_forward(net, crops, masks, mask_input, channel_dino=False):
    """The global crops with (student) or without (teacher) the mask token, their CLS and the
    masked patch tokens, the local crops' CLS; DINO head and iBOT share the head (one call).
    With channel_dino (--channel-dino-weight) also each channel's token of every crop, from the
    same backbone passes, through the DINO head in a call of its own, rows in (crop, image,
    channel) order (train_step_reference.py's ibot_forward); else None."""
    k = crops[0].shape[1]
    cls, patches = net.backbone.forward_features(torch.cat(crops[:2]), masks if mask_input else None)
    tokens = [channel_tokens(patches, k)] if channel_dino else None
    if len(crops) > 2:
        if channel_dino:
            local_cls, local_patches = net.backbone.forward_features(torch.cat(crops[2:]))
            tokens.append(channel_tokens(local_patches, k))
        else:
            local_cls = net.backbone(torch.cat(crops[2:]))
        cls = torch.cat((cls, local_cls))
    idx = masks.flatten().nonzero().flatten()
    masked = torch.index_select(patches.flatten(0, 1), 0, idx)
    if getattr(net, "ibot_head", None) is not None:
        # --ibot-separate-head: the DINO head sees the CLS rows alone (its BatchNorm too).
        out = torch.cat((net.head(cls), net.ibot_head(masked)))
    else:
        out = net.head(torch.cat((cls, masked)))
    channel_out = net.head(torch.cat(tokens)) if channel_dino else None
    return out[: len(cls)], cls, out[len(cls):], channel_out


def cosine_scheduler(base_value, final_value, epochs, niter_per_ep, warmup_epochs=0,
                     start_warmup_value=0):
    warmup_schedule = np.array([])
    warmup_iters = warmup_epochs * niter_per_ep
    if warmup_epochs > 0:
        warmup_schedule = np.linspace(start_warmup_value, base_value, warmup_iters)
    iters = np.arange(epochs * niter_per_ep - warmup_iters)
    schedule = final_value + 0.5 * (base_value - final_value) * (1 + np.cos(np.pi * iters / len(iters)))
    schedule = np.concatenate((warmup_schedule, schedule))
    assert len(schedule) == epochs * niter_per_ep
    return schedule


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


def cancel_gradients_last_layer(epoch, model, freeze_last_layer):
    if epoch >= freeze_last_layer:
        return
    for n, p in model.named_parameters():
        if "last_layer" in n:
            p.grad = None


# ---- data ----
class Images:
    """Every image of one folder tree, loaded once with scDINO's dataset semantics."""

    def __init__(self, root):
        folder = TiffImageFolder(root, transform=None)
        self.paths = [s[0] for s in folder.samples]
        self.names = [os.path.basename(os.path.dirname(p)) for p in self.paths]
        xs = []
        for i in range(len(folder)):
            x = folder.load(i) if _is_3d(self.paths[i]) else _load_2d(folder, i)
            if x is None:
                sys.exit(f"{self.paths[i]}: NaN after min–max (scDINO drops such images)")
            xs.append(x)
        self.x = torch.stack(xs)  # N, C, H, W float32 in [0, 1]


def _is_3d(path):
    import tifffile

    with tifffile.TiffFile(path) as t:
        return len(t.series[0].shape) == 3


def _load_2d(folder, i):
    """A single-channel file reads back as (H, W); give it scDINO's (H, W, 1) channel axis."""
    import tifffile

    from scdino_input import normalize_numpy_0_to_1

    x = tifffile.imread(folder.samples[i][0]).astype(np.float64)[:, :, None]
    x = normalize_numpy_0_to_1(x)
    return None if np.isnan(x).any() else torch.from_numpy(x.astype(np.float32)).permute(2, 0, 1)


class Augmented(torch.utils.data.Dataset):
    def __init__(self, x, transform):
        self.x, self.transform = x, transform

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.transform(self.x[i]), i


class BagItems(torch.utils.data.Dataset):
    """Bag-of-Channels' samples: every channel of every image is its own single-channel image,
    augmented with its channel's mean/std (item j = image j // C, channel j % C, as the
    trainer's `BagOfChannels::items`)."""

    def __init__(self, x, transforms):
        self.x, self.transforms = x, transforms

    def __len__(self):
        return len(self.x) * len(self.transforms)

    def __getitem__(self, j):
        i, c = divmod(j, len(self.transforms))
        return self.transforms[c](self.x[i, c:c + 1]), j


def hierarchical_subset(rng, channels):
    """ChannelViT's hierarchical channel sampling as the trainer draws it
    (model/channels/hierarchical.rs): k uniform on 1..C, then k distinct channels uniformly,
    ascending (from Python's `random`, not the trainer's stream: the same distribution)."""
    k = rng.randint(1, channels)
    return sorted(rng.sample(range(channels), k))


def orthogonal_channel_embed(vit, std):
    """The trainer's (and DiChaViT's) channel embedding at init: orthogonal rows, each of norm
    std·√D (`model.channel_embed_std`), instead of the reference's trunc-normal."""
    _, dim, channels, _, _ = vit.patch_embed.channel_embed.shape
    w = torch.empty(channels, dim)
    torch.nn.init.orthogonal_(w)
    with torch.no_grad():
        vit.patch_embed.channel_embed.copy_((w * std * math.sqrt(dim)).t().reshape(1, dim, channels, 1, 1))


def build_augmentation(a, mean, std):
    from torchvision import transforms as T

    from scdino_input import AdjustBrightness, GaussianBlurMultiChan, SolarizationMultiChan

    aug = DataAugmentationDINO(mean, std, a.global_crop_size, a.local_crop_size,
                               a.local_crops_number, a.global_crops_scale, a.local_crops_scale)
    drop = []
    if a.no_flips:
        drop += [T.RandomHorizontalFlip, T.RandomVerticalFlip]
    if a.no_blur:
        drop.append(GaussianBlurMultiChan)
    if a.no_solarize:
        drop.append(SolarizationMultiChan)
    if a.no_brightness:
        drop.append(AdjustBrightness)
    for comp in (aug.global1, aug.global2, aug.local):
        comp.transforms = [t for t in comp.transforms if not isinstance(t, tuple(drop))]
        # `flips` is a nested Compose of the two flips
        for t in comp.transforms:
            if isinstance(t, T.Compose):
                t.transforms = [u for u in t.transforms if not isinstance(u, tuple(drop))]
    return aug


def eval_inputs(x, size, mean, std):
    """compute_CLS_features.py's transform after min–max: Resize(size) bilinear, Normalize."""
    if x.shape[-1] != size or x.shape[-2] != size:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    m = torch.tensor(mean, dtype=x.dtype).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype).view(1, -1, 1, 1)
    return (x - m) / s


# ---- kNN probe ----
@torch.no_grad()
def knn_top1(bank, bank_labels, queries, query_labels, k, T, num_classes):
    """DINO eval_knn.py knn_classifier: weighted votes exp(sim/T) over the top-k neighbours."""
    sim = queries @ bank.t()
    k = min(k, bank.shape[0])
    d, idx = sim.topk(k, dim=1, largest=True, sorted=True)
    cand = bank_labels[idx]  # Q, k
    one_hot = torch.zeros(cand.shape[0] * k, num_classes)
    one_hot.scatter_(1, cand.reshape(-1, 1), 1)
    votes = (one_hot.view(cand.shape[0], k, num_classes) * (d / T).exp().unsqueeze(-1)).sum(1)
    pred = votes.argmax(1)
    return 100.0 * (pred == query_labels).float().mean().item()


PROBE_CS = (0.1, 1.0, 10.0, 100.0)


def linear_probe(x_train, y_train, x_test, y_test, seed, threads, cs=PROBE_CS):
    """Multinomial logistic regression (lbfgs, max_iter 1000) on L2-normalised features: C by
    accuracy on a seeded, stratified 20 % validation split of the training rows (ties: the
    smaller C), then refit on all training rows; top-1 on the test rows in percent."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from threadpoolctl import threadpool_limits

    xtr = x_train.detach().double().numpy()
    xte = x_test.detach().double().numpy()
    ytr, yte = y_train.numpy(), y_test.numpy()
    fit_idx, val_idx = train_test_split(np.arange(len(ytr)), test_size=0.2, random_state=seed,
                                        stratify=ytr)

    def fit(x, y, c):
        return LogisticRegression(C=c, solver="lbfgs", max_iter=1000).fit(x, y)

    with threadpool_limits(limits=threads), warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        val = {c: 100.0 * fit(xtr[fit_idx], ytr[fit_idx], c).score(xtr[val_idx], ytr[val_idx])
               for c in cs}
        best_c = max(cs, key=lambda c: (val[c], -c))
        top1 = 100.0 * fit(xtr, ytr, best_c).score(xte, yte)
    return {"probe_top1": top1, "probe_c": best_c, "probe_val": val[best_c]}


@torch.no_grad()
def prototype_purity(head, feats, y, center):
    """Teacher head on the (unnormalised) eval CLS features: argmax prototype of
    (output − centre) per image; how many prototypes are used and the purity of that clustering
    (share of images whose prototype's majority digit is their own digit)."""
    was = head.training
    head.eval()
    am = (head(feats) - center).argmax(1)
    head.train(was)
    hits = sum(torch.bincount(y[am == p]).max().item() for p in am.unique())
    return {"protos_eval": len(am.unique()), "purity": 100.0 * hits / len(y)}


@torch.no_grad()
def features(backbone, x, batch=256):
    """CLS features in eval mode (not yet L2-normalised)."""
    was = backbone.training
    backbone.eval()
    out = torch.cat([backbone(x[i:i + batch]) for i in range(0, len(x), batch)])
    backbone.train(was)
    return out


@torch.no_grad()
def pooled_features(vit, x, channels, batch=256, pool=tokens_pooled_features):
    """--tokens-pool cls_and_channels in eval mode: channel_reference.py's
    tokens_pooled_features (the CLS and each channel's mean patch token, each L2-normalised,
    concatenated [B, (k+1)·D]) of a tokens backbone on x [B, k, H, W] at `channels`; with
    pool=tokens_joint_and_alone_features, --tokens-pool joint_and_alone."""
    was = vit.training
    vit.eval()
    out = torch.cat([pool(vit, x[i:i + batch], channels)
                     for i in range(0, len(x), batch)])
    vit.train(was)
    return out


def main(argv=None):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    dino_reference.USE_SDPA = a.sdpa
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    np.random.seed(a.seed)
    t_start = time.perf_counter()

    train = Images(os.path.join(a.data, "Training"))
    test = Images(os.path.join(a.data, "Test"))
    classes = sorted(set(train.names) | set(test.names))
    y_train = torch.tensor([classes.index(n) for n in train.names])
    y_test = torch.tensor([classes.index(n) for n in test.names])
    C = train.x.shape[1]
    mean = train.x.double().mean(dim=(0, 2, 3)).tolist()
    std = train.x.double().std(dim=(0, 2, 3), unbiased=False).tolist()
    std = [s if s > 0 else 1.0 for s in std]

    ev_train = eval_inputs(train.x, a.global_crop_size, mean, std)
    ev_test = eval_inputs(test.x, a.global_crop_size, mean, std)
    nc = len(classes)

    combos = ([[int(ch) for ch in c] for c in a.combinations.split(",")] if a.combinations
              else [[c] for c in range(C)] + [list(range(C))])

    def embed(backbone_, x, combo, pool=a.tokens_pool):
        """A combination's features: tokens, the CLS over its channels' tokens (pool cls) or
        with each channel's mean patch token (cls_and_channels); bag, each channel's CLS
        L2-normalised, concatenated in channel order (bag_pool: concat)."""
        if a.channel_mode == "bag":
            return torch.cat([F.normalize(features(backbone_, x[:, c:c + 1]), dim=1) for c in combo], 1)
        if pool == "cls_and_channels":
            return pooled_features(backbone_, x[:, combo], combo)
        if pool == "joint_and_alone":
            return pooled_features(backbone_, x[:, combo], combo,
                                   pool=tokens_joint_and_alone_features)
        backbone_.channels = combo
        try:
            return features(backbone_, x[:, combo])
        finally:
            backbone_.channels = None

    def scores(ftr_raw, fte_raw):
        ftr, fte = F.normalize(ftr_raw, dim=1, p=2), F.normalize(fte_raw, dim=1, p=2)
        out = {f"knn{k}": knn_top1(ftr, y_train, fte, y_test, k, a.knn_t, nc) for k in (20, 10)}
        out.update(linear_probe(ftr, y_train, fte, y_test, a.seed, a.threads))
        return out

    def probe(net):
        if a.channel_mode == "fixed":
            ftr_raw = features(net.backbone, ev_train)
            out = scores(ftr_raw, features(net.backbone, ev_test))
            out.update(prototype_purity(net.head, ftr_raw, y_train, dino_loss.center))
            return out
        per = {"".join(map(str, c)): scores(embed(net.backbone, ev_train, c), embed(net.backbone, ev_test, c))
               for c in combos}
        everything = "".join(map(str, range(C)))
        out = dict(per[everything] if everything in per else next(iter(per.values())))
        out["combinations"] = per
        for pool in a.tokens_pools[1:]:
            out[f"combinations_{pool}"] = {
                "".join(map(str, c)): scores(embed(net.backbone, ev_train, c, pool),
                                             embed(net.backbone, ev_test, c, pool))
                for c in combos}
        if a.channel_mode == "tokens":
            # The head reads the CLS, whatever --tokens-pool probes.
            cls_train = embed(net.backbone, ev_train, list(range(C)), "cls")
            out.update(prototype_purity(net.head, cls_train, y_train, dino_loss.center))
        return out

    raw_tr = F.normalize(ev_train.flatten(1), dim=1)
    raw_te = F.normalize(ev_test.flatten(1), dim=1)
    raw = {f"knn{k}": knn_top1(raw_tr, y_train, raw_te, y_test, k, a.knn_t, nc) for k in (20, 10)}
    raw.update(linear_probe(raw_tr, y_train, raw_te, y_test, a.seed, a.threads))

    # ---- networks (main_dino.py L232-282) ----
    img = a.img_size or a.global_crop_size
    use_ibot = a.ibot_weight > 0
    extra = {"num_register_tokens": a.num_register_tokens, "mask_token": use_ibot, "img_size": img}

    def backbone(drop_path_rate):
        if a.channel_mode == "tokens":
            v = ChannelVisionTransformer(a.arch, a.patch_size, C, drop_path_rate,
                                         mixing_blocks=a.mixing_blocks,
                                         separate_blocks=a.separate_blocks, **extra)
            orthogonal_channel_embed(v, a.channel_embed_std)
            return v
        return VisionTransformer(a.arch, a.patch_size, 1 if a.channel_mode == "bag" else C,
                                 drop_path_rate=drop_path_rate, **extra)

    vit_s = backbone(a.drop_path_rate)
    student = MultiCropWrapper(vit_s, DINOHead(vit_s.embed_dim, a.out_dim, use_bn=a.use_bn_in_head,
                                               norm_last_layer=a.norm_last_layer))
    vit_t = backbone(0.0)
    teacher = MultiCropWrapper(vit_t, DINOHead(vit_t.embed_dim, a.out_dim, use_bn=a.use_bn_in_head))
    if a.ibot_separate_head:
        # Registered on the wrappers, so the optimizer groups, clipping, the last-layer freeze
        # ("last_layer" in its names) and the EMA (parameters zipped in order) include it.
        student.ibot_head = DINOHead(vit_s.embed_dim, a.out_dim, use_bn=False,
                                     norm_last_layer=a.norm_last_layer)
        teacher.ibot_head = DINOHead(vit_t.embed_dim, a.out_dim, use_bn=False)
    teacher.load_state_dict(student.state_dict())
    for q in teacher.parameters():
        q.requires_grad = False
    student.train()
    student.return_backbone = True  # (head output, CLS features): KoLeo reads the CLS
    teacher.train()

    if a.channel_mode == "bag":
        samples = BagItems(train.x, [build_augmentation(a, [mean[c]], [std[c]]) for c in range(C)])
    else:
        samples = Augmented(train.x, build_augmentation(a, mean, std))
    channel_rng = random.Random(a.seed ^ 0xC4A7)  # tokens' subsets, apart from the masks' draws
    # Its own stream, as the trainer's: at 0 the subsets are the ones drawn without the option.
    alone_rng = random.Random(a.seed ^ 0x5C1E)
    loader = torch.utils.data.DataLoader(
        samples, batch_size=a.batch_size, shuffle=True, num_workers=0,
        drop_last=a.use_bn_in_head, generator=torch.Generator().manual_seed(a.seed))
    niter = len(loader)
    ncrops = 2 + a.local_crops_number
    dino_loss = DINOLoss(a.out_dim, ncrops, a.warmup_teacher_temp, a.teacher_temp,
                         a.warmup_teacher_temp_epochs, a.epochs, a.student_temp,
                         centering=a.centering)
    channel_dino = a.channel_dino_weight > 0
    # train.channel_dino_weight: a DINO loss of its own (centre or Sinkhorn-Knopp), the same
    # temperatures.
    channel_loss = DINOLoss(a.out_dim, ncrops, a.warmup_teacher_temp, a.teacher_temp,
                            a.warmup_teacher_temp_epochs, a.epochs, a.student_temp,
                            centering=a.centering) if channel_dino else None
    ibot_loss = iBOTPatchLoss(a.out_dim)
    grid = a.global_crop_size // a.patch_size
    mask_generator = MaskingGenerator(grid, max_num_patches=0.5 * grid * grid)
    koleo = KoLeoLoss()
    optimizer = torch.optim.AdamW(get_params_groups(student))
    lr_schedule = cosine_scheduler(a.lr * a.batch_size / 256, a.min_lr, a.epochs, niter,
                                   warmup_epochs=a.warmup_epochs)
    wd_schedule = cosine_scheduler(a.weight_decay, a.weight_decay_end, a.epochs, niter)
    momentum_schedule = cosine_scheduler(a.momentum_teacher, 1, a.epochs, niter)

    json_out = open(a.json_out, "w") if a.json_out else None

    def emit(d):
        line = json.dumps(d)
        print(line, flush=True)
        if json_out is not None:
            json_out.write(line + "\n")
            json_out.flush()

    cfg = {k: v for k, v in vars(a).items() if k not in ("json_out",)}
    emit({"config": cfg, "train_images": len(train.x), "test_images": len(test.x),
          "channels": C, "image_size": list(train.x.shape[-2:]), "iters_per_epoch": niter,
          "ln_out_dim": math.log(a.out_dim), "mean": mean, "std": std, "raw_pixels": raw,
          "load_s": round(time.perf_counter() - t_start, 2)})
    t0 = time.perf_counter()
    untrained = probe(teacher)
    emit({"epoch": -1, **untrained, "eval_s": round(time.perf_counter() - t0, 2)})

    train_s, best = 0.0, {"epoch": -1, **untrained}
    for epoch in range(a.epochs):
        t0 = time.perf_counter()
        losses, ents, ents_b, protos_b, protos_all = [], [], [], [], set()
        channel_losses = []
        for it, (images, _) in enumerate(loader):
            git = niter * epoch + it
            for i, g in enumerate(optimizer.param_groups):
                g["lr"] = lr_schedule[git]
                if i == 0:
                    g["weight_decay"] = wd_schedule[git]
            n_global = 2 * len(images[0])
            k = 1
            if a.channel_mode == "tokens":
                if a.single_channel_steps > 0 and alone_rng.random() < a.single_channel_steps:
                    subset = [alone_rng.randrange(C)]
                else:
                    subset = hierarchical_subset(channel_rng, C)
                student.backbone.channels = teacher.backbone.channels = subset
                images = [im[:, subset] for im in images]
                k = len(subset)
            if use_ibot:
                # tokens: a masked position is masked in every channel (channel-major tokens).
                masks = draw_masks(n_global, mask_generator, a.ibot_mask_probability,
                                   a.ibot_mask_ratio).repeat(1, k)
                with torch.no_grad():
                    # The teacher sees the global crops only (its local-crop CLS rows would
                    # break the loss's two teacher chunks).
                    teacher_output, _, t_patch, t_chan = ibot_forward(
                        teacher, images[:2], masks, False, channel_dino)
                student_output, cls, s_patch, s_chan = ibot_forward(student, images, masks, True,
                                                                    channel_dino)
                temp = dino_loss.teacher_temp_schedule[epoch]
                if a.centering == "sinkhorn_knopp":
                    targets = ibot_loss.sinkhorn_knopp_teacher(t_patch, temp, len(t_patch))
                else:
                    targets = ibot_loss.softmax_center_teacher(t_patch, temp)
                    ibot_loss.update_center(t_patch.unsqueeze(0))
                loss = dino_loss(student_output, teacher_output, epoch)
                loss = loss + a.ibot_weight * ibot_loss.forward_masked(s_patch, targets, masks)
            elif channel_dino:
                with torch.no_grad():
                    teacher_output, _, t_chan = crops_forward(teacher, images[:2])
                student_output, cls, s_chan = crops_forward(student, images)
                loss = dino_loss(student_output, teacher_output, epoch)
            else:
                teacher_output = teacher(images[:2])
                student_output, cls = student(images)
                loss = dino_loss(student_output, teacher_output, epoch)
            if channel_dino:
                # Rows (crop, image, channel): the loss's per-crop chunks are B·k rows each.
                channel_term = channel_loss(s_chan, t_chan, epoch)
                channel_losses.append(channel_term.item())
                loss = loss + a.channel_dino_weight * channel_term
            if a.koleo_weight > 0:
                # DINOv2: weight × Σ over the two global crops of KoLeo(the student's CLS).
                loss = loss + a.koleo_weight * sum(koleo(c) for c in cls[:n_global].chunk(2))
            if not math.isfinite(loss.item()):
                emit({"epoch": epoch, "error": f"Loss is {loss.item()}, stopping training"})
                if json_out is not None:
                    json_out.close()
                return 1
            optimizer.zero_grad()
            loss.backward()
            if a.clip_grad:
                clip_gradients(student, a.clip_grad)
            cancel_gradients_last_layer(epoch, student, a.freeze_last_layer)
            optimizer.step()
            with torch.no_grad():
                m = momentum_schedule[git]
                for param_q, param_k in zip(student.parameters(), teacher.parameters()):
                    param_k.data.mul_(m).add_((1 - m) * param_q.detach().data)
                q = dino_loss.last_teacher_probs
                ents.append(-(q * q.clamp_min(1e-30).log()).sum(1).mean().item())
                qm = q.mean(0)
                ents_b.append(-(qm * qm.clamp_min(1e-30).log()).sum().item())
                am = q.argmax(1)
                protos_b.append(len(torch.unique(am)))
                protos_all.update(am.tolist())
            losses.append(loss.item())
        dt = time.perf_counter() - t0
        train_s += dt
        rec = {"epoch": epoch, "loss": float(np.mean(losses)), "loss_last": losses[-1],
               "t_ent": float(np.mean(ents)), "t_ent_batch": float(np.mean(ents_b)),
               "protos_batch": float(np.mean(protos_b)), "protos_epoch": len(protos_all),
               "teacher_temp": float(dino_loss.teacher_temp_schedule[epoch]),
               "lr": float(lr_schedule[niter * epoch + niter - 1]),
               "momentum": float(momentum_schedule[niter * epoch + niter - 1]),
               "train_s": round(dt, 2), "train_s_total": round(train_s, 2)}
        if channel_dino:  # the unweighted channel DINO loss (mean over the epoch's steps)
            rec["loss_channel_dino"] = float(np.mean(channel_losses))
        if (epoch + 1) % a.eval_every == 0 or epoch == a.epochs - 1:
            t0 = time.perf_counter()
            evaluated = probe(teacher)
            rec.update(evaluated)
            rec["eval_s"] = round(time.perf_counter() - t0, 2)
            if evaluated["knn20"] > best["knn20"]:
                best = {"epoch": epoch, **evaluated}
        emit(rec)
    emit({"summary": True, "untrained": untrained, "raw_pixels": raw, "best": best,
          "final": {"epoch": rec["epoch"],
                    **{k: rec.get(k) for k in ("knn20", "knn10", "probe_top1", "probe_c")}},
          "final_loss": rec["loss"],
          "train_s": round(train_s, 2), "wall_s": round(time.perf_counter() - t_start, 2)})
    if json_out is not None:
        json_out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
