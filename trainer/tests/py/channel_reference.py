"""Channel-adaptive backbones in PyTorch, written from their papers' definitions, as the
oracles for the Rust `model.channels: tokens | bag`.

- ChannelViT (Bao et al., ICLR 2024; insitro/ChannelViT `PatchEmbedPerChannel`): one Conv3d
  with kernel (1, P, P) shared by every channel, a learned `channel_embed` [1, D, C, 1, 1]
  added to each channel's patch tokens, tokens channel-major, the position embedding shared
  by the channels. Positions: DINO's `interpolate_pos_encoding` of one channel's grid (exact
  at the training grid), repeated for each channel. (insitro's own code compares C·N tokens
  with N and so always resamples, even at the training grid: a quirk not copied.)
- Channel-mixing blocks (this project's `model.channel_mixing_blocks`, BENCHMARKS.md run 9): in
  the first N blocks a patch token (channel c, patch p) attends only to the tokens (c', p) of
  every channel of the input and to the CLS and register tokens, which attend to everything.
  The mask is written here from that definition token by token.
- Channel-separate blocks (`model.channel_separate_blocks`, BENCHMARKS.md run 14): the first N
  blocks, before the mixing ones, where a patch token (channel c, patch p) attends only to the
  patch tokens (c, p') of its own channel (not to the CLS and register tokens, which attend
  to everything). Written token by token too.
- DINO Bag-of-Channels (De Lorenci et al., TMLR 2025): a single-channel ViT; at inference
  the channels go through the batch dimension and the per-channel CLS tokens are
  concatenated in channel order (and averaged).
"""
import torch
import torch.nn as nn

from dino_reference import VisionTransformer


def mixing_mask(k, n, registers):
    """[L, L] bool over CLS, the registers, then k channels' n patches (channel-major)."""
    special = 1 + registers
    L = special + k * n
    mask = torch.zeros(L, L, dtype=torch.bool)
    for i in range(L):
        for j in range(L):
            if i < special or j < special:
                mask[i, j] = True
            else:
                mask[i, j] = (i - special) % n == (j - special) % n
    return mask


def separate_mask(k, n, registers):
    """[L, L] bool over CLS, the registers, then k channels' n patches (channel-major): a
    patch token sees its own channel's patches only; the special tokens see everything."""
    special = 1 + registers
    L = special + k * n
    mask = torch.zeros(L, L, dtype=torch.bool)
    for i in range(L):
        for j in range(L):
            if i < special:
                mask[i, j] = True
            elif j < special:
                mask[i, j] = False
            else:
                mask[i, j] = (i - special) // n == (j - special) // n
    return mask


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
    def __init__(self, arch="vit_tiny", patch_size=16, in_chans=5, drop_path_rate=0.0, mask_token=False,
                 num_register_tokens=0, mixing_blocks=0, img_size=224, separate_blocks=0):
        super().__init__(arch, patch_size, in_chans, drop_path_rate, img_size=img_size, mask_token=mask_token,
                         num_register_tokens=num_register_tokens)
        self.patch_embed = PatchEmbedPerChannel(patch_size, in_chans, self.embed_dim)
        self.mixing_blocks = mixing_blocks
        self.separate_blocks = separate_blocks
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
        x = torch.cat((cls, patches + patch_pos), dim=1)
        if self.register_tokens is not None:  # DINOv2: after the CLS token, no position
            x = torch.cat((x[:, :1], self.register_tokens.expand(B, -1, -1), x[:, 1:]), dim=1)
        return x

    def block_masks(self, x):
        """The mask of each block for the input x [B, k, H, W] (None: unrestricted): the
        first separate_blocks within a channel, the mixing_blocks after them within a
        position."""
        if self.mixing_blocks == 0 and self.separate_blocks == 0:
            return [None] * len(self.blocks)
        B, k, h, w = x.shape
        p = self.patch_embed.patch_size
        n = (h // p) * (w // p)
        s, m = self.separate_blocks, self.mixing_blocks
        sep = separate_mask(k, n, self.num_register_tokens) if s else None
        mix = mixing_mask(k, n, self.num_register_tokens) if m else None
        return [sep if i < s else mix if i < s + m else None for i in range(len(self.blocks))]

    def forward(self, x, channels=None):
        masks = self.block_masks(x)
        x = self.prepare_tokens(x, channels)
        for blk, mask in zip(self.blocks, masks):
            x = blk(x, mask=mask)
        return self.norm(x)[:, 0]

    def forward_features(self, x, masks=None):
        """x_norm_clstoken and x_norm_patchtokens (iBOT), the student's masked tokens replaced
        by the mask token before the positions are added."""
        block_masks = self.block_masks(x)
        x = self.prepare_tokens(x, None, masks)
        for blk, mask in zip(self.blocks, block_masks):
            x = blk(x, mask=mask)
        x = self.norm(x)
        return x[:, 0], x[:, 1 + self.num_register_tokens:]

    def get_last_selfattention(self, x, channels=None):
        """The last block's attention over every token (registers included)."""
        masks = self.block_masks(x)
        x = self.prepare_tokens(x, channels)
        for i, (blk, mask) in enumerate(zip(self.blocks, masks)):
            if i < len(self.blocks) - 1:
                x = blk(x, mask=mask)
            else:
                return blk(x, return_attention=True, mask=mask)


def tokens_pooled_features(vit, x, channels=None):
    """downstream.features.tokens_pool: cls_and_channels of x [B, k, H, W]: the CLS token and
    each channel's mean patch token (in the input's channel order), each L2-normalised,
    concatenated [B, (k+1)·D]."""
    masks = vit.block_masks(x)
    t = vit.prepare_tokens(x, channels)
    for blk, mask in zip(vit.blocks, masks):
        t = blk(t, mask=mask)
    t = vit.norm(t)
    B, k = x.shape[:2]
    cls, patches = t[:, 0], t[:, 1 + vit.num_register_tokens:]
    per_channel = patches.reshape(B, k, -1, patches.shape[-1]).mean(dim=2)
    parts = torch.cat([cls[:, None], per_channel], dim=1)
    return torch.nn.functional.normalize(parts, dim=-1).reshape(B, -1)


def tokens_joint_and_alone_features(vit, x, channels=None):
    """downstream.features.tokens_pool: joint_and_alone of x [B, k, H, W]: the
    cls_and_channels feature of the pass over all k channels, then each channel's
    cls_and_channels feature from a pass over that channel alone, each of the k+1 views scaled
    to unit length, concatenated [B, (3k+1)·D]; one channel: its cls_and_channels [B, 2·D]."""
    k = x.shape[1]
    joint = tokens_pooled_features(vit, x, channels)
    if k == 1:
        return joint
    chans = list(range(k)) if channels is None else list(channels)
    views = [joint] + [tokens_pooled_features(vit, x[:, i:i + 1], [chans[i]]) for i in range(k)]
    return torch.cat([torch.nn.functional.normalize(v, dim=-1) for v in views], dim=1)


def bag_features(vit, x):
    """Bag-of-Channels features of x [B, k, H, W] from a single-channel ViT: (the per-channel
    CLS tokens concatenated in channel order [B, k·D], their mean [B, D])."""
    B, k, H, W = x.shape
    cls = vit(x.reshape(B * k, 1, H, W)).reshape(B, k, -1)
    return cls.reshape(B, -1), cls.mean(dim=1)


def channel_tokens(patches, k):
    """Each channel's own token of patches [I, k·n, D] (channel-major): the mean of its n patch
    tokens, [I·k, D] in (image, channel) order (the trainer's `train.channel_dino_weight`)."""
    return patches.reshape(patches.shape[0], k, -1, patches.shape[-1]).mean(dim=2).flatten(0, 1)


def crops_forward(net, crops):
    """A MultiCropWrapper-like `net` (a ChannelVisionTransformer backbone, a head) on crops
    without masks: the global crops through the backbone together, then the local crops
    together (as the trainer's step groups them by width), giving the head's CLS logits, the
    CLS tokens and the head's logits of each channel's token (one head call of their own),
    rows in (crop, image, channel) order."""
    k = crops[0].shape[1]
    cls, patches = net.backbone.forward_features(torch.cat(crops[:2]))
    cls, tokens = [cls], [channel_tokens(patches, k)]
    if len(crops) > 2:
        c, p = net.backbone.forward_features(torch.cat(crops[2:]))
        cls.append(c)
        tokens.append(channel_tokens(p, k))
    cls = torch.cat(cls)
    return net.head(cls), cls, net.head(torch.cat(tokens))
