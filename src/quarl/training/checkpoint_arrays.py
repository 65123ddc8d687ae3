"""A checkpoint's arrays beside its zip: the replay buffer (``.replay.npz``) and the
normalization statistics (``.vecnormalize.npz``), written with ``np.savez`` and read back
with nothing unpickled (``np.load(allow_pickle=False)``, every array's header priced before
any array is allocated), each array checked against this run's buffer or env."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray
from pydantic import Field

from quarl.core.atomic import write_atomic
from quarl.core.errors import QuarlError
from quarl.core.file_schema import Record, parse_record

if TYPE_CHECKING:
    from stable_baselines3.common.buffers import ReplayBuffer
    from stable_baselines3.common.vec_env import VecNormalize

# Checkpoints are read back without unpickling anything: the model's weights and optimizer
# state through SB3's set_parameters (read by quarl.core.limits.load_torch), the replay buffer and
# the normalization statistics as plain numpy arrays (np.load(allow_pickle=False)).
_REPLAY_FIELDS = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts")
_RMS = ("obs_rms", "ret_rms")
Arrays = dict[str, NDArray[Any]]
"""A checkpoint's arrays by name, as ``np.savez`` writes them."""


def save_arrays(path: Path, arrays: Arrays) -> None:
    # numpy's stub types savez's **kwds against its keyword allow_pickle: bool
    write_atomic(path, lambda tmp: np.savez(tmp, **arrays))  # type: ignore[arg-type]


ARRAYS_CAP = 1 << 30
"""Bytes a checkpoint's array file may have, and its arrays may inflate to all together."""


def load_arrays(path: Path) -> Arrays:
    """The arrays of a checkpoint's ``.npz``, read without unpickling; every array's header
    is read first, and the sizes it claims (and the zip's inflated sizes) must fit
    :data:`ARRAYS_CAP` all together before any array is allocated."""
    from numpy.lib import format as npy

    from quarl.core.limits import check_file_size, open_regular

    check_file_size(path, ARRAYS_CAP, "a checkpoint's arrays")
    try:
        with open_regular(path, "a checkpoint's arrays") as fh, zipfile.ZipFile(fh) as archive:
            claimed = 0
            for info in archive.infolist():
                with archive.open(info) as member:
                    version = npy.read_magic(member)
                    if version not in ((1, 0), (2, 0)):
                        raise QuarlError(f"{path}: array {info.filename!r} has .npy format {version}: refused (quarl "
                                         "writes 1.0)")
                    read_header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
                    shape, _, dtype = read_header(member)  # the header only: nothing allocated yet
                if dtype.hasobject:
                    raise QuarlError(f"{path}: array {info.filename!r} holds Python objects: refused")
                claimed += max(info.file_size, int(np.prod(shape, dtype=np.float64)) * dtype.itemsize)
                if claimed > ARRAYS_CAP:
                    raise QuarlError(f"{path}: array {info.filename!r} brings the arrays to {claimed:,} bytes, "
                                     f"more than the {ARRAYS_CAP:,} allowed: refused")
            fh.seek(0)
            with np.load(fh, allow_pickle=False) as data:
                return {k: data[k] for k in data.files}
    except QuarlError:
        raise
    except Exception as exc:  # zipfile, zlib and numpy raise many types for a foreign or truncated file
        raise QuarlError(f"{path} is not a quarl checkpoint array file ({exc.__class__.__name__}): refused") from None


class ReplayPosition(Record):
    """Where a saved replay buffer writes next, and whether it wrapped around."""

    pos: int = Field(ge=0)
    full: bool


def _scalar(arrays: Arrays, key: str) -> object:
    """A 0-d array's value as a Python scalar (missing, or an array of another shape, as is:
    the record refuses it by name)."""
    value = arrays.get(key)
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "biuf":
        return value.item()
    return value.tolist() if isinstance(value, np.ndarray) else value


def replay_arrays(buffer: ReplayBuffer) -> Arrays:
    arrays = {k: getattr(buffer, k) for k in _REPLAY_FIELDS if isinstance(getattr(buffer, k, None), np.ndarray)}
    return arrays | {"pos": np.array(buffer.pos), "full": np.array(buffer.full)}


def load_replay(buffer: ReplayBuffer, arrays: Arrays, source: str | Path = "the saved replay buffer") -> None:
    """Restore ``buffer`` from :func:`replay_arrays`' arrays: each of the buffer's shape and
    finite, the position a :class:`ReplayPosition` inside the buffer."""
    pos, full = _scalar(arrays, "pos"), _scalar(arrays, "full")
    if isinstance(pos, int) and not isinstance(pos, bool) and isinstance(full, bool) \
            and not 0 <= pos < buffer.buffer_size:
        raise QuarlError(f"{source}: field pos: the saved replay buffer's position {pos!r} (full {full!r}) is not "
                         f"one in a buffer of {buffer.buffer_size}: refused (a transition past it would never be "
                         "sampled)")
    position = parse_record(ReplayPosition, {"pos": pos, "full": full}, source)
    for key in _REPLAY_FIELDS:
        if key in arrays:
            if getattr(buffer, key).shape != arrays[key].shape:
                raise QuarlError(f"{source}: field {key}: the saved replay buffer's {key} has shape "
                                 f"{arrays[key].shape}, this run's {getattr(buffer, key).shape}: resume with the "
                                 "settings the run started with")
            if arrays[key].dtype.kind == "f" and not bool(np.isfinite(arrays[key]).all()):
                raise QuarlError(f"{source}: field {key}: holds NaN or inf: refused (it would train the weights "
                                 "to NaN)")
    for key in _REPLAY_FIELDS:
        if key in arrays:
            setattr(buffer, key, arrays[key].astype(getattr(buffer, key).dtype, copy=False))
    buffer.pos, buffer.full = position.pos, position.full


def vecnormalize_arrays(venv: VecNormalize, source: str | Path = "the saved normalization") -> Arrays:
    """``venv``'s running statistics as arrays (each checked by :func:`load_vecnormalize_arrays`);
    one line where a statistic is missing (a trusted pickle of another shape)."""
    out: Arrays = {}
    for name in _RMS:
        rms = getattr(venv, name, None)
        parts = {part: getattr(rms, part, None) for part in ("mean", "var", "count")}
        if any(value is None for value in parts.values()):
            raise QuarlError(f"{source}: its {name} is a {type(rms).__name__}, not running statistics (mean, var, "
                             "count): refused")
        out |= {f"{name}.{part}": np.asarray(value) for part, value in parts.items()}
    return out


def load_vecnormalize_arrays(venv: VecNormalize, arrays: Arrays, source: str | Path = "the saved normalization"
                             ) -> None:
    """Restore ``venv``'s running statistics: each of this env's shape, finite, variances
    >= 0 and a count > 0, or one line naming the file and the field."""
    for name in _RMS:
        rms = getattr(venv, name)
        for part in ("mean", "var", "count"):
            key = f"{name}.{part}"
            value = arrays.get(key)
            want = np.shape(getattr(rms, part))
            if not isinstance(value, np.ndarray) or value.shape != want or value.dtype.kind not in "fiu":
                got = ("missing" if value is None
                       else f"{getattr(value, 'dtype', type(value).__name__)} {np.shape(value)}")
                raise QuarlError(f"{source}: field {key}: {got}, this run's statistics are numbers of shape {want}: "
                                 "refused")
            if not bool(np.isfinite(value).all()) or (part != "mean" and bool((value < 0).any())) \
                    or (part == "count" and not float(value) > 0):
                expected = ("finite mean" if part == "mean" else "finite value > 0" if part == "count"
                            else "finite variance >= 0")
                raise QuarlError(f"{source}: field {key}: {value.reshape(-1)[:4].tolist()} is not a "
                                 f"{expected}: refused")
    for name in _RMS:
        rms = getattr(venv, name)
        rms.mean, rms.var = arrays[f"{name}.mean"].astype(np.float64), arrays[f"{name}.var"].astype(np.float64)
        rms.count = float(arrays[f"{name}.count"])
