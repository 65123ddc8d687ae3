"""The automatic int mode, chosen once and remembered.

An automatic ``int8`` / ``int4`` choice (:func:`quarl.quantization.choice.choose`) is a property of
the policy's content, the calibration data (fixed seeds), the quantization options, this
CPU's int8 features and the ONNX Runtime version. It is stored under that key, so ``ptq``,
``study``, ``demo``, ``export``, ``bench``, ``play`` and :func:`quarl.quantize` run the same
kernel for the same policy on the same machine, even where two modes time within noise of
each other. A cache hit builds only the chosen mode (no candidates, no calibration
episodes) and records what the first choice measured.

The cache is a folder of small JSON files: ``$QUARL_CACHE`` (default
``~/.cache/quarl/int-modes``); ``QUARL_CACHE=off`` chooses afresh every time. A file that
cannot be read, is not a :class:`ChoiceEntry` (a field of the wrong type, JSON nested past
:data:`quarl.core.file_schema.MAX_JSON_DEPTH`) or names a mode that no longer exists, is ignored
with a warning and replaced: a cache is never a reason to fail.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict  # pydantic validates it on Python 3.11

from quarl.core.atomic import write_atomic
from quarl.core.errors import QuarlError
from quarl.core.file_schema import check_depth, parse_typed
from quarl.core.limits import read_capped
from quarl.quant.summary import CandidateSummary, Label, is_complete

log = logging.getLogger(__name__)

CACHE_ENV = "QUARL_CACHE"
CHOICE_FORMAT = 3
"""Part of every key: bumped when the choice rule or the stored record changes."""
MAX_ENTRY_BYTES = 1 << 20
_Layer = Annotated[int, Field(ge=0, lt=10_000)]


@with_config(ConfigDict(strict=True, allow_inf_nan=False, extra="forbid"))
class ChoiceEntry(TypedDict):
    """A stored choice, as :func:`store` writes it and :func:`load` checks it: the mode, the
    weight layers it keeps in fp32, what it measured and what else was tried."""

    mode: Label
    keep: Annotated[list[_Layer], Field(max_length=10_000)]
    chosen: CandidateSummary
    tried: Annotated[list[CandidateSummary], Field(max_length=10_000)]


def cache_dir() -> Path | None:
    raw = os.environ.get(CACHE_ENV, "")
    if raw.strip().lower() in ("off", "0", "none", "false"):
        return None
    return Path(raw).expanduser() if raw.strip() else Path.home() / ".cache" / "quarl" / "int-modes"


def _mode_set() -> list[str]:
    from quarl.quant.modes import MODES

    return sorted(MODES)


def choice_key(fingerprint: str, options: Mapping[str, int | float | str | bool], calibration: np.ndarray,
               returns: object) -> str | None:
    """The key of a choice, or None when it cannot be named: calibration episodes that do not
    say what they play (a caller's own function) make the choice uncacheable."""
    from quarl.core.provenance import provenance

    returns_key = None
    if returns is not None:
        describe = getattr(returns, "cache_key", None)
        if describe is None:
            return None
        returns_key = describe()
    info = provenance()
    calibration = np.ascontiguousarray(calibration)
    parts = {
        "format": CHOICE_FORMAT, "policy": fingerprint, "options": options, "returns": returns_key,
        "calibration": [list(calibration.shape), str(calibration.dtype),
                        hashlib.sha256(calibration.tobytes()).hexdigest()],
        "onnxruntime": info["versions"].get("onnxruntime"), "cpu_flags": info["cpu_flags"],
        "modes": _mode_set(),  # a mode added to the registry is tried, not hidden behind an older choice
        **({"cpu_kind": info["cpu_kind"]} if "cpu_kind" in info else {}),  # QUARL_CPU_KIND: native keys as before
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def load(key: str | None, known_modes: set[str], n_layers: int | None = None) -> ChoiceEntry | None:
    """The stored choice for ``key``, checked: ``{"mode", "keep", "chosen", "tried"}``, a
    mode of ``known_modes`` keeping some of the ``n_layers`` weight layers in fp32, never all
    of them (an entry that would run the int row in fp32 is ignored with a note)."""
    folder = cache_dir()
    if key is None or folder is None:
        return None
    path = folder / f"{key}.json"
    try:
        if not path.exists():
            return None
        raw = json.loads(read_capped(path, MAX_ENTRY_BYTES, "an int mode cache entry", within=folder))
        check_depth(raw, path)
        record = parse_typed(ChoiceEntry, raw, path)
    except (OSError, ValueError, UnicodeDecodeError, RecursionError, QuarlError) as exc:
        if path.exists() or path.is_symlink():
            why = ("JSON nested too deeply" if isinstance(exc, RecursionError)
                   else (str(exc).splitlines() or [type(exc).__name__])[0].removeprefix(f"{path}: ")[:300])
            log.warning("ignoring the int mode cache entry %s (%s): choosing afresh", path, why)
        return None
    keep = list(record["keep"])
    ok = (record["mode"] in known_modes and len(set(keep)) == len(keep)
          and all(is_complete(c) for c in (record["chosen"], *record["tried"]))
          and (n_layers is None or (all(i < n_layers for i in keep) and len(keep) < n_layers)))
    if not ok:
        log.warning("ignoring the int mode cache entry %s: it does not fit this policy (mode, fp32 layers); choosing "
                    "afresh", path)
        return None
    return record


def store(key: str | None, entry: ChoiceEntry) -> None:
    """Write the choice atomically (a rename), so concurrent commands never read half a file;
    a cache that cannot be written only costs the next command a new choice."""
    folder = cache_dir()
    if key is None or folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / f"{key}.json", json.dumps(entry, allow_nan=False))
    except (OSError, ValueError, QuarlError) as exc:
        log.info("could not store the int mode choice in %s: %s", folder, exc)
