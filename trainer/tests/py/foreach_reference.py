"""Oracle for the multi-tensor step pieces (foreach.rs): PyTorch's foreach AdamW
(torch.optim.AdamW(foreach=True), scDINO's two parameter groups), scDINO's per-parameter
gradient clipping and its teacher EMA, on the tensors the Rust test wrote.

argv: IN.safetensors OUT.safetensors. IN holds `init.{name}` (student = teacher at start),
`grad.{step}.{name}`, `sched` (rows: lr, wd, momentum, frozen-flag per step for `frozen`)
and `clip`; OUT gets `student.{name}`, `teacher.{name}`, `exp_avg.{name}`,
`exp_avg_sq.{name}` and `norms.{step}` (norms before clipping, in name order)."""
import sys

import torch
from safetensors.torch import load_file, save_file

torch.set_num_threads(1)
src = load_file(sys.argv[1])
names = sorted(k[len("init."):] for k in src if k.startswith("init."))
student = {n: torch.nn.Parameter(src[f"init.{n}"].clone()) for n in names}
teacher = {n: src[f"init.{n}"].clone() for n in names}
# scDINO utils.get_params_groups: biases and 1-D tensors are not regularised.
decay = [student[n] for n in names if not n.endswith(".bias") and student[n].dim() > 1]
plain = [student[n] for n in names if n.endswith(".bias") or student[n].dim() <= 1]
opt = torch.optim.AdamW([{"params": decay}, {"params": plain, "weight_decay": 0.0}],
                        foreach=True)
sched = src["sched"].double()
clip = float(src["clip"])
frozen = "norm1.weight"
out = {}
for step in range(sched.shape[0]):
    lr, wd, m, freeze = sched[step].tolist()
    for n in names:
        student[n].grad = src[f"grad.{step}.{n}"].clone()
    # scDINO utils.clip_gradients.
    norms = []
    for n in names:
        g = student[n].grad
        norm = g.data.norm(2)
        norms.append(norm.item())
        clip_coef = clip / (norm + 1e-6)
        if clip_coef < 1:
            g.data.mul_(clip_coef)
    out[f"norms.{step}"] = torch.tensor(norms, dtype=torch.float64)
    if freeze:
        student[frozen].grad = None
    opt.param_groups[0]["lr"] = lr
    opt.param_groups[0]["weight_decay"] = wd
    opt.param_groups[1]["lr"] = lr
    opt.step()
    with torch.no_grad():  # scDINO main_dino.py's EMA
        for n in names:
            teacher[n].mul_(m).add_((1 - m) * student[n].detach().data)
for n in names:
    out[f"student.{n}"] = student[n].detach().clone()
    out[f"teacher.{n}"] = teacher[n]
    state = opt.state[student[n]]
    out[f"exp_avg.{n}"] = state["exp_avg"]
    out[f"exp_avg_sq.{n}"] = state["exp_avg_sq"]
save_file({k: v.contiguous() for k, v in out.items()}, sys.argv[2])
