"""Reading checkpoint side files without executing code from them.

- RL Zoo YAML files carry a ``!!python/object/apply:collections.OrderedDict`` tag; a
  safe loader that turns that one tag into a dict reads them, nothing else is built.
- ``vecnormalize.pkl`` is a pickled VecNormalize object. :func:`load_vecnormalize`
  unpickles it with an allow-list: numpy arrays and scalars, and stand-in records for the
  SB3 / gym classes whose attributes we read. Any other global makes it refuse, unless
  the caller trusts the file (``--trust-pickle``).
- Policy keyword arguments such as ``net_arch=[dict(pi=[64], vf=[64])]`` come as Python
  literal text (config.yml, or the readable fields of an SB3 zip): read by
  :func:`quarl.core.literals.parse_literal`, never evaluated.
"""

from __future__ import annotations

import io
import math
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from quarl.core.errors import QuarlError
from quarl.core.limits import read_capped


class _ZooYamlLoader(yaml.SafeLoader):
    pass


def _ordered_dict(loader: yaml.Loader, node: yaml.Node) -> dict[Any, Any]:
    pairs = loader.construct_sequence(node, deep=True)
    items = pairs[0] if len(pairs) == 1 and isinstance(pairs[0], list) else pairs
    return {k: v for k, v in items}


_ZooYamlLoader.add_constructor("tag:yaml.org,2002:python/object/apply:collections.OrderedDict", _ordered_dict)


YAML_CAP = 2**20
"""Bytes an RL Zoo YAML file may have (the zoo writes a few kilobytes)."""
YAML_VALUES = 100_000
"""Values a YAML file may expand to, counting every alias as the copy it stands for."""


def load_zoo_yaml(path: Path) -> dict[str, Any]:
    """An RL Zoo ``config.yml`` / ``args.yml`` / ``env_kwargs.yml`` as a plain dict: at most
    :data:`YAML_CAP` bytes, expanding to at most :data:`YAML_VALUES` values (ten nested
    aliases of ten would make 10^9)."""
    text = read_capped(path, YAML_CAP, "an RL Zoo YAML file").decode("utf-8", errors="replace")
    try:
        data = yaml.load(text, Loader=_ZooYamlLoader)  # noqa: S506 - safe subclass
    except yaml.YAMLError as exc:
        raise QuarlError(f"cannot read {path}: not a YAML file the RL Zoo writes ({exc.__class__.__name__})") from None
    except RecursionError:
        raise QuarlError(f"cannot read {path}: nested too deeply for a YAML file the RL Zoo writes") from None
    data = data or {}
    if not isinstance(data, dict):
        raise QuarlError(f"cannot read {path}: a YAML {type(data).__name__}, not the mapping the RL Zoo writes")
    if _expanded_values(data, YAML_VALUES) > YAML_VALUES:
        raise QuarlError(f"cannot read {path}: it expands to more than {YAML_VALUES} values (aliases repeating "
                         "aliases?): refused")
    return data


def _expanded_values(data: Any, limit: int) -> int:
    """Values in ``data`` counted as a tree (a shared list counts once per reference),
    stopping past ``limit``."""
    count, stack = 0, [data]
    while stack and count <= limit:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set)):
            stack.extend(item)
    return count


class Record:
    """Stand-in for an allowed class: keeps the pickled attributes, runs no code."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and all(isinstance(s, (dict, type(None))) for s in state):
            state = {**(state[0] or {}), **(state[1] or {})}  # (dict state, slot state)
        if isinstance(state, dict):
            self.__dict__.update(state)


def _record_class(name: str) -> type:
    return type(name, (Record,), {})


def _multiarray() -> Any:
    import importlib

    try:  # numpy >= 2 moved numpy.core to numpy._core
        return importlib.import_module("numpy._core.multiarray")
    except ImportError:  # pragma: no cover - numpy 1
        return importlib.import_module("numpy.core.multiarray")


class Refused(pickle.UnpicklingError):
    """A pickle asked for something the allow-list admits only within bounds (an array
    larger than the file, an array of Python objects). ``--trust-pickle`` unpickles with
    plain :mod:`pickle` instead, with none of these checks: the user vouched for the file."""


PLAIN_DTYPES = frozenset(f"{kind}DType" for kind in (
    "Bool", "Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64", "Float16", "Float32", "Float64"))
"""numpy.dtypes classes a pickle may name (numbers; never ObjectDType)."""
MAX_DIMS = 32


class ArrayBudget:
    """Bytes the arrays of one pickle may claim, checked before numpy allocates them: no
    more than the file holds, because an array's values come from the file. A 200-byte
    pickle asking numpy for ``ndarray((10**9,))`` would otherwise take 8 GB, and an object
    array given a short list crashes numpy (a segfault)."""

    def __init__(self, nbytes: int) -> None:
        self.left = nbytes

    def claim(self, shape: Any, dtype: Any) -> tuple[tuple[int, ...], np.dtype]:
        try:
            dims = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
            kind = np.dtype(dtype)
        except (TypeError, ValueError, OverflowError):
            raise Refused(f"an array of shape {shape!r} and dtype {dtype!r}") from None
        if kind.hasobject:
            raise Refused("an array of Python objects")
        if len(dims) > MAX_DIMS or any(d < 0 for d in dims):
            raise Refused(f"an array of shape {dims}")
        nbytes = math.prod(dims) * kind.itemsize
        if nbytes > self.left:
            raise Refused(f"an array of shape {dims} ({nbytes} bytes), more than the file holds")
        self.left -= nbytes
        return dims, kind


def _checked_array(budget: ArrayBudget) -> type[np.ndarray]:
    """An ndarray subclass that claims its bytes from ``budget`` when built or given state."""

    class CheckedArray(np.ndarray):
        def __new__(cls, shape: Any, dtype: Any = float, *args: Any, **kwargs: Any) -> CheckedArray:
            if args or kwargs:
                raise Refused("an array over a buffer")
            dims, kind = budget.claim(shape, dtype)
            return np.ndarray.__new__(cls, dims, kind)

        def __setstate__(self, state: Any) -> None:
            if not (isinstance(state, tuple) and len(state) in (4, 5) and isinstance(state[-1], (bytes, bytearray))):
                raise Refused("an array state numpy does not write")
            budget.claim(state[-4], state[-3])
            super().__setstate__(state)

        def __reduce_ex__(self, protocol: Any) -> Any:
            return np.asarray(self).__reduce_ex__(protocol)  # pickled on as a plain array (a worker's copy)

    return CheckedArray


def numpy_globals(budget: ArrayBudget) -> dict[str, Callable[..., Any]]:
    """What rebuilds a pickled numpy array, dtype or scalar, within ``budget``."""
    array = _checked_array(budget)
    multiarray = _multiarray()

    def reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
        return array(shape, dtype)

    def scalar(dtype: Any, data: Any = None) -> Any:
        kind = np.dtype(dtype)
        if kind.hasobject or not isinstance(data, (bytes, bytearray)) or len(data) != kind.itemsize:
            raise Refused(f"a numpy scalar of dtype {kind} from {type(data).__name__}")
        return multiarray.scalar(kind, data)

    def dtype(*args: Any, **kwargs: Any) -> np.dtype[Any]:
        kind: np.dtype[Any] = np.dtype(*args, **kwargs)
        if kind.hasobject:
            raise Refused("a dtype of Python objects")
        return kind

    return {"_reconstruct": reconstruct, "scalar": scalar, "ndarray": array, "dtype": dtype}


_NUMPY_MODULES = ("numpy", "numpy.core.multiarray", "numpy._core.multiarray")
_RECORD_MODULES = (
    "stable_baselines3.common.vec_env",
    "stable_baselines3.common.running_mean_std",
    "gym.spaces",
    "gymnasium.spaces",
    "numpy.random",  # the spaces' random generators: kept as inert records
)


class AllowListUnpickler(pickle.Unpickler):
    """Numpy arrays, dtypes and scalars (within an :class:`ArrayBudget` of the file's size),
    dicts, and inert records for the SB3 / gym classes; any other global is refused."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self._numpy = numpy_globals(ArrayBudget(len(data)))

    def find_class(self, module: str, name: str) -> Any:
        if module in _NUMPY_MODULES and name in self._numpy:
            return self._numpy[name]
        if module == "numpy.dtypes" and name in PLAIN_DTYPES:
            return getattr(np.dtypes, name)
        if module == "collections" and name == "OrderedDict":
            return dict
        if module.startswith(_RECORD_MODULES):
            return _record_class(name)
        raise pickle.UnpicklingError(f"it references {module}.{name}")


VECNORMALIZE_CAP = 64 * 2**20
"""Bytes a vecnormalize.pkl may have: its statistics are two arrays of the observation's
shape (a stacked 4 x 84 x 84 frame: 0.45 MB)."""


@dataclass(frozen=True)
class VecNormalizeStats:
    """What a VecNormalize pickle says about observations (its return statistics are not
    needed to act)."""

    mean: np.ndarray
    var: np.ndarray
    clip_obs: float
    epsilon: float
    norm_obs: bool
    """Whether observations were normalized at all."""


def load_vecnormalize(path: Path, trust_pickle: bool = False,
                      obs_shape: tuple[int, ...] | None = None) -> VecNormalizeStats:
    """Observation statistics of a VecNormalize pickle; checked to be finite, the variances
    non-negative, and (given ``obs_shape``) of the observation's shape."""
    data = read_capped(path, VECNORMALIZE_CAP, "a VecNormalize pickle")
    if trust_pickle:
        try:
            obj = pickle.loads(data)  # noqa: S301 - the user vouched for this file
        except Exception as exc:  # truncated, or a class that is not installed
            raise QuarlError(f"{path} cannot be unpickled ({exc.__class__.__name__}: {exc})") from None
        check_trusted_vecnormalize(obj, path)
    else:
        try:
            obj = AllowListUnpickler(data).load()
        except Refused as exc:
            raise QuarlError(f"{path} asks for {exc}: refused") from None
        except pickle.UnpicklingError as exc:
            raise QuarlError(
                f"{path} needs arbitrary unpickling ({exc}): refused; pass --trust-pickle if you trust this file"
            ) from None
        except Exception as exc:  # a truncated or foreign file
            raise QuarlError(f"{path} is not a VecNormalize pickle ({exc.__class__.__name__}: {exc})") from None
    rms = getattr(obj, "obs_rms", None)
    if rms is None or not hasattr(rms, "mean"):
        raise QuarlError(f"{path} holds no observation statistics (obs_rms): not a VecNormalize pickle")
    if isinstance(rms, dict):
        raise QuarlError(f"{path}: dict observation spaces are not supported")
    mean, var = obs_statistics(getattr(rms, "mean"), getattr(rms, "var", None), f"{path}: obs_rms", obs_shape)
    clip_obs, epsilon = _number(obj, "clip_obs", 10.0, path), _number(obj, "epsilon", 1e-8, path)
    if clip_obs <= 0 or epsilon < 0:
        raise QuarlError(f"{path}: clip_obs={clip_obs} must be > 0 and epsilon={epsilon} >= 0")
    norm_obs = getattr(obj, "norm_obs", True)
    if not isinstance(norm_obs, (bool, np.bool_)):
        raise QuarlError(f"{path}: norm_obs={_short(norm_obs)} is a {type(norm_obs).__name__}, not true or false")
    return VecNormalizeStats(mean=mean, var=var, clip_obs=clip_obs, epsilon=epsilon, norm_obs=bool(norm_obs))


def _type_name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_trusted_vecnormalize(obj: Any, path: Path) -> None:
    """A trusted pickle is unpickled as it is: it must still be a VecNormalize (SB3's, or a
    class of that name) whose ``obs_rms`` is a RunningMeanStd, else one line naming the type
    found (another class's attributes ended in OverflowError or ValueError tracebacks)."""
    from stable_baselines3.common.running_mean_std import RunningMeanStd
    from stable_baselines3.common.vec_env import VecNormalize

    if not (isinstance(obj, VecNormalize) or type(obj).__name__ == "VecNormalize"):
        raise QuarlError(f"{path} holds a {_type_name(obj)}, not a VecNormalize "
                         "(stable_baselines3.common.vec_env.VecNormalize): refused")
    rms = getattr(obj, "obs_rms", None)
    if not (isinstance(rms, (RunningMeanStd, dict)) or type(rms).__name__ == "RunningMeanStd"):
        raise QuarlError(f"{path}: its obs_rms is a {_type_name(rms)}, not a RunningMeanStd "
                         "(stable_baselines3.common.running_mean_std.RunningMeanStd): refused")


def obs_statistics(mean: Any, var: Any, where: str, shape: tuple[int, ...] | None) -> tuple[np.ndarray, np.ndarray]:
    """Observation normalization statistics as float64 arrays, checked: numbers, finite,
    variances non-negative, and (given ``shape``) of the observation's shape."""
    out = []
    for name, raw in (("mean", mean), ("var", var)):
        if raw is None:
            raise QuarlError(f"{where}.{name} is missing")
        try:
            value = np.array(raw, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            raise QuarlError(f"{where}.{name} is not an array of numbers") from None
        if shape is not None and value.shape != tuple(shape):
            raise QuarlError(f"{where}.{name} has shape {value.shape} but the policy's observations are "
                             f"{tuple(shape)}: not this policy's statistics")
        if not np.all(np.isfinite(value)):
            raise QuarlError(f"{where}.{name} holds non-finite values (NaN or inf): refused")
        out.append(value)
    if np.any(out[1] < 0):
        raise QuarlError(f"{where}.var holds negative variances: refused")
    return out[0], out[1]


def _number(obj: Any, name: str, default: float, path: Path) -> float:
    value = getattr(obj, name, default)
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise QuarlError(f"{path}: {name}={_short(value)} is not a number") from None
    if not np.isfinite(number):
        raise QuarlError(f"{path}: {name}={number} is not finite")
    return number

