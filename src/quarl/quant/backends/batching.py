"""Batches whose every row gets the bits it would get alone.

A deployed policy acts on one observation at a time, and quarl's numbers are those of
batch 1: fp32 equals Stable-Baselines3's ``predict`` bit for bit, and a chaotic episode
(MuJoCo) turns a last-bit difference into another return. Running a batch through the
same layers is faster but rounds differently: a GEMM over many rows sums each dot product
in another order than the batch-1 product (a GEMV), and a dynamic int8 model takes its
activation range over the whole batch.

Two ways keep the batch-1 bits at batch speed, both checked rather than assumed:

- **Verified batch forms** (:class:`RowVerdicts`): a layer (or a whole engine) has a batched
  form that may or may not compute what its batch-1 form computes on each row; PyTorch's
  ``baddbmm`` with the weight broadcast over the batch calls the batch-1 product once per
  row for most layer shapes, and a naive loop for the smallest. The first batch of each
  size runs both forms on the live rows and on random probes of the same shape, and the
  batched form is used for that size from then on only if every output is equal. The
  kernel a size gets depends on shapes, not values, so a verdict holds for the size.
- **Certified argmax** (:class:`CertifiedArgmax`): for a greedy discrete policy only the
  index of the largest output matters. Any float32 evaluation of a dot product of ``n``
  terms is within ``gamma_n * sum |a_k b_k|`` of the exact value (``gamma_n = n u / (1 - n
  u)``, ``u = 2**-24``; Higham, *Accuracy and Stability of Numerical Algorithms*, 3.1),
  whatever the summation order or FMA use. So a batched last layer gives the batch-1 argmax
  whenever its top output leads every other by more than both outputs' error bounds; a row
  where it does not is computed alone.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import numpy as np
import torch

PROBES = 3
"""Random batches checked beside the live one before a batched form is trusted for a size."""
UNIT_ROUNDOFF = 2.0**-24
TINY = 2.0**-126  # the smallest normal float32: bounds an underflowed product's error


class RowVerdicts:
    """Whether a batched form equals its batch-1 form row by row, per (form, batch size)."""

    def __init__(self, seed: int = 0) -> None:
        self._exact: dict[tuple[Hashable, int], bool] = {}
        self._rng = np.random.default_rng(seed)

    def run(self, key: Hashable, x: torch.Tensor, batched: Callable[[torch.Tensor], torch.Tensor],
            alone: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``alone`` applied to every row of ``x`` (stacked), through ``batched`` when that
        is known (or now found) to give the same bits for this batch size."""
        n = x.shape[0]
        if n == 1:
            return alone(x)
        exact = self._exact.get((key, n))
        if exact:
            return batched(x)
        rows = per_row(alone, x)
        if exact is None:
            self._exact[(key, n)] = all(torch.equal(batched(probe), per_row(alone, probe))
                                        for probe in [x, *self._probes(x)])
        return rows

    def verdict(self, key: Hashable, n: int) -> bool | None:
        """Whether the batched form of ``key`` is exact at ``n`` rows (``None``: not yet checked)."""
        return self._exact.get((key, n))

    def known(self) -> dict[tuple[Hashable, int], bool]:
        """The verdicts so far (for tests and benchmarks)."""
        return dict(self._exact)

    def _probes(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Random batches shaped like ``x``, near its values (the live rows may repeat, as
        Atari's first frames do, which would hide rows that influence each other)."""
        if not x.is_floating_point():
            return []
        live = x.detach().float().numpy()
        spread = live.std(axis=0, keepdims=True) + 1e-3
        return [torch.from_numpy((live + self._rng.standard_normal(live.shape) * spread).astype(np.float32)).to(x.dtype)
                for _ in range(PROBES)]


def per_row(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``fn`` on each row of ``x`` alone (a batch of one), the outputs stacked."""
    return torch.cat([fn(row) for row in x.split(1)])


class CertifiedArgmax:
    """The argmax of a Linear layer's output for every float32 row of a batch, equal to the
    argmax of that row's batch-1 output, from one batched product: a row whose top output
    does not lead the runner-up by more than the rounding bound goes through ``alone`` (the
    batch-1 layer); :attr:`rows_alone` counts them.

    The bound is per row: every output's ``sum_k |h_k w_jk| + |b_j|`` is at most
    ``sum_k |h_k| max_j |w_jk| + max_j |b_j|``, one small product with constants kept per
    weight version (a per-output bound costs more numpy calls than the rows it saves)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 alone: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.weight, self.bias, self.alone = weight, bias, alone  # in-place updates are seen
        self.rows_alone = 0
        self._version: tuple[int, int] | None = None
        self._scale = np.zeros(0)
        self._offset = 0.0
        self._weight_t = np.zeros((0, 0), np.float32)
        self._bias: np.ndarray | None = None

    def _constants(self) -> None:
        weight, bias = self.weight, self.bias
        version = (weight._version, -1 if bias is None else bias._version)
        if version == self._version:
            return
        w = weight.detach().numpy()
        self._weight_t = np.ascontiguousarray(w.T)
        self._bias = None if bias is None else bias.detach().numpy().copy()
        n_terms = w.shape[1] + (bias is not None)
        # both the batched and the batch-1 result of an output lie within gamma * magnitude
        # of the exact one, so two outputs' results may cross by twice that for each
        gamma = n_terms * UNIT_ROUNDOFF / (1.0 - n_terms * UNIT_ROUNDOFF) * (1.0 + 1e-6)
        self._scale = 4.0 * gamma * np.abs(w).max(axis=0).astype(np.float64)
        b_max = 0.0 if bias is None else float(np.abs(bias.detach().numpy()).max())
        self._offset = 4.0 * (gamma * b_max + n_terms * TINY)
        self._version = version

    def __call__(self, h: torch.Tensor) -> np.ndarray:
        if h.shape[0] == 1:
            return np.asarray(self.alone(h).float().numpy().argmax(axis=1))
        self._constants()
        # numpy's float32 product (any order, FMA or not) is within the bound as the
        # batch-1 one is, and costs a third of a torch call on a small batch
        hn = h.numpy()
        out = hn @ self._weight_t
        if self._bias is not None:
            out += self._bias
        top = np.asarray(out.argmax(axis=1))
        if out.shape[1] == 1:
            return top
        if out.shape[1] == 2:
            lead = np.abs(out[:, 0] - out[:, 1])
        else:
            best = np.sort(out, axis=1)
            lead = best[:, -1] - best[:, -2]
        sure = lead > np.abs(hn) @ self._scale + self._offset  # NaN / inf leads fail
        if sure.all():
            return top
        unsure = np.flatnonzero(~sure)
        for i in unsure:
            top[i] = self.alone(h[i : i + 1]).float().numpy().argmax(axis=1)[0]  # numpy's argmax, as the head's
        self.rows_alone += len(unsure)
        return top
