"""Small, seeded demo models shared by the notebooks, the tests and the benchmarks.

Every constructor takes ``seed`` so two builds give identical weights: notebooks compare a
technique against a baseline (DataParallel vs one device, accumulation vs a big batch) and
need the same starting point. Each model has a matching ``*_batch`` function that makes a
seeded input batch of the right shape on a given device.

Building a model leaves the learner's random state alone: the layers are initialised inside
``torch.random.fork_rng`` with the CPU generator seeded, so ``torch.manual_seed(0); MLP();
torch.rand(1)`` draws the same number as ``torch.manual_seed(0); torch.rand(1)``. The weights
are the ones ``torch.manual_seed(seed)`` followed by the same layers gives (tested).
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator

import torch
from torch import nn

__all__ = [
    "MLP",
    "ConvNet",
    "LSTMClassifier",
    "TinyTransformer",
    "EmbeddingBagClassifier",
    "TiedLM",
    "mlp_batch",
    "image_batch",
    "token_batch",
    "seeded",
]


# The largest size any of these demo models takes: far above what a notebook builds, far below
# what would try to allocate more memory than any machine has.
_MAX_SIZE = 1 << 20


def _check(owner: str, **sizes: object) -> None:
    """Every size argument of the models and batches, checked in one place: a whole number from
    1 to ``_MAX_SIZE`` (``seed``: any whole number from 0 to 2**63 - 1). One sentence for the
    first bad one."""
    for name, value in sizes.items():
        low, high = (0, 2**63 - 1) if name == "seed" else (1, _MAX_SIZE)
        try:  # int, NumPy's ints and 0-d integer tensors; not floats, not text
            number = None if isinstance(value, bool) else operator.index(value)
        except TypeError:
            number = None
        if number is None or not low <= number <= high:
            raise ValueError(
                f"{owner}: {name} must be a whole number from {low} to {high:,}; got {value!r}"
            )


def seeded(seed: int) -> torch.Generator:
    """A CPU generator with a fixed seed (draw on CPU, then move: identical on every device)."""
    _check("seeded", seed=seed)
    return torch.Generator().manual_seed(seed)


@contextlib.contextmanager
def _initialised_with(seed: int) -> Iterator[None]:
    """Layers built inside draw from the CPU generator seeded with ``seed``; on exit the
    generator is back where the learner left it (and no CUDA generator is touched)."""
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)
        yield


class MLP(nn.Module):
    """Linear - ReLU - Linear (- ReLU - Linear ...). The workhorse of the memory demos."""

    def __init__(
        self, d_in: int = 256, d_hidden: int = 1024, d_out: int = 10, depth: int = 2, seed: int = 0
    ):
        _check("MLP", d_in=d_in, d_hidden=d_hidden, d_out=d_out, depth=depth, seed=seed)
        super().__init__()
        with _initialised_with(seed):
            dims = [d_in] + [d_hidden] * (depth - 1) + [d_out]
            layers: list[nn.Module] = []
            for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
                layers.append(nn.Linear(a, b))
                if i < len(dims) - 2:
                    layers.append(nn.ReLU())
            self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, d_in) -> (B, d_out)
        return self.net(x)


def mlp_batch(batch: int = 32, d_in: int = 256, device="cpu", seed: int = 1) -> torch.Tensor:
    _check("mlp_batch", batch=batch, d_in=d_in, seed=seed)
    return torch.randn(batch, d_in, generator=seeded(seed)).to(device)


class ConvNet(nn.Module):
    """Two conv blocks with BatchNorm, then a linear head: the cuDNN and channels_last demos."""

    def __init__(self, channels: int = 16, n_classes: int = 10, seed: int = 0):
        _check("ConvNet", channels=channels, n_classes=n_classes, seed=seed)
        super().__init__()
        with _initialised_with(seed):
            self.features = nn.Sequential(
                nn.Conv2d(3, channels, 3, padding=1),
                nn.BatchNorm2d(channels),
                nn.ReLU(),
                nn.Conv2d(channels, 2 * channels, 3, padding=1),
                nn.BatchNorm2d(2 * channels),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(1),
            )
            self.head = nn.Linear(2 * channels, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, H, W) -> (B, n_classes)
        return self.head(self.features(x).flatten(1))


def image_batch(batch: int = 8, size: int = 32, device="cpu", seed: int = 1) -> torch.Tensor:
    _check("image_batch", batch=batch, size=size, seed=seed)
    return torch.randn(batch, 3, size, size, generator=seeded(seed)).to(device)


class LSTMClassifier(nn.Module):
    def __init__(
        self,
        vocab: int = 1000,
        d_model: int = 64,
        hidden: int = 128,
        n_classes: int = 5,
        seed: int = 0,
    ):
        _check(
            "LSTMClassifier", vocab=vocab, d_model=d_model, hidden=hidden, n_classes=n_classes,
            seed=seed,
        )  # fmt: skip
        super().__init__()
        with _initialised_with(seed):
            self.embed = nn.Embedding(vocab, d_model)
            self.lstm = nn.LSTM(d_model, hidden, batch_first=True)
            self.head = nn.Linear(hidden, n_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, n_classes)
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out[:, -1])


class TinyTransformer(nn.Module):
    """A small encoder (pre-norm) with a classification head."""

    def __init__(
        self,
        vocab: int = 1000,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        n_classes: int = 5,
        seed: int = 0,
    ):
        _check(
            "TinyTransformer", vocab=vocab, d_model=d_model, n_heads=n_heads, n_layers=n_layers,
            n_classes=n_classes, seed=seed,
        )  # fmt: skip
        if d_model % n_heads:
            raise ValueError(
                f"TinyTransformer: d_model={d_model} must be a multiple of n_heads={n_heads} "
                "(each head gets d_model / n_heads features): change one of them"
            )
        super().__init__()
        with _initialised_with(seed):
            self.embed = nn.Embedding(vocab, d_model)
            layer = nn.TransformerEncoderLayer(
                d_model, n_heads, 4 * d_model, dropout=0.0, batch_first=True, norm_first=True
            )
            self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
            self.head = nn.Linear(d_model, n_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, n_classes)
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


class EmbeddingBagClassifier(nn.Module):
    """Embedding-heavy: most bytes are in one big table, few in compute."""

    def __init__(self, vocab: int = 50_000, d_model: int = 64, n_classes: int = 5, seed: int = 0):
        _check(
            "EmbeddingBagClassifier", vocab=vocab, d_model=d_model, n_classes=n_classes, seed=seed
        )
        super().__init__()
        with _initialised_with(seed):
            self.embed = nn.Embedding(vocab, d_model)
            self.head = nn.Linear(d_model, n_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, n_classes)
        return self.head(self.embed(tokens).mean(dim=1))


class TiedLM(nn.Module):
    """A tiny language model whose output layer shares the embedding's weight (tied weights).

    ``mixer="transformer"`` puts one ``nn.TransformerEncoderLayer`` (4 heads, no dropout)
    between them instead of a Linear and a GELU.
    """

    def __init__(self, vocab: int = 2000, d_model: int = 64, seed: int = 0, mixer: str = "mlp"):
        _check("TiedLM", vocab=vocab, d_model=d_model, seed=seed)
        if mixer not in ("mlp", "transformer"):
            raise ValueError(f"TiedLM: mixer must be 'mlp' or 'transformer', not {mixer!r}")
        if mixer == "transformer" and d_model % 4:
            raise ValueError(
                f"TiedLM: with mixer='transformer', d_model must be a multiple of its 4 heads; "
                f"got {d_model}"
            )
        super().__init__()
        with _initialised_with(seed):
            self.embed = nn.Embedding(vocab, d_model)
            if mixer == "transformer":
                self.mix = nn.TransformerEncoderLayer(
                    d_model, 4, 4 * d_model, dropout=0.0, batch_first=True
                )
            else:
                self.mix = nn.Sequential(nn.Linear(d_model, d_model), nn.GELU())
            self.out = nn.Linear(d_model, vocab, bias=False)
            self.out.weight = self.embed.weight  # one Parameter, counted once

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, vocab)
        return self.out(self.mix(self.embed(tokens)))


def token_batch(
    batch: int = 8, seq: int = 16, vocab: int = 1000, device="cpu", seed: int = 1
) -> torch.Tensor:
    _check("token_batch", batch=batch, seq=seq, vocab=vocab, seed=seed)
    return torch.randint(0, vocab, (batch, seq), generator=seeded(seed)).to(device)
