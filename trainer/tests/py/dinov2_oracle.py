"""DINOv2's own `.pth` layout and position-embedding interpolation: the oracle for
`model.init format: pth` with DINOv2 weights.

usage: dinov2_oracle.py OUT_DIR
The dinov2 repository (facebookresearch/dinov2) is not pip-installable here, so its
`DinoVisionTransformer` is rebuilt below from timm's `Block` (the same parameter names:
norm1, attn.qkv, attn.proj, ls1.gamma, norm2, mlp.fc1, mlp.fc2, ls2.gamma; LayerNorm eps 1e-6
as `dinov2/models/vision_transformer.py` line 97 sets it) with DINOv2's token preparation and
`interpolate_pos_encoding` copied verbatim from dinov2/models/vision_transformer.py at commit
b8931f7bf91576930313be2c6d6af376033b35f0, lines 180-212 and 214-233, and DINOv2's
block chunking (lines 145-157: `blocks.{chunk}.{block}` with `nn.Identity` placeholders).

Writes two ViT-Ti/14 models (width 192, 12 blocks, 3 heads, LayerScale, 3 channels) trained
at 42 px (a 3×3 grid), random weights perturbed so every tensor matters:
  OUT_DIR/v1.pth: DINOv2's original models: no registers, interpolate_offset=0.1,
      interpolate_antialias=False (hub `dinov2_vits14`), 4 block chunks, saved as a training
      checkpoint's `{"teacher": {"backbone.…": …}}`;
  OUT_DIR/reg.pth: the register models: 4 registers, interpolate_offset=0.0,
      interpolate_antialias=True (hub `dinov2_vits14_reg`), no chunks, a bare state dict as
      the hub releases them.
and OUT_DIR/{v1,reg}.safetensors: `x` (an input [2, 3, 224, 224]), `y` (the CLS feature
`x_norm_clstoken` at 224 px, whose 16×16 grid the positions are interpolated to) and `pos`
(`interpolate_pos_encoding` for 224 px).
"""
import math
import sys
from functools import partial

import torch
import torch.nn as nn
from safetensors.torch import save_file
from timm.models.vision_transformer import Block


class BlockChunk(nn.ModuleList):
    def forward(self, x):
        for b in self:
            x = b(x)
        return x


class PatchEmbed(nn.Module):
    def __init__(self, patch_size, in_chans, embed_dim):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class DinoVisionTransformer(nn.Module):
    def __init__(self, img_size, patch_size, in_chans, embed_dim, depth, num_heads, init_values,
                 block_chunks, num_register_tokens, interpolate_antialias, interpolate_offset):
        super().__init__()
        norm_layer = partial(nn.LayerNorm, eps=1e-6)
        self.num_tokens = 1
        self.patch_size = patch_size
        self.num_register_tokens = num_register_tokens
        self.interpolate_antialias = interpolate_antialias
        self.interpolate_offset = interpolate_offset
        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim)
        num_patches = (img_size // patch_size) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + self.num_tokens, embed_dim))
        self.register_tokens = (
            nn.Parameter(torch.zeros(1, num_register_tokens, embed_dim)) if num_register_tokens else None
        )
        blocks_list = [
            Block(dim=embed_dim, num_heads=num_heads, mlp_ratio=4.0, qkv_bias=True,
                  init_values=init_values, norm_layer=norm_layer)
            for _ in range(depth)
        ]
        if block_chunks > 0:
            chunked_blocks = []
            chunksize = depth // block_chunks
            for i in range(0, depth, chunksize):
                # this is to keep the block index consistent if we chunk the block list
                chunked_blocks.append([nn.Identity()] * i + blocks_list[i : i + chunksize])
            self.blocks = nn.ModuleList([BlockChunk(p) for p in chunked_blocks])
        else:
            self.blocks = nn.ModuleList(blocks_list)
        self.norm = norm_layer(embed_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, embed_dim))

    # dinov2/models/vision_transformer.py lines 180-212, verbatim.
    def interpolate_pos_encoding(self, x, w, h):
        previous_dtype = x.dtype
        npatch = x.shape[1] - 1
        N = self.pos_embed.shape[1] - 1
        if npatch == N and w == h:
            return self.pos_embed
        pos_embed = self.pos_embed.float()
        class_pos_embed = pos_embed[:, 0]
        patch_pos_embed = pos_embed[:, 1:]
        dim = x.shape[-1]
        w0 = w // self.patch_size
        h0 = h // self.patch_size
        M = int(math.sqrt(N))  # Recover the number of patches in each dimension
        assert N == M * M
        kwargs = {}
        if self.interpolate_offset:
            # Historical kludge: add a small number to avoid floating point error in the interpolation, see https://github.com/facebookresearch/dino/issues/8
            # Note: still needed for backward-compatibility, the underlying operators are using both output size and scale factors
            sx = float(w0 + self.interpolate_offset) / M
            sy = float(h0 + self.interpolate_offset) / M
            kwargs["scale_factor"] = (sx, sy)
        else:
            # Simply specify an output size instead of a scale factor
            kwargs["size"] = (w0, h0)
        patch_pos_embed = nn.functional.interpolate(
            patch_pos_embed.reshape(1, M, M, dim).permute(0, 3, 1, 2),
            mode="bicubic",
            antialias=self.interpolate_antialias,
            **kwargs,
        )
        assert (w0, h0) == patch_pos_embed.shape[-2:]
        patch_pos_embed = patch_pos_embed.permute(0, 2, 3, 1).view(1, -1, dim)
        return torch.cat((class_pos_embed.unsqueeze(0), patch_pos_embed), dim=1).to(previous_dtype)

    # dinov2/models/vision_transformer.py lines 214-233 (masks is always None here).
    def prepare_tokens_with_masks(self, x, masks=None):
        B, nc, w, h = x.shape
        x = self.patch_embed(x)
        if masks is not None:
            x = torch.where(masks.unsqueeze(-1), self.mask_token.to(x.dtype).unsqueeze(0), x)

        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = x + self.interpolate_pos_encoding(x, w, h)

        if self.register_tokens is not None:
            x = torch.cat(
                (
                    x[:, :1],
                    self.register_tokens.expand(x.shape[0], -1, -1),
                    x[:, 1:],
                ),
                dim=1,
            )

        return x

    # forward_features (lines 255-272): x_norm_clstoken.
    def forward(self, x):
        x = self.prepare_tokens_with_masks(x)
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)[:, 0]


VARIANTS = {
    "v1": dict(block_chunks=4, num_register_tokens=0, interpolate_antialias=False, interpolate_offset=0.1),
    "reg": dict(block_chunks=0, num_register_tokens=4, interpolate_antialias=True, interpolate_offset=0.0),
}

if __name__ == "__main__":
    out_dir = sys.argv[1]
    torch.manual_seed(0)
    torch.set_num_threads(2)
    for name, args in VARIANTS.items():
        model = DinoVisionTransformer(img_size=42, patch_size=14, in_chans=3, embed_dim=192, depth=12,
                                      num_heads=3, init_values=1e-5, **args).eval()
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("gamma") or (n.startswith("norm") or ".norm" in n) and n.endswith("weight"):
                    p.uniform_(0.5, 1.5)
                else:
                    p.add_(torch.randn_like(p) * 0.05)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if name == "v1":
            assert "blocks.1.3.ls1.gamma" in state, "chunked names"
            torch.save({"teacher": {f"backbone.{k}": v for k, v in state.items()}}, f"{out_dir}/{name}.pth")
        else:
            torch.save(state, f"{out_dir}/{name}.pth")
        x = torch.randn(2, 3, 224, 224)
        with torch.no_grad():
            y = model(x)
            pos = model.interpolate_pos_encoding(torch.zeros(1, 1 + 16 * 16, 192), 224, 224)
        save_file({"x": x, "y": y.contiguous(), "pos": pos.contiguous()}, f"{out_dir}/{name}.safetensors")
