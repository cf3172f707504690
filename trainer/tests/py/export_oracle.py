"""Loads a `trainer export` folder the ways its model card says and compares its features with ours.

usage: export_oracle.py timm|torchscript EXPORT_DIR TENSORS.safetensors
TENSORS holds `x` (the export's input) and `ours` (our features of it). Prints one JSON object:
the largest |theirs - ours| per loading route, and what the test checks besides.

usage: export_oracle.py pipeline-timm|pipeline-torchscript EXPORT_DIR TENSORS.safetensors
TENSORS holds `x` (images as the features stage has them before normalising: min-max scaled,
resized) and `rows` (the features stage's CSV rows for them). The export's output becomes a
feature row as the analyses make one (the CLS token L2-normalised; `bag`: each channel's
normalised, concatenated, normalised again); prints the largest |export - rows| and, for
TorchScript, the errors the module raises for inputs of the wrong shape or dtype.
"""
import json
import sys

import torch
from safetensors.torch import load_file

fmt, folder, tensors = sys.argv[1:4]
t = load_file(tensors)
torch.set_num_threads(2)
out = {}


def feature_rows(y):
    """The analyses' feature rows from an export's output."""
    if y.dim() == 3:  # bag: [B, k, D]
        y = torch.nn.functional.normalize(y, dim=2, eps=1e-12).flatten(1)
    return torch.nn.functional.normalize(y, dim=1, eps=1e-12)


if fmt.startswith("pipeline-"):
    x, rows = t["x"], t["rows"]
    with open(f"{folder}/config.json") as f:
        cfg = json.load(f)
    if fmt == "pipeline-timm":
        import timm

        model = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
        pc = model.pretrained_cfg
        mean = torch.tensor(pc["mean"]).reshape(1, -1, 1, 1)
        std = torch.tensor(pc["std"]).reshape(1, -1, 1, 1)
        with torch.no_grad():
            y = model((x - mean) / std)
        out["input_size"] = list(pc["input_size"])
    else:
        model = torch.jit.load(f"{folder}/model.pt", map_location="cpu").eval()
        with torch.no_grad():
            y = model(x)
        errors = {}
        for name, bad in {
            "one_channel": x[:, :1],
            "larger": torch.nn.functional.pad(x, (0, 8, 0, 8)),
            "float64": x.double(),
            "three_dims": x[0],
        }.items():
            try:
                with torch.no_grad():
                    model(bad)
                errors[name] = None
            except Exception as e:  # torch.jit.Error: the module's own RuntimeError
                errors[name] = str(e)
        out["errors"] = errors
    theirs = feature_rows(y)
    out["max_abs_diff"] = (theirs - rows).abs().max().item()
    out["shape"] = list(y.shape)
    out["marker"] = cfg.get("scdino_export")
    print(json.dumps(out))
    sys.exit(0)

x, ours = t["x"], t["ours"]
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
    # The scripted input check, then the traced graph it calls.
    out["code"] = model.code + model.backbone.code
print(json.dumps(out))
