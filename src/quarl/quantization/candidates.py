"""A built int mode checked against the policy it quantizes: :class:`Candidate` (what the
automatic choice compares, its record :class:`~quarl.quant.summary.CandidateSummary`) and the
measures it is judged by on calibration states (greedy agreement, sampled agreement, KL).

The kernels themselves, their references and student grids, are :mod:`quarl.quant.modes`,
which never names a Policy; this module runs a mode on one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from quarl.policies.base import Policy
from quarl.quant.backends import onnxruntime as ortb
from quarl.quant.modes import BuildRequest, IntMode
from quarl.quant.summary import CandidateSummary


@dataclass
class Candidate:
    """One mode built and checked on the calibration states."""

    mode: str
    keep: tuple[int, ...]
    agreement: float
    latency_us: float = float("nan")
    model_bytes: int = 0
    calibration_return: float = float("nan")
    """Mean return on calibration episodes (closed-loop check only)."""
    calibration_episodes: int = 0
    """Calibration episodes the sequential test played (0: not judged in closed loop)."""
    calibration_verdict: str = ""
    """What the sequential test found against fp32 (keeps, loses, undecided...)."""
    calibration_kept: bool | None = None
    kl: float = float("nan")
    """Mean KL divergence per state from fp32's action distribution to this mode's, on the
    check states (categorical heads; NaN elsewhere): how far a sampling policy moves."""
    sampled_agreement: float = float("nan")
    """How often a sampled action stays the same (categorical heads; NaN elsewhere): fp32 and
    this mode drawing with shared Gumbel noise, as quarl's paired evaluation draws, on the
    check states (:func:`sampled_agreement`). The automatic choice judges a sampling policy by it."""
    fp32_ort_latency_us: float = float("nan")
    """ONNX Runtime fp32's batch-1 latency, timed beside the chosen mode (automatic choice only)."""
    engine: ortb.OrtEngine | None = field(default=None, repr=False)
    reference: nn.Module | None = field(default=None, repr=False)

    def fidelity(self, sampled: bool) -> float:
        """What the automatic choice compares with its agreement bar: the sampled agreement
        for a policy that samples from a categorical head, the greedy actions' otherwise."""
        return self.sampled_agreement if sampled and self.sampled_agreement == self.sampled_agreement \
            else self.agreement

    def summary(self) -> CandidateSummary:
        def num(x: float, digits: int) -> float | None:  # JSON has no NaN: unmeasured is null
            return None if x != x else round(x, digits)

        return {"mode": self.mode, "fp32_layers": list(self.keep), "agreement": num(self.agreement, 4),
                "kl": num(self.kl, 6), "sampled_agreement": num(self.sampled_agreement, 4),
                "latency_us": num(self.latency_us, 1), "fp32_ort_latency_us": num(self.fp32_ort_latency_us, 1),
                "model_bytes": self.model_bytes,
                "calibration_return": num(self.calibration_return, 3),
                "calibration_episodes": self.calibration_episodes, "calibration_verdict": self.calibration_verdict}


def action_agreement(policy: Policy, reference: np.ndarray, actions: np.ndarray, tolerance: float) -> float:
    """Share of states where ``actions`` agree with ``reference`` (fp32): the same greedy
    action, or every action dimension within ``tolerance`` of its range (``high - low``;
    2 where unbounded, the width of a tanh output)."""
    if policy.head in ("argmax", "quantile_argmax"):
        return float(np.mean(np.asarray(actions) == np.asarray(reference)))
    if policy.head in ("multi_argmax", "bernoulli"):  # every sub-action (bit) the same
        same = np.asarray(actions) == np.asarray(reference)
        return float(np.mean(same.reshape(len(same), -1).all(axis=1)))
    space = cast(gym.spaces.Box, policy.action_space)  # a continuous head acts in a Box
    width = np.asarray(space.high, dtype=np.float64) - np.asarray(space.low, dtype=np.float64)
    width = np.where(np.isfinite(width) & (width > 0), width, 2.0)
    deviation = np.abs(np.asarray(actions, np.float64) - reference) / width
    return float(np.mean(deviation.reshape(len(deviation), -1).max(axis=1) <= tolerance))


def fp32_actions(policy: Policy, calibration: np.ndarray) -> np.ndarray:
    """The fp32 policy's actions on preprocessed observations (the reference of agreement)."""
    with torch.inference_mode():
        return policy.postprocess(policy.network(torch.from_numpy(calibration)).float().numpy())


def split_calibration(mode: IntMode, calibration: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(states the mode is built from, states its agreement is checked on): a mode that
    fits ranges on observations is checked on the other half, never on what it was fit to."""
    if calibration is None or not mode.needs_calibration:
        return calibration, calibration
    return calibration[0::2], calibration[1::2]


def build_candidate(policy: Policy, mode: IntMode, request: BuildRequest, check: np.ndarray | None = None,
                    tolerance: float = 0.02) -> Candidate:
    """Build ``mode`` and, given ``check`` states (preprocessed observations), measure how
    often its actions agree with fp32's on them."""
    request = mode.request_for(request)
    model = mode.build(request)
    engine = ortb.OrtEngine(model, per_row=mode.per_row)
    agreement = kl = sampled = float("nan")
    if check is not None:
        out = engine(check)
        actions = policy.postprocess(out)
        agreement = action_agreement(policy, fp32_actions(policy, check), actions, tolerance)
        kl = categorical_kl(policy, check, out)
        sampled = sampled_agreement(policy, check, out)
    simulated = mode.reference(request, model) if mode.reference is not None else None
    return Candidate(mode.label, tuple(sorted(request.keep)), agreement, model_bytes=len(model), kl=kl, engine=engine,
                     reference=simulated, sampled_agreement=sampled)


def categorical_kl(policy: Policy, states: np.ndarray, out: np.ndarray) -> float:
    """Mean per-state KL(fp32 || quantized) of a categorical head's action distributions
    (softmax of the logits) on ``states``; NaN for heads that are not categorical."""
    if not policy.categorical:
        return float("nan")
    with torch.inference_mode():
        p = torch.log_softmax(policy.network(torch.from_numpy(states)).double(), dim=1)
    q = torch.log_softmax(torch.from_numpy(np.asarray(out, np.float64)), dim=1)
    return float((p.exp() * (p - q)).sum(dim=1).mean())


SAMPLED_DRAWS = 64
"""Gumbel draws per state for :func:`sampled_agreement` (its standard error on 1,000 states is
below 0.3 %)."""


def sampled_agreement(policy: Policy, states: np.ndarray, out: np.ndarray) -> float:
    """How often fp32 and the quantized logits ``out`` sample the same action on ``states``
    when both draw with the same Gumbel noise (Gumbel-max, as quarl's paired evaluation
    samples, :func:`quarl.policies.base.sample_actions`), averaged over
    :data:`SAMPLED_DRAWS` draws per state from a fixed stream; NaN for heads that are not
    categorical. For two actions it is 1 - the total variation distance, exactly in expectation."""
    if not policy.categorical or len(states) == 0:
        return float("nan")
    with torch.inference_mode():
        p = policy.network(torch.from_numpy(states)).double().numpy()
    q = np.asarray(out, np.float64)
    gumbel = np.random.default_rng(0).gumbel(size=(SAMPLED_DRAWS, *p.shape))
    return float(np.mean((p + gumbel).argmax(-1) == (q + gumbel).argmax(-1)))
