"""timm folders as `--checkpoint` of `trainer features`/`evaluate`/`embed`: the models, and
timm's own features of the images.

usage:
  pretrained_oracle.py models OUT_DIR
      Writes with timm's `save_for_hf` (random init, pretrained=False, then perturbed so every
      tensor matters):
      OUT_DIR/dinov2: `vit_small_patch14_reg4_dinov2` (LayerScale, 4 registers, no class
          position, patch 14), 3 channels, 2 blocks, input 28 px, timm's DINOv2 input config
          (bicubic, ImageNet mean/std);
      OUT_DIR/vits16: `vit_small_patch16_224`, 5 channels, 2 blocks, input 32 px, bilinear,
          a mean/std per channel.
  pretrained_oracle.py features DIR PATHS SEL ADAPT OUT
      The CLS features (L2-normalised rows) of the TIFFs listed in the file PATHS, channels SEL
      (JSON list of file channel indices), computed by `timm.create_model("local-dir:DIR", pretrained=True)`
      with the input configuration timm itself resolves from the folder
      (`timm.data.resolve_data_config`: input size, interpolation, mean, std), each channel
      min-max scaled per image first (every stage of the trainer does). ADAPT is `null`, or
      `"mean"` (scDINO's use_mean_patch_embedding: the mean kernel repeated over the channels,
      the channels normalised with the mean of the model's mean and std). Written to OUT
      (safetensors, `features`).
"""
import json
import sys

import numpy as np
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from timm.models import save_for_hf

MODELS = {
    "dinov2": ("vit_small_patch14_reg4_dinov2", dict(img_size=28, depth=2, in_chans=3), {}),
    "vits16": (
        "vit_small_patch16_224",
        dict(img_size=32, depth=2, in_chans=5),
        dict(interpolation="bilinear", mean=(0.1, 0.2, 0.3, 0.4, 0.5), std=(0.5, 0.4, 0.3, 0.2, 0.1)),
    ),
}


def models(out_dir):
    torch.manual_seed(0)
    for name, (arch, args, overlay) in MODELS.items():
        model = timm.create_model(arch, pretrained=False, num_classes=0, global_pool="token",
                                  pretrained_cfg_overlay=overlay, **args).eval()
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("gamma") or (n.startswith("norm") or ".norm" in n) and n.endswith("weight"):
                    p.uniform_(0.5, 1.5)
                else:
                    p.add_(torch.randn_like(p) * 0.05)
        model_args = dict(args, num_classes=0, global_pool="token")
        save_for_hf(model, f"{out_dir}/{name}", model_args=model_args, safe_serialization=True)


def features(folder, paths, sel, adapt, out):
    import tifffile

    sel = json.loads(sel)
    adapt = json.loads(adapt)
    model = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    # The folder's weights, not a fresh initialisation.
    saved = load_file(f"{folder}/model.safetensors")
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items()), "weights not loaded"
    cfg = timm.data.resolve_data_config({}, model=model)
    mean, std = torch.tensor(cfg["mean"]), torch.tensor(cfg["std"])
    if adapt == "mean":
        w = model.patch_embed.proj.weight
        model.patch_embed.proj.weight = torch.nn.Parameter(w.mean(1, keepdim=True).repeat(1, len(sel), 1, 1))
        mean, std = mean.mean().repeat(len(sel)), std.mean().repeat(len(sel))
    else:
        assert adapt is None, adapt
    rows = []
    for p in open(paths).read().split():
        x = tifffile.imread(p).astype(np.float64)[:, :, sel]
        mn, mx = x.min(axis=(0, 1)), x.max(axis=(0, 1))
        x = torch.from_numpy(((x - mn) / (mx - mn)).astype(np.float32)).permute(2, 0, 1)
        x = F.interpolate(x[None], size=tuple(cfg["input_size"][1:]), mode=cfg["interpolation"],
                          align_corners=False)[0]
        rows.append((x - mean.view(-1, 1, 1)) / std.view(-1, 1, 1))
    with torch.no_grad():
        f = model(torch.stack(rows).float())
    save_file({"features": F.normalize(f, dim=1, p=2).contiguous()}, out)


if __name__ == "__main__":
    torch.set_num_threads(2)
    cmd, rest = sys.argv[1], sys.argv[2:]
    if cmd == "models":
        models(*rest)
    elif cmd == "features":
        features(*rest)
    else:
        sys.exit(f"unknown command {cmd}")
