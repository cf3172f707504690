"""PyTorch peer of `trainer features` (bench/features.sh): scDINO's compute_CLS_features work on
the same held-out images with the same weights.

Per image (scDINO's dataset + transform): tifffile.imread -> float64 min-max per image and
channel (utils.normalize_numpy_0_to_1) -> float32 CHW tensor -> Resize(224) bilinear (shorter
side) -> Normalize(mean, std). Batches of --batch through the DINO reference ViT
(trainer/tests/py/dino_reference.py, USE_SDPA = True) in eval/no_grad, CLS token, then
nn.functional.normalize(p=2, dim=1) over all rows and np.savetxt(%.18e) of the features CSV, as
scDINO. The images are the ones listed in --paths (the held-out list `trainer features` wrote)
in that order; the weights are `teacher.backbone.*` of our safetensors checkpoint.

Prints one JSON line: images, seconds for setup (torch import excluded, weights load),
preprocess, forward, CSV write, the total, and the max |difference| / min cosine against
--compare (our features bundle) when given.
"""
import argparse
import json
import os
import sys
import time

T_START = time.perf_counter()
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

T_IMPORT = time.perf_counter()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "trainer", "tests", "py"))
import dino_reference  # noqa: E402
from scdino_input import normalize_numpy_0_to_1  # noqa: E402

dino_reference.USE_SDPA = True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--paths", required=True)
    p.add_argument("--mean-std", required=True)
    p.add_argument("--arch", default="vit_small")
    p.add_argument("--patch", type=int, default=16)
    p.add_argument("--resize", type=int, default=224)
    p.add_argument("--batch", type=int, default=24)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", required=True)
    p.add_argument("--compare")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    import tifffile
    from safetensors import safe_open

    t0 = time.perf_counter()
    paths = [l.rstrip("\n") for l in open(a.paths) if l.strip()]
    ms = json.load(open(a.mean_std))
    mean = torch.tensor(ms["mean"], dtype=torch.float32).view(-1, 1, 1)
    std = torch.tensor(ms["std"], dtype=torch.float32).view(-1, 1, 1)
    prefix = "teacher.backbone."
    with safe_open(a.checkpoint, framework="pt") as f:
        state = {k[len(prefix):]: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}
    chans = state["patch_embed.proj.weight"].shape[1]
    vit = dino_reference.VisionTransformer(a.arch, a.patch, chans)
    vit.load_state_dict(state, strict=True)
    vit.eval()
    t1 = time.perf_counter()

    prep_s = fwd_s = 0.0
    rows = []
    with torch.no_grad():
        for s in range(0, len(paths), a.batch):
            tp = time.perf_counter()
            batch = []
            for path in paths[s : s + a.batch]:
                x = tifffile.imread(path).astype(np.float64)  # (H, W, C)
                x = normalize_numpy_0_to_1(x)
                x = torch.from_numpy(x.astype(np.float32)).permute(2, 0, 1)
                h, w = x.shape[1:]
                size = (a.resize, a.resize * w // h) if h <= w else (a.resize * h // w, a.resize)
                x = F.interpolate(x[None], size=size, mode="bilinear", align_corners=False)[0]
                batch.append((x - mean) / std)
            x = torch.stack(batch)
            tf = time.perf_counter()
            rows.append(vit(x))
            te = time.perf_counter()
            prep_s += tf - tp
            fwd_s += te - tf
        feats = F.normalize(torch.cat(rows), dim=1, p=2)
    t2 = time.perf_counter()
    np.savetxt(a.out, feats.numpy(), delimiter=",", fmt="%.18e")
    t3 = time.perf_counter()
    out = {
        "impl": "pytorch",
        "threads": torch.get_num_threads(),
        "images": len(paths),
        "batch": a.batch,
        "import_s": T_IMPORT - T_START,
        "setup_s": t1 - t0,
        "preprocess_s": prep_s,
        "forward_s": fwd_s,
        "write_s": t3 - t2,
        "total_in_process_s": t3 - T_START,
    }
    if a.compare:
        with safe_open(a.compare, framework="pt") as f:
            ours = f.get_tensor("features").float()
        out["max_abs_diff"] = float((ours - feats).abs().max())
        out["min_cosine"] = float((ours * feats).sum(1).min())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
