"""Oracle for trainer::augment: torchvision/PyTorch versions of each operation.

Usage:
  augment_oracle.py ops DIR        DIR/spec.json lists cases; each reads DIR/<input>
                                   (little-endian float32, C*H*W) and writes
                                   DIR/out_<n>.f32; prints the output shapes as JSON.
  augment_oracle.py rrc JSON      JSON = {"setups": [[H, W, LO, HI], ...], "n": N, "seed": S}:
                                   for each setup, torch.manual_seed(S) then N draws of
                                   RandomResizedCrop.get_params(H x W image, scale (LO, HI));
                                   prints a list of {"i": [..], "j": [..], "h": [..], "w": [..]}.
  augment_oracle.py geometry JSON JSON = {"h": H, "w": W, "pairs": [[target_area, aspect], ...],
                                   "fallback": [[H, W], ...]}: prints {"sizes": the (h, w) of
                                   torchvision's attempt formula for each pair (null =
                                   rejected), "fallback": get_params with scale (2, 3), where
                                   every attempt is rejected, for each shape}.
"""
import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as NF
import torchvision.transforms.functional as F
from torchvision.transforms import InterpolationMode, RandomResizedCrop

BICUBIC = InterpolationMode.BICUBIC


def load(d, case):
    c, h, w = case["shape"]
    a = np.fromfile(f"{d}/{case['input']}", dtype="<f4")
    assert a.size == c * h * w, (a.size, case["shape"])
    return torch.from_numpy(a.reshape(c, h, w).copy())


def brightness(x, factors):
    # torchvision's adjust_brightness accepts 1 or 3 channels: apply per channel.
    return torch.cat([F.adjust_brightness(x[c : c + 1], float(f)) for c, f in enumerate(factors)])


def solarize(x, t):
    if x.shape[0] in (1, 3):
        # F.solarize uses >=; our test data never hits the threshold exactly.
        return F.solarize(x, t)
    return torch.where(x > t, 1.0 - x, x)


def pipeline(x, p, mean, std):
    """scDINO's DataAugmentationDINO (multi-channel) with fixed parameters."""
    i, j, h, w = p["rect"]
    s = p["out_size"]
    x = F.resized_crop(x, i, j, h, w, [s, s], interpolation=BICUBIC, antialias=False)
    if p["hflip"]:
        x = F.hflip(x)
    if p["vflip"]:
        x = F.vflip(x)
    if p["brightness"]:
        x = brightness(x, p["brightness"])
    if p["blur_sigma"] is not None:
        sg = float(p["blur_sigma"])
        x = F.gaussian_blur(x, [5, 5], [sg, sg])
    if p["solarize"]:
        x = torch.where(x > 0.5, 1.0 - x, x)
    return F.normalize(x, mean, std)


def run_case(x, case):
    op, p = case["op"], case.get("params", {})
    if op == "resized_crop":
        return F.resized_crop(
            x, p["top"], p["left"], p["h"], p["w"], [p["out_h"], p["out_w"]],
            interpolation=BICUBIC, antialias=False,
        )
    if op == "interpolate":
        t, l, h, w = p["top"], p["left"], p["h"], p["w"]
        crop = x[:, t : t + h, l : l + w]
        return NF.interpolate(crop[None], size=(p["out_h"], p["out_w"]), mode="bicubic",
                              align_corners=False)[0]
    if op == "hflip":
        return F.hflip(x)
    if op == "vflip":
        return F.vflip(x)
    if op == "brightness":
        return brightness(x, p["factors"])
    if op == "blur":
        return F.gaussian_blur(x, [5, 5], [p["sigma"], p["sigma"]])
    if op == "solarize":
        return solarize(x, p["threshold"])
    if op == "normalize":
        return F.normalize(x, p["mean"], p["std"])
    if op == "pipeline":
        return pipeline(x, p["crop"], p["mean"], p["std"])
    raise ValueError(op)


def main():
    mode = sys.argv[1]
    if mode == "ops":
        d = sys.argv[2]
        spec = json.load(open(f"{d}/spec.json"))
        shapes = []
        for n, case in enumerate(spec["cases"]):
            y = run_case(load(d, case), case).contiguous()
            assert y.dtype == torch.float32
            y.numpy().astype("<f4").tofile(f"{d}/out_{n}.f32")
            shapes.append(list(y.shape))
        print(json.dumps(shapes))
    elif mode == "rrc":
        req = json.loads(sys.argv[2])
        res = []
        for h, w, lo, hi in req["setups"]:
            torch.manual_seed(req["seed"])
            img = torch.empty(1, h, w)
            out = {"i": [], "j": [], "h": [], "w": []}
            for _ in range(req["n"]):
                draw = RandomResizedCrop.get_params(img, [lo, hi], [3.0 / 4.0, 4.0 / 3.0])
                for k, v in zip("ijhw", draw):
                    out[k].append(v)
            res.append(out)
        print(json.dumps(res))
    elif mode == "geometry":
        req = json.loads(sys.argv[2])
        h, w = req["h"], req["w"]
        sizes = []
        for target_area, aspect_ratio in req["pairs"]:
            # torchvision's attempt formula, verbatim.
            ww = int(round(math.sqrt(target_area * aspect_ratio)))
            hh = int(round(math.sqrt(target_area / aspect_ratio)))
            sizes.append([hh, ww] if 0 < ww <= w and 0 < hh <= h else None)
        fallback = []
        for fh, fw in req["fallback"]:
            torch.manual_seed(0)
            fallback.append(list(RandomResizedCrop.get_params(torch.empty(1, fh, fw), [2.0, 3.0],
                                                              [3.0 / 4.0, 4.0 / 3.0])))
        print(json.dumps({"sizes": sizes, "fallback": fallback}))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
