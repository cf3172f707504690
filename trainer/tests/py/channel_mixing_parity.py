"""Weights, inputs, outputs and parameter gradients of the ChannelViT reference with
channel-mixing blocks (channel_reference.py), in float64 so that the comparison measures the
mask, not the rounding.

usage: channel_mixing_parity.py OUT
Writes OUT (inputs, outputs, gradients) and OUT.<case>.safetensors (each case's weights):
- mix1: vit_tiny/16 over 4 channels, channel_mixing_blocks 1;
- mix2reg: the same with 2 register tokens and channel_mixing_blocks 2;
- sep2mix1reg: 2 register tokens, channel_separate_blocks 2 then channel_mixing_blocks 1;
- mixall: mix1's weights with every block mixing (the last attention is masked too);
- sepall: mix1's weights with every block separate (the last attention is masked too).
Each case runs on two channel subsets (k = 2 and k = 3) of 48 x 64 px images; the loss whose
gradients are written is sum(CLS * w) for a fixed random w.
"""
import sys

import torch
from safetensors.torch import save_file

from channel_reference import ChannelVisionTransformer

out = sys.argv[1]
torch.manual_seed(0)
torch.set_num_threads(1)
torch.set_default_dtype(torch.float64)
subsets = {"k2": [0, 3], "k3": [0, 1, 2]}
inputs = {name: torch.randn(2, len(ch), 48, 64) for name, ch in subsets.items()}
w = torch.randn(2, 192)
tensors = {"in.w": w}
for name, ch in subsets.items():
    tensors[f"in.x_{name}"] = inputs[name]
    tensors[f"in.channels_{name}"] = torch.tensor(ch, dtype=torch.int64)

models = {
    "mix1": ChannelVisionTransformer("vit_tiny", 16, 4, drop_path_rate=0.1, mixing_blocks=1),
    "mix2reg": ChannelVisionTransformer("vit_tiny", 16, 4, drop_path_rate=0.1, num_register_tokens=2,
                                        mixing_blocks=2),
    "sep2mix1reg": ChannelVisionTransformer("vit_tiny", 16, 4, drop_path_rate=0.1, num_register_tokens=2,
                                            mixing_blocks=1, separate_blocks=2),
}
# Registers start at std 1e-6 (DINOv2): give them a scale at which they matter.
with torch.no_grad():
    for case in ["mix2reg", "sep2mix1reg"]:
        models[case].register_tokens.normal_(std=0.5)
for case, model in models.items():
    model.eval()
    for name, ch in subsets.items():
        params = list(model.named_parameters())
        model.zero_grad()
        cls = model(inputs[name], ch)
        grads = torch.autograd.grad((cls * w).sum(), [p for _, p in params], allow_unused=True)
        tensors[f"out.{case}.cls_{name}"] = cls.detach()
        for (pname, _), g in zip(params, grads):
            if g is not None:
                tensors[f"grad.{case}.{name}.{pname}"] = g
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, f"{out}.{case}.safetensors")

every = models["mix1"]
for case, (separate, mixing) in {"mixall": (0, len(every.blocks)), "sepall": (len(every.blocks), 0)}.items():
    every.separate_blocks, every.mixing_blocks = separate, mixing
    with torch.no_grad():
        for name, ch in subsets.items():
            tensors[f"out.{case}.attn_{name}"] = every.get_last_selfattention(inputs[name], ch)
            tensors[f"out.{case}.cls_{name}"] = every(inputs[name], ch)
save_file({k: v.contiguous() for k, v in tensors.items()}, out)
