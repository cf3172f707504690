"""Loads a `trainer export` folder the ways its model card says and compares its features with ours.

usage: export_oracle.py timm|torchscript EXPORT_DIR TENSORS.safetensors
TENSORS holds `x` (the export's input) and `ours` (our features of it). Prints one JSON object:
the largest |theirs - ours| per loading route, and what the test checks besides.
"""
import json
import sys

import torch
from safetensors.torch import load_file

fmt, folder, tensors = sys.argv[1:4]
t = load_file(tensors)
x, ours = t["x"], t["ours"]
torch.set_num_threads(2)
out = {}
if fmt == "timm":
    import timm

    with open(f"{folder}/config.json") as f:
        cfg = json.load(f)
    args = cfg["model_args"]
    weights = f"{folder}/model.safetensors"
    models = {
        # The folder alone: config.json's architecture and model_args, model.safetensors.
        "local_dir": timm.create_model(f"local-dir:{folder}", pretrained=True),
        "overlay": timm.create_model(
            cfg["architecture"], pretrained=True, pretrained_cfg_overlay=dict(file=weights), **args
        ),
        "state_dict": timm.create_model(cfg["architecture"], pretrained=False, **args),
    }
    models["state_dict"].load_state_dict(load_file(weights))  # strict: every name must match
    with torch.no_grad():
        for name, model in models.items():
            y = model.eval()(x)
            out[name] = (y - ours).abs().max().item()
            out[name + "_shape"] = list(y.shape)
    pc = models["local_dir"].pretrained_cfg
    out["mean"], out["std"] = list(pc["mean"]), list(pc["std"])
    out["input_size"] = list(pc["input_size"])
    out["num_features"] = models["local_dir"].num_features
else:
    model = torch.jit.load(f"{folder}/model.pt", map_location="cpu").eval()
    with torch.no_grad():
        y = model(x)
    out["torchscript"] = (y - ours).abs().max().item()
    out["shape"] = list(y.shape)
    out["code"] = model.code
print(json.dumps(out))
