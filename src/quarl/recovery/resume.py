"""A recovery state checked against the run it would continue before any of it is used:
the tensors typed, shaped, finite and sized against the policy and the options (a
zero-stride view claiming 10^9 rows is refused, never concatenated), the counts against
the rounds the options allow."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from quarl.core.errors import QuarlError
from quarl.evaluation.calibration import DISTILLATION_SEEDS
from quarl.policies.base import Policy
from quarl.recovery.config import RecoverConfig
from quarl.recovery.report import OptimizerState, RecoveryState


def _refuse(path: Path, field: str, problem: str) -> QuarlError:
    return QuarlError(f"{path}: {field}: {problem}: remove it to start afresh")


def _rows(path: Path, field: str, value: torch.Tensor, row_shape: tuple[int, ...], max_rows: int) -> None:
    """Float32 rows of ``row_shape``, at most ``max_rows``, that the tensor's storage holds."""
    if value.dtype != torch.float32:
        raise _refuse(path, field, f"{str(value.dtype).removeprefix('torch.')}, not float32")
    if tuple(value.shape[1:]) != row_shape or value.dim() != 1 + len(row_shape):
        raise _refuse(path, field, f"rows of shape {tuple(value.shape[1:])}, not the policy's {row_shape}")
    if value.shape[0] > max_rows:
        raise _refuse(path, field, f"{value.shape[0]:,} rows, more than the {max_rows:,} a run keeps")
    if not value.is_contiguous() or value.untyped_storage().nbytes() < value.numel() * value.element_size():
        raise _refuse(path, field, f"{value.shape[0]:,} rows that its storage does not hold (a view)")
    if not bool(torch.isfinite(value).all()):
        raise _refuse(path, field, "holds NaN or infinite values")


def _weights(path: Path, field: str, value: dict[str, torch.Tensor], like: dict[str, torch.Tensor]) -> None:
    """The student's tensors: the same names, shapes and dtypes, finite."""
    if set(value) != set(like):
        missing = sorted(set(like) - set(value))
        which = "missing " + missing[0] if missing else "other names"
        raise _refuse(path, field, f"not the student's tensors ({which})")
    for name, tensor in like.items():
        got = value[name]
        if got.shape != tensor.shape or got.dtype != tensor.dtype:
            raise _refuse(path, f"{field}.{name}",
                          f"{tuple(got.shape)}, not the student's {tuple(tensor.shape)} {tensor.dtype}")
        if got.is_floating_point() and not bool(torch.isfinite(got).all()):
            raise _refuse(path, f"{field}.{name}", "holds NaN or infinite values")


def _optimizer(path: Path, saved: OptimizerState, optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Adam's state as this run writes it: its groups' settings, one moment per parameter
    of that parameter's shape, finite."""
    fresh = optimizer.state_dict()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if len(saved["param_groups"]) != len(fresh["param_groups"]):
        raise _refuse(path, "optimizer", "not this run's Adam state")
    for got, want in zip(saved["param_groups"], fresh["param_groups"], strict=True):  # as many: checked above
        if set(got) != set(want) or any(got[k] != want[k] for k in want if k != "lr"):
            raise _refuse(path, "optimizer.param_groups", "settings other than this run's")
        rate = got["lr"]
        if not isinstance(rate, float) or not 0 <= rate <= lr:
            raise _refuse(path, "optimizer.param_groups.lr", f"{rate!r}, not in 0..{lr}")
    for index, moments in saved["state"].items():
        if not 0 <= index < len(params):
            raise _refuse(path, "optimizer.state", f"an entry {index!r} for no parameter")
        for name, value in moments.items():
            if not value.is_floating_point():
                raise _refuse(path, f"optimizer.state.{index}.{name}", f"a {value.dtype}, not a float tensor")
            if value.dim() and value.shape != params[index].shape:
                raise _refuse(path, f"optimizer.state.{index}.{name}",
                              f"{tuple(value.shape)}, not the parameter's {tuple(params[index].shape)}")
            if not bool(torch.isfinite(value).all()):
                raise _refuse(path, f"optimizer.state.{index}.{name}", "holds NaN or infinite values")


def check_resume(path: Path, saved: RecoveryState, policy: Policy, student: nn.Module,
                 optimizer: torch.optim.Optimizer, config: RecoverConfig, max_states: int) -> None:
    """Refuse, in one line naming the file and the field, a state whose claims do not fit
    the run it would continue (``saved`` passed :func:`quarl.recovery.dagger.read_state`)."""
    row = tuple(int(n) for n in policy.input_shape)
    _rows(path, "states", saved["states"], row, max_states)
    _rows(path, "heldout", saved["heldout"], row, max_states)
    like = student.state_dict()
    _weights(path, "student", saved["student"], like)
    _weights(path, "best_student", saved["best_student"], like)
    _optimizer(path, saved["optimizer"], optimizer, config.lr)
    history = saved["history"]
    if not 1 <= len(history) <= config.total_rounds:
        raise _refuse(path, "history", f"{len(history):,} rounds, not 1..{config.total_rounds} (the run's rounds)")
    if [h.round for h in history] != list(range(len(history))):
        raise _refuse(path, "history", "rounds not numbered 0, 1, ... in order")
    if not 0 <= saved["best_round"] < len(history):
        raise _refuse(path, "best_round", f"{saved['best_round']}, not one of the {len(history)} rounds played")
    if not 0 <= saved["best_agreement"] <= 1:
        raise _refuse(path, "best_agreement", f"{saved['best_agreement']!r}, not a share in 0..1")
    target = saved["target"]
    if not (target == -1 or (math.isfinite(target) and 0 < target <= 1)):
        raise _refuse(path, "target", f"{target!r}, not a share in (0, 1] (or -1: none yet)")
    seeds = saved["seeds"]
    if len(seeds) != len(history) * (config.episodes_per_round + 1) or \
            not all(isinstance(s, int) and s in DISTILLATION_SEEDS for s in seeds):
        raise _refuse(path, "seeds", f"not the {config.episodes_per_round + 1} distillation seeds ("
                                     f"{DISTILLATION_SEEDS.start}..{DISTILLATION_SEEDS.stop - 1}) of each round played")
    if saved["updates"] != len(history) * config.updates_per_round:
        raise _refuse(path, "updates", f"{saved['updates']:,}, not the {config.updates_per_round:,} of each round "
                                       "played")
