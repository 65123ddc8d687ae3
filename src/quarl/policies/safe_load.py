"""Reading checkpoint side files without executing code from them.

- RL Zoo YAML files carry a ``!!python/object/apply:collections.OrderedDict`` tag; a
  safe loader that turns that one tag into a dict reads them, nothing else is built.
- ``vecnormalize.pkl`` is a pickled VecNormalize object. :func:`load_vecnormalize`
  unpickles it with an allow-list: numpy arrays and scalars, and stand-in records for the
  SB3 / gym classes whose attributes we read. Any other global makes it refuse, unless
  the caller trusts the file (``--trust-pickle``).
- Policy keyword arguments such as ``net_arch=[dict(pi=[64], vf=[64])]`` come as Python
  literal text (config.yml, or the readable fields of an SB3 zip): parsed with ``ast``.
"""

from __future__ import annotations

import ast
import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from quarl.errors import QuarlError


class _ZooYamlLoader(yaml.SafeLoader):
    pass


def _ordered_dict(loader: yaml.Loader, node: yaml.Node) -> dict:
    pairs = loader.construct_sequence(node, deep=True)
    items = pairs[0] if len(pairs) == 1 and isinstance(pairs[0], list) else pairs
    return {k: v for k, v in items}


_ZooYamlLoader.add_constructor("tag:yaml.org,2002:python/object/apply:collections.OrderedDict", _ordered_dict)


def load_zoo_yaml(path: Path) -> dict:
    """An RL Zoo ``config.yml`` / ``args.yml`` / ``env_kwargs.yml`` as a plain dict."""
    try:
        data = yaml.load(path.read_text(), Loader=_ZooYamlLoader)  # noqa: S506 - safe subclass
    except yaml.YAMLError as exc:
        raise QuarlError(f"cannot read {path}: not a YAML file the RL Zoo writes ({exc.__class__.__name__})") from None
    data = data or {}
    if not isinstance(data, dict):
        raise QuarlError(f"cannot read {path}: a YAML {type(data).__name__}, not the mapping the RL Zoo writes")
    return data


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
    try:  # numpy >= 2 moved numpy.core to numpy._core
        import numpy._core.multiarray as multiarray
    except ImportError:  # pragma: no cover - numpy 1
        import numpy.core.multiarray as multiarray
    return multiarray


# Globals a VecNormalize pickle may reference, mapped to what rebuilds them harmlessly.
_NUMPY_GLOBALS: dict[str, Any] = {
    "_reconstruct": _multiarray()._reconstruct,
    "scalar": _multiarray().scalar,
    "ndarray": np.ndarray,
    "dtype": np.dtype,
}
_NUMPY_MODULES = ("numpy", "numpy.core.multiarray", "numpy._core.multiarray")
_RECORD_MODULES = (
    "stable_baselines3.common.vec_env",
    "stable_baselines3.common.running_mean_std",
    "gym.spaces",
    "gymnasium.spaces",
    "numpy.random",  # the spaces' random generators: kept as inert records
)


def numpy_global(module: str, name: str) -> Any:
    """What rebuilds a pickled numpy array, dtype or scalar; None for any other global."""
    if module in _NUMPY_MODULES and name in _NUMPY_GLOBALS:
        return _NUMPY_GLOBALS[name]
    if module == "numpy.dtypes" and name.endswith("DType"):
        return getattr(np.dtypes, name)
    return None


class AllowListUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = numpy_global(module, name)
        if found is not None:
            return found
        if module == "collections" and name == "OrderedDict":
            return dict
        if module.startswith(_RECORD_MODULES):
            return _record_class(name)
        raise pickle.UnpicklingError(f"it references {module}.{name}")


def load_vecnormalize(path: Path, trust_pickle: bool = False) -> dict[str, Any]:
    """Observation statistics of a VecNormalize pickle: ``mean``, ``var``, ``clip_obs``,
    ``epsilon``, ``norm_obs``."""
    data = path.read_bytes()
    if trust_pickle:
        try:
            obj = pickle.loads(data)  # noqa: S301 - the user vouched for this file
        except Exception as exc:  # truncated, or a class that is not installed
            raise QuarlError(f"{path} cannot be unpickled ({exc.__class__.__name__}: {exc})") from None
    else:
        try:
            obj = AllowListUnpickler(io.BytesIO(data)).load()
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
    return {
        "mean": np.asarray(rms.mean, dtype=np.float64),
        "var": np.asarray(rms.var, dtype=np.float64),
        "clip_obs": float(getattr(obj, "clip_obs", 10.0)),
        "epsilon": float(getattr(obj, "epsilon", 1e-8)),
        "norm_obs": bool(getattr(obj, "norm_obs", True)),
    }


class _Names(ast.NodeTransformer):
    """Turn bare names and attributes (``nn.ReLU``) into their dotted text."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in ("True", "False", "None"):
            return node
        return ast.copy_location(ast.Constant(node.id), node)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        return ast.copy_location(ast.Constant(ast.unparse(node)), node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        # dict(a=1) -> {'a': 1}; any other call is kept as its text
        if isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
            return ast.copy_location(
                ast.Dict([ast.Constant(k.arg) for k in node.keywords], [self.visit(k.value) for k in node.keywords]),
                node,
            )
        return ast.copy_location(ast.Constant(ast.unparse(node)), node)


def parse_literal(text: str) -> Any:
    """A Python literal written as text, with names kept as strings: never evaluated."""
    text = text.strip()
    if text.startswith("<class '") and text.endswith("'>"):
        return text[len("<class '") : -2]
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return text
    return ast.literal_eval(_Names().visit(tree))
