"""Weights, inputs and PyTorch outputs of the channel-adaptive reference backbones.

usage: channel_parity.py OUT.safetensors ARCH PATCH CHANNELS
Writes OUT (inputs and outputs) and OUT.tokens.safetensors / OUT.bag.safetensors (weights).
"""
import sys

import torch
from safetensors.torch import save_file

from channel_reference import (
    ChannelVisionTransformer,
    bag_features,
    tokens_joint_and_alone_features,
    tokens_pooled_features,
)
from dino_reference import VisionTransformer

out, arch, patch, chans = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
torch.set_num_threads(2)
tokens = ChannelVisionTransformer(arch, patch, chans, drop_path_rate=0.1).eval()
bag = VisionTransformer(arch, patch, 1, drop_path_rate=0.1).eval()
x224 = torch.randn(2, chans, 224, 224)
x96 = torch.randn(3, chans, 96, 96)
x_rect = torch.randn(2, chans, 160, 224)
subset = [1, chans - 1]  # two of the channels, as a missing-stain input would have
x_sub = torch.randn(2, len(subset), 96, 96)
with torch.no_grad():
    concat, mean = bag_features(bag, x96)
    tensors = {
        "in.x224": x224, "in.x96": x96, "in.x_rect": x_rect, "in.x_sub": x_sub,
        "in.subset": torch.tensor(subset, dtype=torch.int64),
        "out.tokens.cls224": tokens(x224),
        "out.tokens.cls96": tokens(x96),
        "out.tokens.cls_rect": tokens(x_rect),
        "out.tokens.cls_sub": tokens(x_sub, subset),
        "out.tokens.attn96": tokens.get_last_selfattention(x96),
        "out.tokens.attn_sub": tokens.get_last_selfattention(x_sub, subset),
        "out.bag.concat96": concat, "out.bag.mean96": mean,
        "out.tokens.pool96": tokens_pooled_features(tokens, x96),
        "out.tokens.pool_sub": tokens_pooled_features(tokens, x_sub, subset),
        "out.tokens.joint_alone96": tokens_joint_and_alone_features(tokens, x96),
        "out.tokens.joint_alone_sub": tokens_joint_and_alone_features(tokens, x_sub, subset),
        "out.tokens.joint_alone_one": tokens_joint_and_alone_features(
            tokens, x_sub[:, 1:], subset[1:]),
    }
save_file({k: v.contiguous() for k, v in tensors.items()}, out)
save_file({k: v.contiguous() for k, v in tokens.state_dict().items()}, out + ".tokens.safetensors")
save_file({k: v.contiguous() for k, v in bag.state_dict().items()}, out + ".bag.safetensors")
