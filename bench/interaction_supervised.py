"""Is scripts/interaction.py's task learnable at all, and can per-channel tokens beat a bag?

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python bench/interaction_supervised.py \
        [--size 16] [--patch 4] [--radius R] [--dot D] [--per-class 200] \
        [--test-per-class 200] [--seeds 0 1 2] [--epochs 60] \
        [--models logreg mlp knn20 cnn fixed tokens bag bag_mlp] [--cache DIR]
        [--lr 1e-3] [--warmup 0.05] [--batch 64] [--no-augment] [--log-every N]
        [--dim 64] [--depth 4] [--heads 4] [--registers 0] [--init torch|dino]
        [--pos learned|sincos|sincos_learned] [--pos-std 0.02] [--chan-std 0.02]
        [--qk-init default|mimetic] [--qk-scale 1] [--qk-blocks N] [--local-blocks N]

Issue 48 asks for a self-supervised `model.channels: tokens` model above `bag` on the
interaction task; every self-supervised approach stayed at chance there (BENCHMARKS.md, runs 6
and 7). Before blaming the self-supervised recipe, this asks whether the task, as drawn, can be
learned from labels at all by small models on the CPU, and which designs can learn it:

  logreg   logistic regression on the standardised raw pixels (scikit-learn)
  mlp      a one-hidden-layer MLP (256 units) on the raw pixels (scikit-learn)
  knn20    a 20-nearest-neighbour vote on the raw pixels (cosine; what `trainer evaluate`'s
           20-NN does with features that are the pixels themselves)
  cnn      a small supervised CNN (three 3x3 conv layers over all channels, global max pool,
           linear): every pixel sees every channel, so "a dot of channel i on the disk of
           channel j" is a per-pixel feature for it
  fixed    the same ViT with scDINO's `fixed` tokens: one patch embedding over all channels at
           once (16 tokens + CLS), so every token already sees every channel (the control for
           "is it the ViT or the per-channel tokens?")
  tokens   a supervised ChannelViT-style ViT: one patch projection shared by the channels, a
           learned channel embedding and shared position embeddings, joint attention over all
           channels' patch tokens (3 x N tokens + CLS), linear head on the CLS token
  bag      a supervised Bag-of-Channels model: the same ViT on one channel at a time (N
           tokens + CLS), the three CLS tokens concatenated, then a linear classifier (what
           `bag`'s linear probe can do at best: trained end to end, with the labels)
  bag_mlp  the same bag, a two-layer MLP instead of the linear classifier (a nonlinear
           readout of per-channel features; not what `trainer evaluate` does)

The models trained by gradient descent (cnn, tokens, bag, bag_mlp) use AdamW, a cosine
schedule and the eight flips/rotations by 90 degrees applied to all channels together (the
class is invariant under them). Data: `scripts/interaction.py`'s own `draw` (so its options:
--size, --radius, --dot), a training set of 6 x --per-class images (data seed 0) and a
separate test set of 6 x --test-per-class (data seed 1); the model seeds vary (--seeds).
Prints one Markdown table: test top-1 % per model, mean +- sample sd over the seeds, the CPU
seconds per seed, the last training batch's loss per seed (ln 6 = 1.79 is a uniform guess; the
last batch of an epoch may be small, so this is noisy) and the top-1 on the training set
itself (eval mode, no augmentation); --log-every N prints both top-1s every N epochs. Chance is
16.7 %.

Why does the `tokens` ViT not learn what the `fixed` one does (BENCHMARKS.md, issue 48 run 9)?
The knobs of that search, each default being the network of run 8 (which these defaults
reproduce): the position embedding (--pos: DINO's learned N(0, 0.02^2), larger --pos-std, or
MAE's fixed 2-D sin-cos table times --pos-std), the channel embedding's init std (--chan-std),
a "mimetic" query/key init (--qk-init mimetic: each head's W_k starts equal to its W_q, times
--qk-scale, in the first --qk-blocks blocks: a token then attends most to tokens like itself,
with a large position embedding to those at its own position), the blocks' init (--init dino:
trunc-normal(0.02) Linear weights, the trainer's), and an oracle that is not a trainer option
(--local-blocks N: in the first N blocks each patch token may attend only to the tokens at its
own position, every channel's, and the CLS token).

Why a linear classifier on per-channel features (bag, and `bag`'s linear probe) stays at
chance in expectation whatever the features are: with features f(x_a), f(x_b), f(x_c) the
logits are additive, W_a f(x_a) + W_b f(x_b) + W_c f(x_c) + b; each channel alone is drawn the
same way in every class, so the gradient of the expected cross-entropy at W = 0 is
E[(onehot(y) - 1/6) f(x_i)^T] = 0 for every i, and that convex problem's optimum is W = 0
(chance). Whatever it scores above chance on a finite test set is fitting noise (or the
little that the drawing leaks). A nonlinear readout (bag_mlp, or a k-NN vote) is not bound
by this.
"""
import argparse
import inspect
import itertools
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import colocalisation  # noqa: E402
import interaction  # noqa: E402

# The task's class count (--task sets it before any model is built).
N_CLASSES = 6

torch.set_num_threads(1)


def dataset(n_per_class, size, seed, draw_kw, cache, task="interaction"):
    key = "_".join(f"{k}{v}" for k, v in sorted(draw_kw.items()))
    path = cache and os.path.join(cache, f"{task}_s{size}_n{n_per_class}_seed{seed}_{key}.npz")
    if path and os.path.exists(path):
        z = np.load(path)
        return z["x"], z["y"]
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    if task == "colocalisation":
        draws = [lambda pair=pair: colocalisation.draw(rng, size, pair, **draw_kw)
                 for pair in colocalisation.CLASSES.values()]
    else:
        draws = [lambda s=s, t=t: interaction.draw(rng, size, s, t, **draw_kw)
                 for s, t in itertools.permutations(range(3), 2)]
    for k, one in enumerate(draws):
        for _ in range(n_per_class):
            xs.append(one().transpose(2, 0, 1))
            ys.append(k)
    x, y = np.stack(xs).astype(np.float32), np.array(ys)
    if path:
        os.makedirs(cache, exist_ok=True)
        np.savez(path, x=x, y=y)
    return x, y


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, mask=None):
        h = self.n1(x)
        x = x + self.attn(h, h, h, need_weights=False, attn_mask=mask)[0]
        return x + self.mlp(self.n2(x))


def sincos_2d(grid, dim):
    """MAE's fixed 2-D sin-cos position embedding (`get_2d_sincos_pos_embed`, no class
    position): [grid*grid, dim], half the dimensions for the row, half for the column, each
    half sin and cos at dim/4 frequencies 1/10000^(i/(dim/4)); every entry in [-1, 1]."""
    assert dim % 4 == 0
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4))
    ys, xs = torch.meshgrid(torch.arange(grid, dtype=torch.float64),
                            torch.arange(grid, dtype=torch.float64), indexing="ij")

    def one(pos):
        out = pos.reshape(-1, 1) * omega.reshape(1, -1)
        return torch.cat([out.sin(), out.cos()], 1)

    return torch.cat([one(ys), one(xs)], 1).float()


class ViT(nn.Module):
    """A ViT whose every patch token is one channel's patch (ChannelViT's layout): with
    `channels` = 3 the three channels' tokens attend to each other; with 1 it is the
    single-channel ViT of a bag.

    `pos`: the position embedding shared by the channels: "learned" (DINO's: a parameter
    initialised N(0, pos_std^2); pos_std 0.02 is DINO's and the trainer's), "sincos" (MAE's
    fixed 2-D sin-cos table times pos_std, not trained) or "sincos_learned" (that table as the
    initial value of a learned parameter)."""

    def __init__(self, size, patch, channels, dim=64, depth=4, heads=4, pos="learned",
                 pos_std=0.02, registers=0, qk_init="default", qk_scale=1.0, fixed=False,
                 chan_std=0.02, local_blocks=0, init="torch", qk_blocks=None):
        super().__init__()
        g = size // patch
        n = g * g
        # fixed: DINO's patch embedding over all channels at once (scDINO's `fixed` mode), one
        # token per patch: the control whose every token already sees every channel.
        self.fixed = fixed
        self.proj = nn.Conv2d(channels if fixed else 1, dim, patch, patch)
        if fixed:
            channels = 1
        if pos == "learned":
            self.pos = nn.Parameter(torch.randn(1, 1, n, dim) * pos_std)
        elif pos == "sincos":
            self.register_buffer("pos", sincos_2d(g, dim).reshape(1, 1, n, dim) * pos_std)
        elif pos == "sincos_learned":
            self.pos = nn.Parameter(sincos_2d(g, dim).reshape(1, 1, n, dim) * pos_std)
        else:
            raise ValueError(pos)
        # chan_std: the channel embedding's init std (0.02: the trainer's orthogonal rows of
        # norm 0.02·sqrt(dim) have that scale per entry).
        self.chan = nn.Parameter(torch.randn(1, channels, 1, dim) * chan_std)
        self.reg = nn.Parameter(torch.randn(1, registers, dim) * 1e-6) if registers else None
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(depth)])
        # local_blocks (a diagnostic, not a trainer option): the first local_blocks blocks let
        # each patch token attend only to the tokens at its own position (every channel's) and
        # the CLS token; the CLS token attends to all. An oracle of "find the same place in the
        # other channels", to see whether that is what the network fails to find.
        self.local_blocks = local_blocks
        if local_blocks:
            pos_of = torch.arange(channels * n) % n
            allowed = pos_of[:, None] == pos_of[None, :]
            m = torch.ones(1 + registers + channels * n, 1 + registers + channels * n, dtype=torch.bool)
            m[1 + registers :, 1 + registers :] = allowed
            m[:, 0] = True
            m[0, :] = True
            self.register_buffer("local_mask", ~m)
        self.norm = nn.LayerNorm(dim)
        self.dim = dim
        if init == "dino":
            # The trainer's (DINO's `_init_weights`): every Linear weight, the attention's
            # fused qkv included, trunc-normal(0.02) clamped to ±2, biases 0; LayerNorm 1/0;
            # the patch projection keeps PyTorch's default (as the trainer's).
            with torch.no_grad():
                for mod in self.blocks.modules():
                    if isinstance(mod, nn.Linear):
                        mod.weight.normal_(0, 0.02).clamp_(-2, 2)
                        mod.bias.zero_()
                    elif isinstance(mod, nn.MultiheadAttention):
                        mod.in_proj_weight.normal_(0, 0.02).clamp_(-2, 2)
                        mod.in_proj_bias.zero_()
        elif init != "torch":
            raise ValueError(init)
        if qk_init == "mimetic":
            # Each head's key projection starts equal to its query projection (W_k := W_q, both
            # times qk_scale), so q·k' = x^T W_q^T W_q x' is a positive semi-definite kernel:
            # a token attends most to tokens like itself, i.e. with a large enough position
            # embedding, to the tokens at its own position (every channel's). A simple form
            # of Trockman & Kolter's mimetic initialisation (2023: W_q W_k^T ≈ αZ + βI).
            # qk_blocks: only the first qk_blocks blocks (None: all).
            with torch.no_grad():
                for blk in list(self.blocks)[:qk_blocks]:
                    w = blk.attn.in_proj_weight
                    w[:dim] *= qk_scale
                    w[dim : 2 * dim] = w[:dim]
        elif qk_init != "default":
            raise ValueError(qk_init)

    def forward(self, x):  # x: B, C, H, W -> B, dim (the CLS token)
        b, c = x.shape[:2]
        if self.fixed:
            x, c = x.unsqueeze(1), 1
        t = self.proj(x.reshape(b * c, x.shape[-3] if self.fixed else 1, *x.shape[-2:]))
        t = t.flatten(2).transpose(1, 2)
        t = (t.reshape(b, c, -1, self.dim) + self.pos + self.chan).reshape(b, -1, self.dim)
        extra = [self.cls.expand(b, -1, -1)]
        if self.reg is not None:
            extra.append(self.reg.expand(b, -1, -1))
        t = torch.cat(extra + [t], 1)
        for i, blk in enumerate(self.blocks):
            t = blk(t, self.local_mask if i < self.local_blocks else None)
        return self.norm(t)[:, 0]


class Tokens(nn.Module):
    def __init__(self, size, patch, **kw):
        super().__init__()
        self.vit = ViT(size, patch, 3, **kw)
        self.head = nn.Linear(self.vit.dim, N_CLASSES)

    def forward(self, x):
        return self.head(self.vit(x))


class Fixed(nn.Module):
    def __init__(self, size, patch, **kw):
        super().__init__()
        self.vit = ViT(size, patch, 3, fixed=True, **kw)
        self.head = nn.Linear(self.vit.dim, N_CLASSES)

    def forward(self, x):
        return self.head(self.vit(x))


class Bag(nn.Module):
    def __init__(self, size, patch, mlp=False, **kw):
        super().__init__()
        self.vit = ViT(size, patch, 1, **kw)
        d = 3 * self.vit.dim
        self.head = nn.Sequential(nn.Linear(d, 256), nn.GELU(), nn.Linear(256, N_CLASSES)) if mlp else nn.Linear(d, N_CLASSES)

    def forward(self, x):
        b, c = x.shape[:2]
        f = self.vit(x.reshape(b * c, 1, *x.shape[2:])).reshape(b, -1)
        return self.head(f)


class CNN(nn.Module):
    def __init__(self, width=32):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(2 * width, N_CLASSES)

    def forward(self, x):
        return self.head(self.body(x).amax((2, 3)))


def augment(x):
    """One of the eight flips/rotations by 90 degrees, per batch, on all channels together."""
    k = int(torch.randint(4, ()))
    x = torch.rot90(x, k, (2, 3))
    return torch.flip(x, (3,)) if torch.rand(()) < 0.5 else x


def accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        x = torch.from_numpy(x)
        pred = torch.cat([model(x[i : i + 256]).argmax(1) for i in range(0, len(x), 256)])
    return 100.0 * (pred.numpy() == y).mean()


def train_torch(model, x, y, xt, yt, epochs, seed, lr=1e-3, batch=64, warmup=0.05, aug=True,
                log_every=0):
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    steps = epochs * ((len(x) + batch - 1) // batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=steps, pct_start=warmup)
    xn, yn = x, y
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    for epoch in range(epochs):
        model.train()
        perm = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), batch):
            idx = perm[i : i + batch]
            xb = augment(x[idx]) if aug else x[idx]
            loss = F.cross_entropy(model(xb), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        if log_every and (epoch + 1) % log_every == 0:
            print(f"    epoch {epoch + 1}: last batch loss {loss.item():.3f}, train top-1 "
                  f"{accuracy(model, xn, yn):.1f}, test top-1 {accuracy(model, xt, yt):.1f}",
                  flush=True)
    return accuracy(model, xt, yt), loss.item(), accuracy(model, xn, yn)


def attention_shares(vit, x):
    """At the network's current weights, the first block's attention from each patch token
    (the CLS column left out and the rest renormalised), averaged over the images of x, the
    heads and the tokens: the share on the token itself, on the other channels' tokens at the
    same position (uniform: 2/48 with 3 channels of 16 patches), on the same channel's other
    tokens, and the best head's same-position share."""
    with torch.no_grad():
        b, c = x.shape[:2]
        t = vit.proj(x.reshape(b * c, 1, *x.shape[2:])).flatten(2).transpose(1, 2)
        n = t.shape[1]
        t = (t.reshape(b, c, n, vit.dim) + vit.pos + vit.chan).reshape(b, -1, vit.dim)
        t = torch.cat([vit.cls.expand(b, -1, -1), t], 1)
        blk = vit.blocks[0]
        h = blk.n1(t)
        w = blk.attn(h, h, h, need_weights=True, average_attn_weights=False,
                     attn_mask=vit.local_mask if vit.local_blocks else None)[1][:, :, 1:, 1:]
        w = w / w.sum(-1, keepdim=True)
        pos_of, ch_of = torch.arange(c * n) % n, torch.arange(c * n) // n
        me = torch.eye(c * n, dtype=torch.bool)
        same_pos = (pos_of[:, None] == pos_of[None, :]) & ~me
        same_ch = (ch_of[:, None] == ch_of[None, :]) & ~me
        share = lambda m: (w * m).sum(-1)  # noqa: E731
        return (share(me).mean().item(), share(same_pos).mean().item(),
                share(same_ch).mean().item(), share(same_pos).mean((0, 2)).max().item())


def run(name, seed, x, y, xt, yt, a):
    torch.manual_seed(seed)
    if name == "knn20":
        from sklearn.neighbors import KNeighborsClassifier

        knn = KNeighborsClassifier(20, metric="cosine").fit(x.reshape(len(x), -1), y)
        return 100.0 * knn.score(xt.reshape(len(xt), -1), yt), float("nan"), float("nan")
    if name in ("logreg", "mlp"):
        from sklearn.linear_model import LogisticRegression
        from sklearn.neural_network import MLPClassifier
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        clf = (LogisticRegression(max_iter=2000, C=0.1) if name == "logreg"
               else MLPClassifier((256,), max_iter=500, early_stopping=True, random_state=seed))
        clf = make_pipeline(StandardScaler(), clf)
        clf.fit(x.reshape(len(x), -1), y)
        return (100.0 * clf.score(xt.reshape(len(xt), -1), yt), float("nan"),
                100.0 * clf.score(x.reshape(len(x), -1), y))
    kw = dict(dim=a.dim, depth=a.depth, heads=a.heads, pos=a.pos, pos_std=a.pos_std,
              registers=a.registers, qk_init=a.qk_init, qk_scale=a.qk_scale,
              chan_std=a.chan_std, local_blocks=a.local_blocks, init=a.init,
              qk_blocks=a.qk_blocks)
    model = {"cnn": lambda: CNN(),
             "tokens": lambda: Tokens(a.size, a.patch, **kw),
             "fixed": lambda: Fixed(a.size, a.patch, **kw),
             "bag": lambda: Bag(a.size, a.patch, **kw),
             "bag_mlp": lambda: Bag(a.size, a.patch, mlp=True, **kw)}[name]()
    if a.probe and name == "tokens":
        shares = attention_shares(model.vit, torch.from_numpy(x[:: max(1, len(x) // 64)][:64]))
        print(f"    seed {seed}, at init, block 0, patch tokens' attention: self {shares[0]:.3f}, "
              f"other channels at the same position {shares[1]:.3f} (uniform "
              f"{2 / (3 * (a.size // a.patch) ** 2):.3f}), same channel elsewhere {shares[2]:.3f}, "
              f"best head's same-position {shares[3]:.3f}", flush=True)
        return float("nan"), float("nan"), float("nan")
    return train_torch(model, x, y, xt, yt, a.epochs, seed, lr=a.lr, batch=a.batch,
                       warmup=a.warmup, aug=not a.no_augment, log_every=a.log_every)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=["interaction", "colocalisation"], default="interaction",
                   help="scripts/interaction.py's task (6 classes) or scripts/colocalisation.py's "
                   "(4 classes; --dot and --radius do not apply, --cell and --spots do)")
    p.add_argument("--size", type=int, default=16)
    p.add_argument("--patch", type=int, default=4)
    p.add_argument("--cell", type=int, help="colocalisation: a spot's side (colocalisation.py --cell)")
    p.add_argument("--spots", type=int, help="colocalisation: spots per channel (--spots)")
    params = inspect.signature(interaction.draw).parameters
    if "radius" in params:
        p.add_argument("--radius", type=float, help="disk radius in pixels (interaction.py --radius)")
    if "dot" in params:
        p.add_argument("--dot", type=int, help="dot side in pixels (interaction.py --dot)")
    p.add_argument("--per-class", type=int, default=200)
    p.add_argument("--test-per-class", type=int, default=200)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--models", nargs="+", default=["logreg", "mlp", "knn20", "cnn", "tokens", "bag", "bag_mlp"])
    p.add_argument("--lr", type=float, default=1e-3, help="peak lr of the one-cycle schedule")
    p.add_argument("--warmup", type=float, default=0.05, help="fraction of the steps warming up")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--no-augment", action="store_true", help="no flips/rotations")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--registers", type=int, default=0, help="register tokens after the CLS")
    p.add_argument("--pos", choices=["learned", "sincos", "sincos_learned"], default="learned",
                   help="position embedding (ViT docstring)")
    p.add_argument("--pos-std", type=float, default=0.02,
                   help="learned: init std; sincos*: the table's scale (default 0.02, DINO's)")
    p.add_argument("--qk-init", choices=["default", "mimetic"], default="default",
                   help="mimetic: every head's key projection starts equal to its query's")
    p.add_argument("--qk-scale", type=float, default=1.0, help="mimetic: W_q (and so W_k) times this")
    p.add_argument("--qk-blocks", type=int, default=None,
                   help="mimetic: only the first N blocks (default: all)")
    p.add_argument("--chan-std", type=float, default=0.02, help="channel embedding init std")
    p.add_argument("--init", choices=["torch", "dino"], default="torch",
                   help="the blocks' init: PyTorch's defaults, or DINO's (the trainer's)")
    p.add_argument("--local-blocks", type=int, default=0,
                   help="diagnostic: the first N blocks attend only within a position (ViT docstring)")
    p.add_argument("--probe", action="store_true",
                   help="tokens: print the first block's attention shares at init, do not train")
    p.add_argument("--log-every", type=int, default=0, help="print train/test top-1 every N epochs")
    p.add_argument("--cache", default=os.environ.get("TMPDIR", "/tmp") + "/interaction_cache")
    a = p.parse_args()
    global N_CLASSES
    keys = ("cell", "spots") if a.task == "colocalisation" else ("radius", "dot")
    kw = {k: getattr(a, k) for k in keys if getattr(a, k, None) is not None}
    N_CLASSES = len(colocalisation.CLASSES) if a.task == "colocalisation" else 6
    x, y = dataset(a.per_class, a.size, 0, kw, a.cache, a.task)
    xt, yt = dataset(a.test_per_class, a.size, 1, kw, a.cache, a.task)
    mean, std = x.mean((0, 2, 3), keepdims=True), x.std((0, 2, 3), keepdims=True)
    x, xt = (x - mean) / std, (xt - mean) / std
    print(f"task {a.task} ({N_CLASSES} classes), size {a.size}, patch {a.patch}, draw {kw or 'defaults'}, {len(x)} training / "
          f"{len(xt)} test images, {a.epochs} epochs, seeds {a.seeds}, lr {a.lr}, warmup "
          f"{a.warmup}, batch {a.batch}, augment {not a.no_augment}, ViT dim {a.dim} depth "
          f"{a.depth} heads {a.heads} registers {a.registers}, pos {a.pos} {a.pos_std}, qk {a.qk_init} "
          f"{a.qk_scale} (blocks: {a.qk_blocks or 'all'}), channel embedding std {a.chan_std}, local blocks {a.local_blocks}, init {a.init}", flush=True)
    print("| model | test top-1 % (mean ± sd) | per seed | CPU s per seed | last batch's training loss "
          "| training-set top-1 % |\n|---|---|---|---|---|---|")
    for name in a.models:
        accs, cpu, losses, train = [], [], [], []
        for seed in a.seeds:
            t = time.process_time()
            acc, loss, tr = run(name, seed, x, y, xt, yt, a)
            accs.append(acc)
            losses.append(loss)
            train.append(tr)
            cpu.append(time.process_time() - t)
        sd = np.std(accs, ddof=1) if len(accs) > 1 else 0.0
        print(f"| {name} | {np.mean(accs):.1f} ± {sd:.1f} | {' / '.join(f'{v:.1f}' for v in accs)} "
              f"| {np.mean(cpu):.0f} | {' / '.join(f'{v:.2f}' for v in losses)} "
              f"| {' / '.join(f'{v:.1f}' for v in train)} |", flush=True)


if __name__ == "__main__":
    main()
