"""The automatic int mode, chosen once and remembered.

An automatic ``int8`` / ``int4`` choice (:func:`quarl.quant.choice.choose`) is a property of
the policy's content, the calibration data (fixed seeds), the quantization options, this
CPU's int8 features and the ONNX Runtime version. It is stored under that key, so ``ptq``,
``study``, ``demo``, ``export``, ``bench``, ``play`` and :func:`quarl.quantize` run the same
kernel for the same policy on the same machine, even where two modes time within noise of
each other. A cache hit builds only the chosen mode (no candidates, no calibration
episodes) and records what the first choice measured.

The cache is a folder of small JSON files: ``$QUARL_CACHE`` (default
``~/.cache/quarl/int-modes``); ``QUARL_CACHE=off`` chooses afresh every time. A file that
cannot be read, or names a mode that no longer exists, is ignored and replaced.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from quarl.errors import QuarlError
from quarl.limits import read_capped

log = logging.getLogger(__name__)

CACHE_ENV = "QUARL_CACHE"
CHOICE_FORMAT = 2
"""Part of every key: bumped when the choice rule changes (2: the fastest agreeing mode)."""
MAX_ENTRY_BYTES = 1 << 20


def cache_dir() -> Path | None:
    raw = os.environ.get(CACHE_ENV, "")
    if raw.strip().lower() in ("off", "0", "none", "false"):
        return None
    return Path(raw).expanduser() if raw.strip() else Path.home() / ".cache" / "quarl" / "int-modes"


def _mode_set() -> list[str]:
    from quarl.quant.modes import MODES

    return sorted(MODES)


def choice_key(fingerprint: str, options: dict[str, Any], calibration: np.ndarray, returns: object) -> str | None:
    """The key of a choice, or None when it cannot be named: calibration episodes that do not
    say what they play (a caller's own function) make the choice uncacheable."""
    from quarl.provenance import provenance

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
        "calibration": [list(calibration.shape), str(calibration.dtype), hashlib.sha256(calibration.tobytes()).hexdigest()],
        "onnxruntime": info["versions"].get("onnxruntime"), "cpu_flags": info["cpu_flags"],
        "modes": _mode_set(),  # a mode added to the registry is tried, not hidden behind an older choice
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def load(key: str | None, known_modes: set[str], n_layers: int | None = None) -> dict[str, Any] | None:
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
        entry = json.loads(read_capped(path, MAX_ENTRY_BYTES, "an int mode cache entry", within=folder))
    except (OSError, ValueError, UnicodeDecodeError, QuarlError) as exc:
        if path.exists() or path.is_symlink():
            log.info("ignoring the int mode cache entry %s: %s", path, exc)
        return None
    ok = (isinstance(entry, dict) and entry.get("mode") in known_modes
          and isinstance(entry.get("keep"), list) and all(isinstance(i, int) and 0 <= i < 10_000 for i in entry["keep"])
          and len(set(entry["keep"])) == len(entry["keep"])
          and (n_layers is None or (all(i < n_layers for i in entry["keep"]) and len(entry["keep"]) < n_layers))
          and isinstance(entry.get("chosen"), dict) and isinstance(entry.get("tried"), list))
    if not ok:
        log.warning("ignoring the int mode cache entry %s: it does not fit this policy (mode, fp32 layers); choosing "
                    "afresh", path)
        return None
    return entry


def store(key: str | None, entry: dict[str, Any]) -> None:
    """Write the choice atomically (a rename), so concurrent commands never read half a file;
    a cache that cannot be written only costs the next command a new choice."""
    folder = cache_dir()
    if key is None or folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(entry, allow_nan=False))
        tmp.replace(folder / f"{key}.json")
    except (OSError, ValueError) as exc:
        log.info("could not store the int mode choice in %s: %s", folder, exc)
