#!/usr/bin/env python3
"""Compares the `trainer embed` tables that scripts/device-check.sh brings back from a GPU
machine (run here, where pyarrow is): the GPU's fp32 rows against the CPU's (same images, same
order; max |difference| and worst cosine), and the GPU's bf16 rows against its fp32 rows
(worst cosine; the CPU test asks >= 0.999). Exits non-zero when a bound fails.
usage: scripts/device-compare-embed.py DEVICE_OUT/embed"""
import sys

import numpy as np
import pyarrow.parquet as pq


def rows(path):
    t = pq.read_table(path)
    feats = [c for c in t.column_names if c.startswith("DINO_CLS_")]
    return t.column("Metadata_ImagePath").to_pylist(), np.stack(
        [t.column(c).to_numpy() for c in feats], axis=1
    ).astype(np.float64)


d = sys.argv[1]
p_cpu, cpu = rows(f"{d}/cpu-fp32.parquet")
p_gpu, gpu = rows(f"{d}/cuda-fp32.parquet")
p_b16, b16 = rows(f"{d}/cuda-bf16.parquet")
assert p_cpu == p_gpu == p_b16, "the three tables hold other images or another order"
fp32_diff = float(np.abs(gpu - cpu).max())
fp32_cos = float((gpu * cpu).sum(1).min())
bf16_cos = float((b16 * gpu).sum(1).min())
print(f"{len(p_cpu)} images; cuda fp32 vs cpu fp32: max |diff| {fp32_diff:.2e}, worst cosine "
      f"{fp32_cos:.7f}; cuda bf16 vs cuda fp32: worst cosine {bf16_cos:.5f}")
ok = fp32_cos >= 0.99999 and bf16_cos >= 0.999
sys.exit(0 if ok else 1)
