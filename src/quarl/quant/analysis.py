"""Weight statistics that explain how well a policy quantizes (the paper's Section on
weight distributions: the wider the distribution, the larger the rounding error)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats
from torch import nn

from quarl.core.atomic import write_atomic
from quarl.core.table import CellValue, Row
from quarl.quant.layers import linear_layers
from quarl.quant.primitives import quantize_dequantize, resolve_granularity

KL_BINS = 128
"""Fewest bins of the KL grid; a sweep that reaches n bits uses 2^n when that is more."""
KL_EPS = 1e-10


def _rounded(value: CellValue, digits: int | None) -> CellValue:
    return round(value, digits) if digits is not None and isinstance(value, float) else value


class _TableRecord:
    """A dataclass that is a row of a table written as CSV, Markdown and JSON and printed."""

    def row(self, digits: int | None = None) -> Row:
        """The fields as a table row, in their order (floats rounded to ``digits``)."""
        assert dataclasses.is_dataclass(self)
        return {f.name: _rounded(getattr(self, f.name), digits) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class WeightStats(_TableRecord):
    """One Linear / Conv2d weight's distribution (a row of ``weights.*``)."""

    layer: str
    shape: str
    params: int
    min: float
    max: float
    range: float
    mean: float
    std: float
    kurtosis: float
    """Excess kurtosis (NaN under 4 weights)."""


@dataclass(frozen=True)
class RoundingError(_TableRecord):
    """One layer's weights rounded to ``bits`` against fp32's (a row of ``kl.*``)."""

    layer: str
    bits: int
    sqnr_db: float
    mse: float
    mean_abs_error: float
    kl: float


def weight_stats(network: nn.Module) -> list[WeightStats]:
    """min, max, range, mean, std, excess kurtosis of each Linear / Conv2d weight."""
    rows = []
    for name, layer in linear_layers(network):
        w = layer.weight.detach().float().numpy().ravel()
        rows.append(WeightStats(
            layer=name,
            shape="x".join(str(d) for d in layer.weight.shape),
            params=int(w.size),
            min=float(w.min()),
            max=float(w.max()),
            range=float(w.max() - w.min()),
            mean=float(w.mean()),
            std=float(w.std()),
            kurtosis=float(stats.kurtosis(w)) if w.size > 3 else float("nan"),
        ))
    return rows


def kl_divergence(reference: np.ndarray, quantized: np.ndarray, bins: int = KL_BINS) -> float:
    """KL(P || Q) of two weight histograms over ``reference``'s range (``bins`` bins,
    ``KL_EPS`` added to every bin so that empty bins stay finite)."""
    lo, hi = float(reference.min()), float(reference.max())
    if hi <= lo:
        return 0.0
    p, _ = np.histogram(reference, bins=bins, range=(lo, hi))
    q, _ = np.histogram(np.clip(quantized, lo, hi), bins=bins, range=(lo, hi))
    p = p / p.sum() + KL_EPS
    q = q / q.sum() + KL_EPS
    return float(np.sum(p * np.log(p / q)))


def sqnr_db(reference: np.ndarray, quantized: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio in dB (inf when the rounding is exact)."""
    noise = float(np.sum((reference.astype(np.float64) - quantized) ** 2))
    signal = float(np.sum(reference.astype(np.float64) ** 2))
    return float("inf") if noise == 0 else 10.0 * float(np.log10(signal / noise))


def kl_bins(bits: Sequence[int]) -> int:
    """Bins of the KL histograms for a sweep over ``bits``: max(KL_BINS, 2^max(bits))."""
    return max(KL_BINS, int(2 ** max(bits, default=0)))


def kl_by_bits(network: nn.Module, bits: Sequence[int], scheme: str = "quarl",
               granularity: str = "auto") -> list[RoundingError]:
    """One row per layer and bit width: the signal-to-quantization-noise ratio (dB, no
    binning: ``10 log10(sum w^2 / sum (w - w_q)^2)``, ~6 dB per bit for a uniform grid),
    the mean squared and mean absolute rounding error, and the KL divergence of the n-bit
    weights' histogram from fp32's on one grid of :func:`kl_bins` bins for every width (at
    least 2^n for the widest n, so no n-bit grid is coarser than the histogram)."""
    rows: list[RoundingError] = []
    grid = kl_bins(bits)
    for name, layer in linear_layers(network):
        w = layer.weight.detach().float()
        for n in bits:
            wq = quantize_dequantize(w, n, scheme, resolve_granularity(granularity, w.dim()))
            ref, q = w.numpy().ravel(), wq.numpy().ravel()
            rows.append(RoundingError(name, n, sqnr_db(ref, q), float(np.mean((ref - q) ** 2)),
                                      float(np.abs(ref - q).mean()), kl_divergence(ref, q, grid)))
    return rows


def per_layer_table(rows: Sequence[RoundingError]) -> list[Row]:
    """:func:`kl_by_bits` rows as one row per layer: ``sqnr@N`` (dB) and ``kl@N`` columns."""
    return [
        {"layer": layer, **{f"sqnr@{r.bits}": round(r.sqnr_db, 1) for r in rows if r.layer == layer},
         **{f"kl@{r.bits}": round(r.kl, 4) for r in rows if r.layer == layer}}
        for layer in dict.fromkeys(r.layer for r in rows)
    ]


def plot_histograms(network: nn.Module, path: Path, title: str, bins: int = 80) -> Path:
    """One histogram per weight layer, with its range and std in the panel title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = linear_layers(network)
    cols = min(3, len(layers))
    rows = int(np.ceil(len(layers) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    # a grid of rows x cols panels holds at least one per layer; the spare ones are turned off below
    for ax, (name, layer) in zip(axes.ravel(), layers, strict=False):
        w = layer.weight.detach().float().numpy().ravel()
        ax.hist(w, bins=bins, color="tab:blue")
        ax.set_yscale("log")  # the tails are what a quantization range has to cover
        ax.set_xlabel("weight", fontsize=8)
        ax.set_ylabel("count (log)", fontsize=8)
        ax.set_title(f"layer {name}: range {w.max() - w.min():.2f}, std {w.std():.3f}", fontsize=9)
    for ax in axes.ravel()[len(layers) :]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    try:
        write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110))
    finally:
        plt.close(fig)
    return path


def plot_kl(rows: Sequence[RoundingError], path: Path, title: str) -> Path:
    """KL divergence against bits, one line per layer (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for layer in dict.fromkeys(r.layer for r in rows):
        pts = sorted((r.bits, r.kl) for r in rows if r.layer == layer)
        ax.plot([b for b, _ in pts], [max(k, 1e-12) for _, k in pts], marker="o", label=layer)
    ax.set_yscale("log")
    ax.set_xlabel("bits")
    ax.set_ylabel("KL(fp32 || n-bit)")
    ax.invert_xaxis()
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110))
    finally:
        plt.close(fig)
    return path
