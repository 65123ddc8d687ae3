"""An ActorQ run's snapshot, ``checkpoint.pt``: written atomically, never holding NaN or inf, and
read back (``--resume``) only after every part is checked: the same run's config, a
learner of the same shapes without NaN, counters a run can have, a replay that fits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from quarl.actorq.algorithms import Learner, LearnerState, Metrics
from quarl.actorq.config import ActorQConfig, ConfigValue
from quarl.actorq.replay import Limiter, ReplayState, Store
from quarl.actorq.run_state import MAX_COUNT, RunState, check_state
from quarl.core.atomic import write_atomic
from quarl.core.errors import QuarlError
from quarl.core.file_schema import parse_typed

RESUME_MAY_CHANGE = frozenset({"max_minutes", "max_env_steps", "target_reward", "eval_every_s", "eval_every_steps",
                               "eval_episodes", "checkpoint_every_s", "out", "local", "address", "learner_device",
                               "actors"})
"""Options a resumed run may set otherwise (its budget, its evaluation, where it runs); any
other difference from the checkpoint's config is refused: it would be another run."""


def non_finite_tensor(value: Any, name: str) -> str | None:
    """The first floating tensor (or float) in a nest of dicts and lists holding NaN or
    inf, named by its keys (``learner.q.0.weight``), or None."""
    if isinstance(value, torch.Tensor):
        return name if value.is_floating_point() and not bool(torch.isfinite(value).all()) else None
    if isinstance(value, float):
        return None if np.isfinite(value) else name
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        bad = non_finite_tensor(item, f"{name}.{key}")
        if bad:
            return bad
    return None


def non_finite_metric(metrics: Metrics) -> str | None:
    """The first loss a learner step reported that is NaN or inf, or None."""
    for key, value in metrics.items():
        if "loss" in key and isinstance(value, (int, float, np.floating)) and not np.isfinite(value):
            return f"the learner's {key} ({float(value)!r})"
    return None


def save_checkpoint(path: Path, learner: Learner, replay: Store, limiter: Limiter, state: RunState,
                    config: ActorQConfig) -> None:
    """The run as it stands, written atomically; never a learner holding NaN or inf (the
    previous checkpoint stays: :class:`NonFiniteTraining`)."""
    from quarl.training.guard import NonFiniteTraining

    bad = non_finite_tensor(learner.state_dict(), "learner")
    if bad:
        raise NonFiniteTraining(state.env_steps, f"{bad} (learner step {state.learner_steps:,})")
    blob = {"learner": learner.state_dict(), "state": _plain(state.__dict__),
            "limiter": (int(limiter.inserts), int(limiter.samples)),
            "replay": replay.state() if config.checkpoint_replay else None, "config": config.to_json()}
    write_atomic(path, lambda tmp: torch.save(blob, tmp))  # a kill or a full disk leaves the previous checkpoint


def _plain(value: Any) -> Any:
    """Containers of Python numbers (numpy scalars made plain), as weights_only loading wants."""
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def _differs(saved: ConfigValue, now: ConfigValue) -> bool:
    """A saved config value is not the run's (a list read back equals the tuple it was)."""
    if saved == now:
        return False
    if isinstance(saved, list) and (isinstance(now, tuple) or not now):
        return tuple(saved) != (now or ())
    return True


def _check_resumed_config(path: Path, saved: Any, config: ActorQConfig) -> None:
    if not isinstance(saved, dict):
        raise QuarlError(f"{path} holds no run config: it was not written by quarl actorq; start afresh (no --resume)")
    from quarl.actorq.config import current_json

    saved = current_json(saved)  # an older checkpoint held every algorithm's options
    now = config.to_json()
    differ = sorted(k for k in now if k not in RESUME_MAY_CHANGE and k in saved and _differs(saved[k], now[k]))
    if differ:
        k = differ[0]
        raise QuarlError(f"{path} was written by a run with {k}={saved[k]!r}, this one has {now[k]!r}"
                         + (f" (and {len(differ) - 1} other option(s): {', '.join(differ[1:4])})" if differ[1:] else "")
                         + ": resume with the same options, or give another --out")


def _non_finite_row(path: Path, saved: ReplayState) -> None:
    """One line naming the first replay array (and row) holding NaN or inf."""
    for name, tensor in [*(saved.get("data") or {}).items(), ("tree", saved.get("tree"))]:
        rows = tensor if tensor is None or name == "tree" or not tensor.dim() else tensor[:saved["size"]]
        if rows is not None and rows.is_floating_point() and not bool(torch.isfinite(rows).all()):
            bad = ~torch.isfinite(rows.reshape(len(rows), -1) if rows.dim() else rows.reshape(1, 1))
            row = int(torch.nonzero(bad.any(1))[0][0])
            raise QuarlError(f"{path}: replay: {name} holds NaN or inf (row {row}): refused, nothing learnt from "
                             "it (start afresh without --resume)")


def _restore_replay(path: Path, stored: ReplayState, counts: object, replay: Store, limiter: Limiter) -> None:
    """The saved replay and rate limiter (``counts``), checked before either is touched: a
    size within the replay's capacity and the arrays it holds, the limiter's two counts."""
    saved = parse_typed(ReplayState, stored, f"{path}: replay")
    capacity = getattr(replay, "capacity", None)
    data, size, cursor = saved.get("data"), saved["size"], saved.get("cursor", 0)
    lengths = {int(t.shape[0]) if t.dim() else 0 for t in (data or {}).values()}
    if data is not None and (len(lengths) != 1 or (capacity is not None and lengths != {capacity})
                             or size > min(lengths) or cursor >= min(lengths)):
        raise QuarlError(f"{path}: replay: field size: {size} transitions (cursor {cursor}) in arrays of "
                         f"{sorted(lengths)} rows, this run's replay holds {capacity}: refused")
    if not (isinstance(counts, (tuple, list)) and len(counts) == 2
            and all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= MAX_COUNT for c in counts)):
        raise QuarlError(f"{path}: field limiter: {counts!r:.60} is not two counts (inserts, samples): refused")
    _non_finite_row(path, saved)
    try:
        replay.load_state(stored)
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
        raise QuarlError(f"{path}: replay: does not fit this run's replay ({exc.__class__.__name__}): refused") \
            from None
    limiter.inserts, limiter.samples = counts


def checkpoint_cap(learner: Learner, replay: Store) -> int:
    """Bytes this run's checkpoint may hold: its learner's tensors three times over (the
    networks, and Adam's two moments per parameter once it has stepped), its replay full
    (every row's fields at 8 bytes a value and the priorities' sum tree), and room for the
    rest. torch.save stores records unpacked, so a real checkpoint is about this size."""
    from torch import nn

    from quarl.core.limits import ENTRY_FLOOR

    def tensor_bytes(value: object) -> int:
        if isinstance(value, torch.Tensor):
            return value.numel() * value.element_size()
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
        return sum(tensor_bytes(item) for item in items)

    linear = [m for m in learner.policy_network().modules() if isinstance(m, nn.Linear)]
    obs_dim, act_dim = (linear[0].in_features, linear[-1].out_features) if linear else (0, 0)
    row = 8 * (2 * obs_dim + act_dim + 4) + 32
    return 3 * tensor_bytes(learner.state_dict()) + int(getattr(replay, "capacity", 0)) * row + ENTRY_FLOOR


def _load_blob(path: Path, cap: int) -> dict[str, Any]:
    """The checkpoint's dict of plain tensors and numbers, refused unread past ``cap`` bytes
    (:func:`checkpoint_cap`)."""
    if not path.exists():
        raise QuarlError(f"nothing to resume: {path} does not exist")
    from quarl.core.limits import load_torch

    blob = load_torch(path, cap, "this run's ActorQ checkpoint",
                      unreadable=lambda error: (f"{path} is not an ActorQ checkpoint of plain tensors ({error}): "
                                                "refused"))
    if not isinstance(blob, dict):
        raise QuarlError(f"{path} is not an ActorQ checkpoint: start afresh (no --resume)")
    return blob


def _restore_learner(path: Path, saved: LearnerState | None, learner: Learner) -> None:
    if saved is None:
        raise QuarlError(f"{path} holds no learner: it was not written by quarl actorq; start afresh (no --resume)")
    bad = non_finite_tensor(saved, "learner")
    if bad:  # a diverged learner is not a run to continue
        raise QuarlError(f"{path}: {bad} holds NaN or inf: refused (a diverged learner's checkpoint; start afresh "
                         "without --resume)")
    try:
        learner.load_state_dict(saved)
    except (RuntimeError, KeyError, TypeError, ValueError, AssertionError) as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
        why = next((line for line in lines if line.startswith(("size mismatch", "Missing key", "Unexpected key"))),
                   lines[0])
        raise QuarlError(f"{path} does not fit this run's learner (other --algo or --policy-layers?): "
                         f"{why[:300]}") from None


def restore(path: Path, learner: Learner, replay: Store, limiter: Limiter, config: ActorQConfig) -> RunState:
    """Load ``path`` into the learner, replay and limiter; returns the run's counters (its
    time to reward forgotten: a resumed run measures it anew)."""
    blob = _load_blob(path, checkpoint_cap(learner, replay))
    _check_resumed_config(path, blob.get("config"), config)
    _restore_learner(path, blob.get("learner"), learner)
    state = check_state(path, blob.get("state"))
    if blob.get("replay") is not None:
        _restore_replay(path, blob["replay"], blob.get("limiter"), replay, limiter)
    state.time_to_reward_s = state.env_steps_at_target = None
    return state
