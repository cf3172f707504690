"""timm ViTs saved as timm saves them, with their features: the oracle for reading timm folders.

usage: timm_oracle.py OUT_DIR
Writes, each with timm's own `save_for_hf` (config.json with model_args + model.safetensors):
  OUT_DIR/dinov2: timm's `vit_small_patch14_reg4_dinov2` (LayerScale, 4 registers,
      no_embed_class, patch 14), 3 channels, 2 blocks, trained resolution 56 px;
  OUT_DIR/vits16: a ViT-S/16 (`vit_small_patch16_224`) at 5 channels, 2 blocks, 48 px, class
      position in pos_embed, no LayerScale;
  OUT_DIR/tiny: a ViT-Ti/16 (12 blocks, as our vit_tiny) with DINOv2's layout (LayerScale,
      4 registers, no_embed_class), 3 channels, 32 px: a source for `model.init`;
  OUT_DIR/regpos: reg_tokens=2 with no_embed_class=False (registers with positions, a layout
      the reader refuses).
Weights are timm's random init (pretrained=False) then perturbed, so LayerScale, norms and
the tokens are far from their near-identity initial values and every tensor matters.
Each model folder gets `features.safetensors`: for each size S in the model's list, `x_S`
(an input [2, C, H, W]) and `y_S` (timm's CLS feature, `num_classes=0, global_pool="token"`,
created with `dynamic_img_size=True`, so other sizes resample positions timm's way).
Prints one JSON object: {name: [[H, W], ...]}.
"""
import json
import sys

import timm
import torch
from safetensors.torch import save_file
from timm.models import save_for_hf

out_dir = sys.argv[1]
torch.manual_seed(0)
torch.set_num_threads(2)

MODELS = {
    "dinov2": (
        "vit_small_patch14_reg4_dinov2",
        dict(img_size=56, depth=2, in_chans=3),
        [(56, 56), (84, 84), (70, 98)],
    ),
    "vits16": (
        "vit_small_patch16_224",
        dict(img_size=48, depth=2, in_chans=5,
             pretrained_cfg_overlay=dict(mean=(0.1, 0.2, 0.3, 0.4, 0.5), std=(0.5, 0.4, 0.3, 0.2, 0.1))),
        [(48, 48), (80, 80), (32, 64)],
    ),
    "tiny": (
        "vit_tiny_patch16_224",
        dict(img_size=32, in_chans=3, init_values=1e-5, reg_tokens=4, no_embed_class=True),
        [],
    ),
    "regpos": (
        "vit_small_patch16_224",
        dict(img_size=32, depth=1, in_chans=3, reg_tokens=2, no_embed_class=False),
        [],
    ),
}

sizes_out = {}
for name, (arch, args, sizes) in MODELS.items():
    model = timm.create_model(arch, pretrained=False, num_classes=0, global_pool="token",
                              dynamic_img_size=True, **args).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("gamma") or (n.startswith("norm") or ".norm" in n) and n.endswith("weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.add_(torch.randn_like(p) * 0.05)
    folder = f"{out_dir}/{name}"
    model_args = {k: v for k, v in args.items() if k != "pretrained_cfg_overlay"}
    model_args.update(num_classes=0, global_pool="token", dynamic_img_size=True)
    save_for_hf(model, folder, model_args=model_args, safe_serialization=True)
    feats = {}
    for h, w in sizes:
        x = torch.randn(2, args["in_chans"], h, w)
        with torch.no_grad():
            feats[f"x_{h}x{w}"] = x
            feats[f"y_{h}x{w}"] = model(x).contiguous()
    if feats:
        save_file(feats, f"{folder}/features.safetensors")
    sizes_out[name] = [list(s) for s in sizes]
print(json.dumps(sizes_out))
