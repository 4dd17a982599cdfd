"""The demo's reference model: a small pre-LN transformer classifier of handwritten digits.

Data: scikit-learn's bundled 8x8 digits (1797 images, shipped with the package, nothing
downloaded). Each image is resized to image x image pixels and cut into patch x patch patches, one
token each (a Linear of its pixels plus a learned position), with a class token in front: 28 / 2
gives 197 tokens, ViT-B/16's sequence length. Blocks are written with the modules fusedops.swap
replaces: nn.LayerNorm, an explicit nn.Softmax over the attention scores and an
nn.Sequential(Linear, GELU, Linear) MLP.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn


@dataclass(frozen=True)
class Config:
    d_model: int = 768
    heads: int = 12
    depth: int = 6
    mlp_ratio: int = 4
    image: int = 28  # side of the resized image
    patch: int = 2  # tokens = (image / patch)^2 + 1
    epochs: int = 20
    batch: int = 64
    lr: float = 1e-4  # 1e-3 left the 768-wide, 6-deep model at 22% (measured on an H100)
    seed: int = 0

    @property
    def tokens(self) -> int:
        return (self.image // self.patch) ** 2 + 1

    def key(self) -> str:
        """A short hash of the config: the checkpoint's file name."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


FULL = Config()
QUICK = Config(d_model=64, heads=4, depth=2, image=8, epochs=10, lr=1e-3)


class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        if d % heads:
            raise ValueError(f"Attention: d_model {d} is not divisible by heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.softmax = nn.Softmax(dim=-1)  # a module, so fusedops.swap can replace it
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        out = self.softmax(scores) @ v  # [b, heads, t, d / heads]
        return self.proj(out.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(
            nn.Linear(d, mlp_ratio * d), nn.GELU(), nn.Linear(mlp_ratio * d, d)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Predictor(nn.Module):
    """images [batch, image, image] in [0, 1] -> logits [batch, 10]."""

    def __init__(self, cfg: Config):
        super().__init__()
        if cfg.image % cfg.patch:
            raise ValueError(f"Predictor: image {cfg.image} is not divisible by patch {cfg.patch}")
        d = cfg.d_model
        self.patch = cfg.patch
        self.embed = nn.Linear(cfg.patch**2, d)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, cfg.tokens, d) * 0.02)
        self.blocks = nn.Sequential(*(Block(d, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.depth)))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        p = self.patch
        patches = images.unfold(1, p, p).unfold(2, p, p)  # [batch, rows, cols, p, p]
        x = self.embed(patches.flatten(3).flatten(1, 2))  # one token per patch
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


def digits(side: int) -> tuple[torch.Tensor, ...]:
    """(train images, train labels, test images, test labels): sklearn's digits, a fixed 80/20
    split, images resized to [n, side, side] in [0, 1]."""
    from sklearn.datasets import load_digits

    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = nn.functional.interpolate(images, size=(side, side), mode="bilinear").squeeze(1)
    labels = torch.tensor(data.target)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    split = len(labels) * 4 // 5
    train, test = order[:split], order[split:]
    return images[train], labels[train], images[test], labels[test]


@torch.no_grad()
def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch: int = 256):
    """(fraction correct, predicted labels) of model on images, evaluated in batches."""
    preds = torch.cat(
        [model(images[i : i + batch]).argmax(-1) for i in range(0, len(images), batch)]
    )
    return (preds == labels).float().mean().item(), preds


def train(cfg: Config, device: torch.device, progress=None) -> tuple[Predictor, float]:
    """Train a Predictor on digits with AdamW; returns it (fp32, eval mode) and test accuracy.

    progress(iterable, desc) wraps the epoch loop (a tqdm); on CUDA the matmuls run under bf16
    autocast.
    """
    torch.manual_seed(cfg.seed)
    xtr, ytr, xte, yte = (t.to(device) for t in digits(cfg.image))
    model = Predictor(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    autocast = torch.autocast("cuda", torch.bfloat16, enabled=device.type == "cuda")
    epochs = range(cfg.epochs)
    for _ in progress(epochs, "train") if progress else epochs:
        model.train()
        for idx in torch.randperm(len(ytr), device=device).split(cfg.batch):
            with autocast:
                loss = nn.functional.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    model.eval()
    return model, accuracy(model, xte, yte)[0]


def load_or_train(
    cfg: Config, device: torch.device, cache: Path, progress=None
) -> tuple[Predictor, float, Path, bool]:
    """The trained Predictor for cfg from cache/predictor-<key>.pt, trained and saved there when
    absent. Returns (model in eval mode, test accuracy at training, checkpoint path, cached)."""
    path = Path(cache) / f"predictor-{cfg.key()}.pt"
    if path.exists():
        ckpt = torch.load(path, map_location=device, weights_only=True)
        model = Predictor(cfg).to(device)
        model.load_state_dict(ckpt["state_dict"])
        return model.eval(), ckpt["accuracy"], path, True
    model, acc = train(cfg, device, progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"config": asdict(cfg), "state_dict": model.state_dict(), "accuracy": acc}, path)
    return model, acc, path, False
