"""Writes weights, inputs and PyTorch outputs of the reference DINO network to safetensors.

usage: model_parity.py OUT.safetensors ARCH PATCH IN_CHANS OUT_DIM USE_BN [REGISTERS]
With REGISTERS > 0 the backbone has DINOv2's register tokens (set to N(0, 0.5) so they matter),
and the attention outputs leave their rows and columns out, as the trainer's maps do.
"""
import sys

import torch
from safetensors.torch import save_file

from dino_reference import DINOHead, MultiCropWrapper, VisionTransformer

out, arch, patch, chans, out_dim, use_bn = sys.argv[1:7]
patch, chans, out_dim, use_bn = int(patch), int(chans), int(out_dim), use_bn == "1"
registers = int(sys.argv[7]) if len(sys.argv) > 7 else 0
torch.manual_seed(0)
torch.set_num_threads(2)
vit = VisionTransformer(arch, patch, chans, drop_path_rate=0.1, num_register_tokens=registers)
if registers:
    with torch.no_grad():
        vit.register_tokens.normal_(0, 0.5)


def without_registers(attn):
    keep = [0] + list(range(1 + registers, attn.shape[-1]))
    return attn[:, :, keep][:, :, :, keep]


net = MultiCropWrapper(vit, DINOHead(vit.embed_dim, out_dim, use_bn=use_bn)).eval()
if use_bn:
    # Non-trivial running statistics so eval-mode BN is really exercised.
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm1d):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 2.0)

x224 = torch.randn(2, chans, 224, 224)
x96 = torch.randn(3, chans, 96, 96)
x_rect = torch.randn(2, chans, 160, 224)  # H=160, W=224: the non-square case
crops = [torch.randn(2, chans, 224, 224) for _ in range(2)] + [torch.randn(2, chans, 96, 96) for _ in range(3)]
with torch.no_grad():
    tensors = {
        "in.x224": x224, "in.x96": x96, "in.x_rect": x_rect,
        "out.cls224": vit(x224), "out.cls96": vit(x96), "out.cls_rect": vit(x_rect),
        "out.attn224": without_registers(vit.get_last_selfattention(x224)),
        "out.attn_rect": without_registers(vit.get_last_selfattention(x_rect)),
        "out.head224": net(x224),
        "out.multicrop": net(crops),
    }
for i, c in enumerate(crops):
    tensors[f"in.crop{i}"] = c
weights = {k: v.contiguous() for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}
save_file(weights, out + ".weights.safetensors")
save_file({k: v.contiguous() for k, v in tensors.items()}, out)
