"""DiChaViT's diversification losses and diverse channel sampling, transcribed from the
published code (chaudatascience/diverse_channel_vit: `models/loss_fn.py` `proxy_loss`,
`ortho_proj_loss_fn_v2`; `models/dichavit.py` `PatchEmbedPerChannel.forward`, the
`lowest_cosine_prob` branch): the oracle for trainer/src/train/dichavit.rs and
trainer/src/train/channels.rs (`diverse_sample`).

    python dichavit_reference.py losses IN OUT    (IN: the patch embedding's tensors, the crops,
                                                   the channels and the recipe; OUT: the two
                                                   weighted losses and their gradients)
    python dichavit_reference.py sampling IN OUT  (IN: channel embeddings [C, D] and t; OUT: the
                                                   probabilities per anchor and the exact
                                                   probability of every subset)
"""
import itertools
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file


def pairwise_distance_v2(proxies, x, squared=False):  # utils.py
    if squared:
        return (torch.cdist(x, proxies, p=2)) ** 2
    else:
        return torch.cdist(x, proxies, p=2)


def proxy_loss(proxies, img_emb, gt_imgs, scale):  # models/loss_fn.py
    proxies_emb = scale * F.normalize(proxies, p=2, dim=-1)
    img_emb = scale * F.normalize(img_emb, p=2, dim=-1)
    img_dist = pairwise_distance_v2(proxies=proxies_emb, x=img_emb, squared=True)
    img_dist = img_dist * -1.0
    cross_entropy = nn.CrossEntropyLoss(reduction="mean")
    return cross_entropy(img_dist, gt_imgs)


def ortho_proj_loss_fn_v2(features, labels, gamma_s, gamma_d, reverse_pos_pairs, use_square):
    device = features.device
    features = F.normalize(features, p=2, dim=-1)
    labels = labels[None, :, None]
    mask = torch.eq(labels, labels.transpose(-2, -1)).bool().to(device)
    eye = torch.eye(mask.shape[-2], mask.shape[-1]).bool().to(device).unsqueeze(0)
    mask_pos = mask.masked_fill(eye, 0).float()
    mask_neg = (~mask).float()
    dot_prod = torch.matmul(features, features.transpose(-2, -1))
    mask_pos_sum = mask_pos.sum(dim=(-2, -1)) + 1e-6
    mask_neg_sum = mask_neg.sum(dim=(-2, -1)) + 1e-6
    pos_pairs_mean = (mask_pos * dot_prod).sum(dim=(-2, -1)) / mask_pos_sum
    neg_pairs_mean = (mask_neg * dot_prod).sum(dim=(-2, -1)) / mask_neg_sum
    if use_square:
        neg_pairs_mean = neg_pairs_mean**2
    if reverse_pos_pairs:
        if use_square:
            pos_pairs_mean = pos_pairs_mean**2
        loss = gamma_s * pos_pairs_mean + gamma_d * neg_pairs_mean
    else:
        loss = gamma_s * (1.0 - pos_pairs_mean) + gamma_d * neg_pairs_mean
    return loss.mean()


def losses(inp, out):
    """`PatchEmbedPerChannel.forward`'s loss part on the given crops (x: [B, Cin, H, W], the
    step's channels `cur_channels` already selected, as after the sampling branch)."""
    t = load_file(inp)
    cfg = json.loads(open(inp + ".json").read())
    w = t["proj.weight"].clone().requires_grad_(True)  # Conv3d weight [D, 1, 1, P, P]
    b = t["proj.bias"].clone().requires_grad_(True)
    # nn.Embedding(in_chans, embed_dim).weight: our channel_embed [1, D, C, 1, 1] as rows.
    emb = t["channel_embed"].clone().requires_grad_(True)
    proxies_all = t["channel_emb_proxies"].clone().requires_grad_(True)
    cur_channels = cfg["channels"]
    x = t["x"]
    p = w.shape[-1]
    y = F.conv3d(x.unsqueeze(1), w, b, stride=(1, p, p))  # B Cout Cin H W
    n_patches = y.shape[3] * y.shape[4]
    token_labels = torch.arange(y.shape[2]).repeat_interleave(n_patches)
    # einops' rearrange(y, "B Cout Cin H W -> B (Cin H W) Cout") (einops is not in the venv).
    x_reshaped = y.permute(0, 2, 3, 4, 1).reshape(y.shape[0], -1, y.shape[1]).clone()
    tdl = ortho_proj_loss_fn_v2(x_reshaped, labels=token_labels, gamma_s=cfg["gamma_s"],
                                gamma_d=cfg["gamma_d"], reverse_pos_pairs=cfg["reverse"],
                                use_square=False)
    channel_embed = F.embedding(torch.tensor(cur_channels),
                                emb.reshape(emb.shape[1], emb.shape[2]).t())
    cin = len(cur_channels)
    channel_gt = torch.eye(cin)
    cdl = proxy_loss(proxies_all[cur_channels], channel_embed, channel_gt,
                     scale=(1.0 / cfg["temperature"]) ** 0.5)
    cdl = cdl * cfg["cdl_weight"]
    tdl = tdl * cfg["tdl_weight"]
    res = {"cdl": cdl.detach().reshape(1), "tdl": tdl.detach().reshape(1)}
    g = torch.autograd.grad(cdl, [emb, proxies_all])
    res["cdl.channel_embed"], res["cdl.channel_emb_proxies"] = g
    g = torch.autograd.grad(tdl, [w, b])
    res["tdl.proj.weight"], res["tdl.proj.bias"] = g
    save_file({k: v.contiguous() for k, v in res.items()}, out)


def sampling(inp, out):
    """The `lowest_cosine_prob` branch: its probabilities for every anchor, and, by
    enumerating the ordered draws of `torch.multinomial(prob, k, replacement=False)` (each
    draw in proportion to the weights not drawn yet), the exact probability of every subset
    of one step (k = randint(1, C), anchor = randint(0, C - 1), both uniform; the anchor put
    in the last place when not drawn)."""
    t = load_file(inp)
    cfg = json.loads(open(inp + ".json").read())
    channel_embed = t["embeddings"]
    c = channel_embed.shape[0]
    channel_emb_norm = F.normalize(channel_embed, p=2, dim=-1)
    channel_embed_cosine = torch.einsum("c d, e d -> c e", channel_emb_norm, channel_emb_norm)
    probs = []
    for first_channel_idx in range(c):
        cosine_scores = channel_embed_cosine[first_channel_idx]
        scores = (1 - cosine_scores) / cfg["temperature"]
        probs.append(F.softmax(scores, dim=-1))
    probs = torch.stack(probs).double()
    subsets = {}
    for k in range(1, c + 1):
        for anchor in range(c):
            prob = probs[anchor].tolist()
            for seq in itertools.permutations(range(c), k):
                pr, left = 1.0, 1.0
                for j in seq:
                    pr *= prob[j] / left
                    left -= prob[j]
                seq = list(seq)
                if anchor not in seq:
                    seq[-1] = anchor
                key = sum(1 << j for j in seq)
                subsets[key] = subsets.get(key, 0.0) + pr / (c * c)
    masks = sorted(subsets)
    save_file({"probabilities": probs.contiguous(),
               "subset_masks": torch.tensor(masks, dtype=torch.int64),
               "subset_probabilities": torch.tensor([subsets[m] for m in masks],
                                                    dtype=torch.float64)}, out)


if __name__ == "__main__":
    {"losses": losses, "sampling": sampling}[sys.argv[1]](sys.argv[2], sys.argv[3])
