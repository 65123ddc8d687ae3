"""The observation and action spaces of a Stable-Baselines3 zip, rebuilt from the readable
fields of its ``data`` JSON (never its cloudpickled blobs): Box, Discrete, MultiDiscrete
and MultiBinary, each bounded before any array of its size exists."""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym
import numpy as np
from pydantic import JsonValue

from quarl.core.errors import QuarlError
from quarl.core.literals import parse_literal


def _field(entry: dict[str, JsonValue], *names: str) -> JsonValue:
    for name in names:
        if entry.get(name) is not None:
            return entry[name]
    return None


def _parse_array(text: object, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    body = str(text).replace("[", " ").replace("]", " ").replace("\n", " ").split()
    if "..." in body or not body:
        if np.issubdtype(dtype, np.integer):  # images: the full uint8 range
            return np.full(shape, np.nan)
        raise QuarlError("space bounds are truncated in the checkpoint")
    if len(body) > int(np.prod(shape)):
        raise QuarlError(f"space bounds hold {len(body)} values for shape {shape}")
    try:
        values = np.array([float(v) for v in body], dtype=np.float64)
    except ValueError:
        raise QuarlError("space bounds are not numbers") from None
    if values.size == 1:
        return np.full(shape, values[0])
    return values.reshape(shape) if values.size == int(np.prod(shape)) else values


MAX_SPACE_VALUES = 10**7
"""An observation or action space of more values than this (ten times an 84x84x4 Atari
stack... times a hundred) is not a policy's: refused before any array of its size exists."""
MAX_DISCRETE = 10**6
"""Actions of a Discrete space at most (the network's output width is checked against it too)."""


def _space_shape(raw: Any, what: str) -> tuple[int, ...]:
    shape = parse_literal(str(raw))
    if not isinstance(shape, (tuple, list)) or not 1 <= len(shape) <= 4 or not all(
            isinstance(d, int) and not isinstance(d, bool) and 1 <= d for d in shape):
        raise QuarlError(f"the checkpoint's {what} has shape {raw!r}: expected 1 to 4 positive whole sizes")
    size = int(np.prod([int(d) for d in shape], dtype=object))
    if size > MAX_SPACE_VALUES:
        raise QuarlError(f"the checkpoint's {what} has shape {tuple(shape)} ({size:,} values), more than the "
                         f"{MAX_SPACE_VALUES:,} allowed: refused")
    return tuple(int(d) for d in shape)


def _int_vector(raw: Any) -> list[int] | None:
    """Whole numbers of a numpy array's text (``"[  3  10 200]"``, wrapped or not) or a JSON
    list; None when it holds anything else. Bounded by the data entry's size cap."""
    if isinstance(raw, list):
        items: list[Any] = raw
    elif isinstance(raw, str):
        items = raw.strip().removeprefix("[").removesuffix("]").replace(",", " ").split()
        if not all(re.fullmatch(r"-?[0-9]{1,12}", item) for item in items):
            return None
    else:
        return None
    if not items or not all(isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)) for v in items):
        return None
    return [int(v) for v in items]


def space_from_json(entry: object, what: str) -> gym.spaces.Space[Any]:
    if not isinstance(entry, dict) or not isinstance(entry.get(":type:"), str):
        raise QuarlError(f"the checkpoint's {what} is missing or unreadable")
    kind = entry[":type:"].rsplit(".", 1)[-1].rstrip("'>")
    if kind == "Discrete":
        try:
            n, start = int(entry["n"]), int(entry.get("start", 0))
        except (KeyError, TypeError, ValueError):
            raise QuarlError(f"the checkpoint's {what} is a Discrete space without a whole n") from None
        if not 1 <= n <= MAX_DISCRETE:
            raise QuarlError(f"the checkpoint's {what} has n={n} actions: allowed 1..{MAX_DISCRETE:,}")
        return gym.spaces.Discrete(n, start=start)
    if kind == "MultiDiscrete":
        nvec = _int_vector(_field(entry, "nvec", "nvec"))
        if nvec is None or not 1 <= len(nvec) <= 1024 or not all(1 <= v <= MAX_DISCRETE for v in nvec):
            raise QuarlError(f"the checkpoint's {what} is a MultiDiscrete space with nvec "
                             f"{str(entry.get('nvec'))[:80]!r}: expected 1 to 1024 whole sizes in 1..{MAX_DISCRETE:,}")
        starts = _int_vector(entry["start"]) if entry.get("start") not in (None, "None") else [0]
        if starts is None or any(starts):
            raise QuarlError(f"the checkpoint's {what} is a MultiDiscrete space with start "
                             f"{str(entry.get('start'))[:80]!r}: only 0 (the default) is supported")
        return gym.spaces.MultiDiscrete(nvec)
    if kind == "MultiBinary":
        n = parse_literal(str(entry.get("n")))
        if not (isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 1024):
            raise QuarlError(f"the checkpoint's {what} is a MultiBinary space of n={entry.get('n')!r}: allowed 1..1024 "
                             "bits (one dimension)")
        return gym.spaces.MultiBinary(n)
    if kind == "Box":
        try:
            dtype: np.dtype[Any] = np.dtype(entry.get("dtype", "float32"))
        except TypeError:
            raise QuarlError(f"the checkpoint's {what} has dtype {entry.get('dtype')!r}: not a numpy type") from None
        shape = _space_shape(_field(entry, "_shape", "shape"), what)
        low = _parse_array(_field(entry, "low_repr", "low"), shape, dtype)
        high = _parse_array(_field(entry, "high_repr", "high"), shape, dtype)
        if low.shape != shape or high.shape != shape:
            raise QuarlError(f"the checkpoint's {what} bounds have {low.size} and {high.size} values for shape {shape}")
        if np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            low = np.where(np.isnan(low), info.min, low)
            high = np.where(np.isnan(high), info.max, high)
        return gym.spaces.Box(low.astype(dtype), high.astype(dtype), shape=shape, dtype=dtype)
    raise QuarlError(f"{what} of type {kind} is not supported: allowed Box, Discrete, MultiDiscrete and MultiBinary")

