"""PyTorch peer of `trainer embed` (bench/embed.sh): scDINO's compute_CLS_features loop, a
torch DataLoader over every TIFF below a folder, with the same weights and preprocessing.

Dataset item (scDINO's dataset + transform): tifffile.imread -> float64 min-max per image and
channel (utils.normalize_numpy_0_to_1) -> float32 CHW tensor -> Resize(--resize) bilinear
(shorter side) -> Normalize(mean, std). DataLoader(batch_size=--batch, num_workers=--workers,
shuffle=False), the DINO reference ViT (trainer/tests/py/dino_reference.py, USE_SDPA = True) in
eval/no_grad, CLS token, nn.functional.normalize(p=2, dim=1). The weights are
`teacher.backbone.*` of our safetensors checkpoint, mean/std the ones it records. The features
are written as a Parquet table (pandas/pyarrow): Metadata_ImagePath + DINO_CLS_*.

Prints one JSON line: images, seconds (import, setup, the loop), and, with --compare (our
table), the max |difference| and min cosine of the rows of the same images.
"""
import argparse
import glob
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


class Folder(torch.utils.data.Dataset):
    def __init__(self, root, resize, mean, std):
        self.paths = sorted(
            p for p in glob.glob(os.path.join(root, "**", "*.tif*"), recursive=True)
        )
        self.resize, self.mean, self.std = resize, mean, std

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import tifffile

        x = tifffile.imread(self.paths[i]).astype(np.float64)  # (H, W, C)
        x = normalize_numpy_0_to_1(x)
        x = torch.from_numpy(x.astype(np.float32)).permute(2, 0, 1)
        h, w = x.shape[1:]
        r = self.resize
        size = (r, r * w // h) if h <= w else (r * h // w, r)
        x = F.interpolate(x[None], size=size, mode="bilinear", align_corners=False)[0]
        return (x - self.mean) / self.std


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--images", required=True)
    p.add_argument("--arch", default="vit_small")
    p.add_argument("--patch", type=int, default=16)
    p.add_argument("--resize", type=int, default=224)
    p.add_argument("--batch", type=int, default=24)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", required=True)
    p.add_argument("--compare")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from safetensors import safe_open

    t0 = time.perf_counter()
    prefix = "teacher.backbone."
    with safe_open(a.checkpoint, framework="pt") as f:
        meta = json.loads(f.metadata()["meta"])
        state = {k[len(prefix):]: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}
    state.pop("mask_token", None)
    mean = torch.tensor(meta["mean"], dtype=torch.float32).view(-1, 1, 1)
    std = torch.tensor(meta["std"], dtype=torch.float32).view(-1, 1, 1)
    chans = state["patch_embed.proj.weight"].shape[1]
    vit = dino_reference.VisionTransformer(a.arch, a.patch, chans)
    vit.load_state_dict(state, strict=True)
    vit.eval()
    ds = Folder(a.images, a.resize, mean, std)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=a.batch, shuffle=False, num_workers=a.workers
    )
    t1 = time.perf_counter()
    rows = []
    with torch.no_grad():
        for x in loader:
            rows.append(F.normalize(vit(x), dim=1, p=2))
    feats = torch.cat(rows)
    t2 = time.perf_counter()
    import pandas as pd

    table = pd.DataFrame(feats.numpy(), columns=[f"DINO_CLS_{j}" for j in range(feats.shape[1])])
    table.insert(0, "Metadata_ImagePath", ds.paths)
    table.to_parquet(a.out)
    t3 = time.perf_counter()
    out = {
        "impl": "pytorch",
        "threads": torch.get_num_threads(),
        "workers": a.workers,
        "images": len(ds),
        "batch": a.batch,
        "import_s": T_IMPORT - T_START,
        "setup_s": t1 - t0,
        "loop_s": t2 - t1,
        "write_s": t3 - t2,
    }
    if a.compare:
        ours = pd.read_parquet(a.compare).set_index("Metadata_ImagePath")
        cols = [c for c in ours.columns if c.startswith("DINO_CLS_")]
        o = torch.tensor(ours.loc[ds.paths, cols].to_numpy(np.float32))
        out["max_abs_diff"] = float((o - feats).abs().max())
        out["min_cosine"] = float((o * feats).sum(1).min())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
