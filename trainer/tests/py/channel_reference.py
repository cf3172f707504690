"""Channel-adaptive backbones in PyTorch, written from their papers' definitions, as the
oracles for the Rust `model.channels: tokens | bag`.

- ChannelViT (Bao et al., ICLR 2024; insitro/ChannelViT `PatchEmbedPerChannel`): one Conv3d
  with kernel (1, P, P) shared by every channel, a learned `channel_embed` [1, D, C, 1, 1]
  added to each channel's patch tokens, tokens channel-major, the position embedding shared
  by the channels. Positions: DINO's `interpolate_pos_encoding` of one channel's grid (exact
  at the training grid), repeated for each channel. (insitro's own code compares C·N tokens
  with N and so always resamples, even at the training grid: a quirk not copied.)
- DINO Bag-of-Channels (De Lorenci et al., TMLR 2025): a single-channel ViT; at inference
  the channels go through the batch dimension and the per-channel CLS tokens are
  concatenated in channel order (and averaged).
"""
import torch
import torch.nn as nn

from dino_reference import VisionTransformer


class PatchEmbedPerChannel(nn.Module):
    def __init__(self, patch_size, in_chans, embed_dim):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv3d(1, embed_dim, kernel_size=(1, patch_size, patch_size),
                              stride=(1, patch_size, patch_size))
        self.channel_embed = nn.Parameter(torch.zeros(1, embed_dim, in_chans, 1, 1))
        nn.init.trunc_normal_(self.channel_embed, std=0.02)

    def forward(self, x, channels):
        x = self.proj(x.unsqueeze(1))  # B D k h w
        x = x + self.channel_embed[:, :, channels, :, :]
        return x.flatten(2).transpose(1, 2)  # B (k h w) D, channel-major


class ChannelVisionTransformer(VisionTransformer):
    def __init__(self, arch="vit_tiny", patch_size=16, in_chans=5, drop_path_rate=0.0, mask_token=False):
        super().__init__(arch, patch_size, in_chans, drop_path_rate, mask_token=mask_token)
        self.patch_embed = PatchEmbedPerChannel(patch_size, in_chans, self.embed_dim)
        # The channels the inputs of the next forwards hold when none are passed (hierarchical
        # channel sampling sets them per step; MultiCropWrapper passes images only).
        self.channels = None

    def prepare_tokens(self, x, channels=None, masks=None):
        B, k, w, h = x.shape
        if channels is None:
            channels = self.channels if self.channels is not None else list(range(k))
        assert len(channels) == k
        patches = self.patch_embed(x, channels)
        if masks is not None:  # iBOT: masks [B, k·N] over the channel-major tokens
            patches = torch.where(masks.unsqueeze(-1), self.mask_token.to(patches.dtype).unsqueeze(0), patches)
        per_channel = patches.shape[1] // k
        # DINO's interpolation on one channel's tokens, then the same positions per channel.
        one = torch.zeros(B, 1 + per_channel, patches.shape[-1])
        pos = self.interpolate_pos_encoding(one, w, h)
        patch_pos = pos[:, 1:].repeat(1, k, 1)
        cls = self.cls_token.expand(B, -1, -1) + pos[:, :1]
        return torch.cat((cls, patches + patch_pos), dim=1)

    def forward(self, x, channels=None):
        x = self.prepare_tokens(x, channels)
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)[:, 0]

    def forward_features(self, x, masks=None):
        """x_norm_clstoken and x_norm_patchtokens (iBOT), the student's masked tokens replaced
        by the mask token before the positions are added."""
        x = self.prepare_tokens(x, None, masks)
        for blk in self.blocks:
            x = blk(x)
        x = self.norm(x)
        return x[:, 0], x[:, 1:]

    def get_last_selfattention(self, x, channels=None):
        x = self.prepare_tokens(x, channels)
        for i, blk in enumerate(self.blocks):
            if i < len(self.blocks) - 1:
                x = blk(x)
            else:
                return blk(x, return_attention=True)


def bag_features(vit, x):
    """Bag-of-Channels features of x [B, k, H, W] from a single-channel ViT: (the per-channel
    CLS tokens concatenated in channel order [B, k·D], their mean [B, D])."""
    B, k, H, W = x.shape
    cls = vit(x.reshape(B * k, 1, H, W)).reshape(B, k, -1)
    return cls.reshape(B, -1), cls.mean(dim=1)
