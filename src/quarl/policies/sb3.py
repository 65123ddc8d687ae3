"""Load Stable-Baselines3 checkpoints (``.zip``) and RL Zoo run folders as Policies.

Nothing from the checkpoint is executed: the weights come from ``policy.pth`` through
``torch.load(weights_only=True)``; the spaces and policy keyword arguments from the
readable fields of the zip's ``data`` JSON (never its cloudpickled blobs); the network
is rebuilt from the state dict's names and shapes. Supported: A2C, PPO, TRPO and
MaskablePPO (MLP and NatureCNN, discrete and box actions, gSDE, ``squash_output``), DQN,
QR-DQN, SAC, TQC, CrossQ (its Batch Renorm layers at their running statistics), TD3,
DDPG and ARS (linear and MLP). RecurrentPPO (LSTM) is refused with one line.

Each layout below is one entry of :data:`LAYOUTS` (:func:`register_layout` adds one).
Calling convention of the acting network per algorithm (deterministic acting)::

    a2c / ppo    features -> [shared_net] -> policy_net -> action_net   (argmax | mean, clipped)
    ars          features -> action_net (Linear [-> act -> Linear]* [-> tanh])  (argmax | clipped | unscaled)
    dqn          features -> q_net                                      (argmax)
    qrdqn        features -> quantile_net                               (argmax of quantile mean)
    sac / tqc    features -> latent_pi -> mu [-> Hardtanh] -> tanh      (unscaled to bounds)
    crossq       as sac, with Batch Renorm (running statistics) in latent_pi
    td3 / ddpg   features -> mu (ends in tanh)                          (unscaled to bounds)
"""

from __future__ import annotations

import base64
import io
import json
import logging
import pickletools
import re
import reprlib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable

import gymnasium as gym
import numpy as np
import torch
from pydantic import BeforeValidator, ConfigDict
from torch import nn

from quarl.envs import MAX_FRAME_STACK, EnvSpec, current_env_id, env_spec_for_policy, wrapper_names
from quarl.core.errors import QuarlError
from quarl.core.file_schema import MAX_JSON_DEPTH, Record, check_depth, parse_record
from quarl.core.limits import check_tensors, open_zip, read_zip_entry
from quarl.policies.base import check_outputs
from quarl.core.registry import put_first
from quarl.policies.base import ObsNormalizer, Policy, StateNoise
from quarl.policies.legacy import is_legacy_pickle, load_legacy
from quarl.policies.actorq_run import is_actorq_run, load_actorq_run
from quarl.policies.onnx_artifact import is_artifact, load_artifact
from quarl.core.literals import parse_literal
from quarl.policies.safe_load import load_vecnormalize, load_zoo_yaml
from quarl.policies.sb3_layers import _linear, _mlp

log = logging.getLogger(__name__)

QAT_FILE = "qat.json"
"""Written by quantization-aware training next to config.yml."""


_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "ReLU": nn.ReLU,
    "Tanh": nn.Tanh,
    "ELU": nn.ELU,
    "LeakyReLU": nn.LeakyReLU,
    "SiLU": nn.SiLU,
    "GELU": nn.GELU,
    "Sigmoid": nn.Sigmoid,
}


@dataclass
class Checkpoint:
    """A loaded checkpoint: the policy and how to build its env."""

    policy: Policy
    env_spec: EnvSpec | None
    """From the zoo folder's config; ``None`` for a bare zip (pass the env id)."""
    algo: str
    path: Path


# ---------------------------------------------------------------------------- spaces


def _field(entry: dict, *names: str) -> Any:
    for name in names:
        if entry.get(name) is not None:
            return entry[name]
    return None


def _parse_array(text: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
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


def _space_from_json(entry: dict, what: str) -> gym.spaces.Space:
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
        start = _int_vector(entry["start"]) if entry.get("start") not in (None, "None") else [0]
        if start is None or any(start):
            raise QuarlError(f"the checkpoint's {what} is a MultiDiscrete space with start {str(entry.get('start'))[:80]!r}:"
                             " only 0 (the default) is supported")
        return gym.spaces.MultiDiscrete(nvec)
    if kind == "MultiBinary":
        n = parse_literal(str(entry.get("n")))
        if not (isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 1024):
            raise QuarlError(f"the checkpoint's {what} is a MultiBinary space of n={entry.get('n')!r}: allowed 1..1024 "
                             "bits (one dimension)")
        return gym.spaces.MultiBinary(n)
    if kind == "Box":
        try:
            dtype = np.dtype(entry.get("dtype", "float32"))
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


# ---------------------------------------------------------------------------- network


def _features(sd: dict, prefix: str, obs_shape: tuple[int, ...]) -> list[nn.Module]:
    """SB3 features extractor: FlattenExtractor (no weights) or NatureCNN."""
    convs = [k for k in sd if k.startswith(prefix + "cnn.") and k.endswith(".weight")]
    if not convs:
        return [nn.Flatten()] if len(obs_shape) > 1 else []
    layers: list[nn.Module] = []
    strides = {8: 4, 4: 2, 3: 1}  # NatureCNN: 8x8/4, 4x4/2, 3x3/1
    for key in sorted(convs, key=lambda k: int(k.split(".")[-2])):
        w = sd[key]
        k = w.shape[-1]
        if k not in strides:
            raise QuarlError(f"unsupported CNN layer {key} with kernel {k}: only NatureCNN is supported")
        conv = nn.Conv2d(w.shape[1], w.shape[0], kernel_size=k, stride=strides[k])
        with torch.no_grad():
            conv.weight.copy_(w)
            conv.bias.copy_(sd[key[: -len("weight")] + "bias"])
        conv.sb3_name = key[: -len(".weight")]
        layers += [conv, nn.ReLU()]
    layers.append(nn.Flatten())
    layers += _mlp(sd, prefix + "linear.", nn.ReLU, trailing=True)
    return layers


@dataclass(frozen=True)
class LayoutInput:
    """What a layout's builder reads: the state dict and the policy's settings."""

    sd: dict[str, torch.Tensor]
    obs_shape: tuple[int, ...]
    activation: type[nn.Module]
    policy_kwargs: dict
    action_space: gym.spaces.Space

    @property
    def continuous(self) -> bool:
        return isinstance(self.action_space, gym.spaces.Box)


@dataclass(frozen=True)
class Acting:
    """A layout's acting network: its layers and the head that turns outputs into actions."""

    layers: list[nn.Module]
    head: str
    """``argmax``, ``quantile_argmax``, ``clip`` or ``unscale`` (see :class:`Policy`)."""
    n_quantiles: int = 0


@dataclass(frozen=True)
class Layout:
    """How one family of SB3 policies keeps its acting network in the state dict (the
    algorithms that share a policy class share a layout: A2C, PPO and TRPO; SAC, TQC
    and CrossQ; TD3 and DDPG). Adding a layout is one :func:`register_layout` call."""

    name: str
    """Also the algorithm's name when the checkpoint does not say it."""
    matches: Callable[[dict], bool]
    """Whether a state dict has this layout (asked newest registered first)."""
    build: Callable[[LayoutInput], Acting]
    default_activation: type[nn.Module] = nn.ReLU
    """The activation SB3 uses when ``policy_kwargs`` names none."""
    algos: tuple[str, ...] = ()
    """SB3 / sb3-contrib algorithm names saved with this layout (as their policy module names them)."""


LAYOUTS: dict[str, Layout] = {}


def register_layout(layout: Layout) -> Layout:
    """Add a layout, asked before those registered earlier; returns it."""
    return put_first(LAYOUTS, layout.name, layout)


def algos() -> tuple[str, ...]:
    """Every algorithm name a registered layout loads."""
    return tuple(dict.fromkeys(a for layout in reversed(LAYOUTS.values()) for a in (*layout.algos, layout.name)))


def _layout(sd: dict) -> Layout:
    keys = set(sd)
    if any(k.startswith(("lstm_actor.", "lstm_critic.")) for k in keys):
        raise QuarlError(
            "recurrent policies (RecurrentPPO, LSTM) are not supported: their actions depend on a hidden state "
            "that quarl's stateless engines do not carry"
        )
    for layout in LAYOUTS.values():
        if layout.matches(sd):
            return layout
    raise QuarlError(
        f"unsupported policy layout: the state dict matches none of {', '.join(LAYOUTS)} "
        f"(keys: {', '.join(sorted(keys)[:6])}...)"
    )


def _has_prefix(prefix: str) -> Callable[[dict], bool]:
    return lambda sd: any(k.startswith(prefix) for k in sd)


def _dqn(x: LayoutInput) -> Acting:
    return Acting(_features(x.sd, "q_net.features_extractor.", x.obs_shape) + _mlp(x.sd, "q_net.q_net.", x.activation, False),
                  "argmax")


def _qrdqn(x: LayoutInput) -> Acting:
    layers = _features(x.sd, "quantile_net.features_extractor.", x.obs_shape)
    layers += _mlp(x.sd, "quantile_net.quantile_net.", x.activation, False)
    return Acting(layers, "quantile_argmax", layers[-1].out_features // int(x.action_space.n))


def _ars(x: LayoutInput) -> Acting:
    layers = _features(x.sd, "features_extractor.", x.obs_shape) + _mlp(x.sd, "action_net.", x.activation, False)
    if x.continuous and x.policy_kwargs.get("squash_output", True):
        return Acting([*layers, nn.Tanh()], "unscale")
    return Acting(layers, "clip" if x.continuous else "argmax")


def _sac(x: LayoutInput) -> Acting:
    sd = x.sd
    # CrossQ's latent_pi has Batch Renorm slots and no trailing activation after them
    crossq = any(k.startswith("actor.latent_pi.") and k.endswith(".ra_mean") for k in sd)
    latent = _mlp(sd, "actor.latent_pi.", x.activation, not crossq, float(x.policy_kwargs.get("batch_norm_eps", 1e-3)))
    layers = _features(sd, "actor.features_extractor.", x.obs_shape) + latent
    if "actor.mu.0.weight" in sd:  # gSDE: mu = Sequential(Linear, Hardtanh(-clip_mean, clip_mean))
        clip_mean = float(x.policy_kwargs.get("clip_mean", 2.0))
        layers += [_linear(sd, "actor.mu.0"), nn.Hardtanh(-clip_mean, clip_mean)]
    else:
        layers.append(_linear(sd, "actor.mu"))
    return Acting([*layers, nn.Tanh()], "unscale")


def _td3(x: LayoutInput) -> Acting:
    layers = _features(x.sd, "actor.features_extractor.", x.obs_shape) + _mlp(x.sd, "actor.mu.", x.activation, False)
    return Acting([*layers, nn.Tanh()], "unscale")


def _actor_critic(x: LayoutInput) -> Acting:
    sd = x.sd
    fe = "pi_features_extractor." if any(k.startswith("pi_features_extractor.") for k in sd) else "features_extractor."
    layers = _features(sd, fe, x.obs_shape)
    layers += _mlp(sd, "mlp_extractor.shared_net.", x.activation, True)
    layers += _mlp(sd, "mlp_extractor.policy_net.", x.activation, True)
    layers.append(_linear(sd, "action_net"))
    if x.continuous and x.policy_kwargs.get("squash_output"):
        return Acting([*layers, nn.Tanh()], "unscale")
    return Acting(layers, "clip" if x.continuous else "argmax")


# asked newest first: the later registrations below are the more specific markers
register_layout(Layout("ars", lambda sd: "action_net.0.weight" in sd, _ars))
register_layout(Layout("ppo", lambda sd: "action_net.weight" in sd, _actor_critic, nn.Tanh, ("a2c", "trpo", "ppo_mask")))
register_layout(Layout("td3", _has_prefix("actor.mu."), _td3, algos=("ddpg",)))
register_layout(Layout("sac", _has_prefix("actor.latent_pi."), _sac, algos=("tqc", "crossq")))
register_layout(Layout("qrdqn", _has_prefix("quantile_net.quantile_net."), _qrdqn))
register_layout(Layout("dqn", _has_prefix("q_net.q_net."), _dqn))


def _activation(policy_kwargs: dict, layout: Layout) -> type[nn.Module]:
    name = policy_kwargs.get("activation_fn")
    if name is None:  # SB3 defaults: tanh for on-policy actor-critic, ReLU elsewhere (ARS too)
        return layout.default_activation
    short = str(name).rsplit(".", 1)[-1]
    if short not in _ACTIVATIONS:
        raise QuarlError(f"activation {name!r} is not supported: allowed {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[short]


MULTI_HEADS: dict[type, str] = {gym.spaces.MultiDiscrete: "multi_argmax", gym.spaces.MultiBinary: "bernoulli"}
"""Action spaces of several discrete distributions, and the head that acts in each."""


def build_policy(
    sd: dict[str, torch.Tensor],
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
    policy_kwargs: dict,
    algo: str | None = None,
) -> Policy:
    """Rebuild the acting network of an SB3 policy from its state dict (through the
    first :data:`LAYOUTS` entry that matches it)."""
    layout = _layout(sd)
    obs_shape = tuple(observation_space.shape or ())
    continuous = isinstance(action_space, gym.spaces.Box)
    multi = MULTI_HEADS.get(type(action_space))
    if not continuous and multi is None and not isinstance(action_space, gym.spaces.Discrete):
        raise QuarlError(f"action space {action_space} is not supported: allowed Box, Discrete, MultiDiscrete and "
                         "MultiBinary")
    if multi is not None and layout.name != "ppo":
        raise QuarlError(f"a {layout.name} network with {type(action_space).__name__} actions is not supported: "
                         "A2C / PPO / TRPO ones are")
    acting = layout.build(LayoutInput(sd, obs_shape, _activation(policy_kwargs, layout), policy_kwargs, action_space))
    if continuous != (acting.head in ("clip", "unscale")):
        raise QuarlError(f"a {layout.name} network with {'box' if continuous else 'discrete'} actions is not supported")
    if multi is not None:  # the same logits, split per sub-action or per bit
        acting = Acting(acting.layers, multi)
    image = len(obs_shape) == 3 and np.issubdtype(observation_space.dtype, np.integer)
    policy = Policy(
        network=nn.Sequential(*acting.layers),
        observation_space=observation_space,
        action_space=action_space,
        head=acting.head,
        algo=algo or layout.name,
        scale_images=image and bool(policy_kwargs.get("normalize_images", True)),
        n_quantiles=acting.n_quantiles,
    )
    _check_shapes(policy)
    return policy


def _check_shapes(policy: Policy) -> None:
    check_outputs(policy, "the checkpoint's network")


# ---------------------------------------------------------------------------- files


def _read_zip(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    try:
        with open_zip(path, "a Stable-Baselines3 checkpoint") as archive:
            names = set(archive.namelist())
            if "data" not in names or "policy.pth" not in names:
                raise QuarlError(f"{path} is not a Stable-Baselines3 checkpoint: it lacks 'data' or 'policy.pth'")
            data = json.loads(read_zip_entry(archive, "data", str(path)))
            raw = read_zip_entry(archive, "policy.pth", str(path))
    except zipfile.BadZipFile:
        raise QuarlError(f"{path} is not a Stable-Baselines3 checkpoint: not a zip file (corrupt or truncated?)") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise QuarlError(f"{path} is corrupt: its 'data' entry is not JSON") from None
    except RecursionError:  # deeper than Python's stack
        raise QuarlError(f"{path} is corrupt: its 'data' entry is JSON nested more than {MAX_JSON_DEPTH} deep: refused "
                         f"(at most {MAX_JSON_DEPTH})") from None
    check_depth(data, f"{path} is corrupt: its 'data' entry")  # before anything walks it
    if not isinstance(data, dict):
        raise QuarlError(f"{path} is corrupt: its 'data' entry is a JSON {type(data).__name__}, not an object")
    try:
        sd = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad or unsafe file
        raise QuarlError(f"{path}: policy.pth cannot be read as plain tensors ({exc.__class__.__name__})") from None
    if not isinstance(sd, dict):
        raise QuarlError(f"{path}: policy.pth holds a {type(sd).__name__}, not a state dict of tensors")
    check_tensors(sd, f"{path} policy.pth")  # before any copy or layer is built from the shapes it claims
    return data, {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}


def _policy_kwargs(data: dict, config: "ZooConfig") -> dict:
    out: dict = {}
    text = config.policy_kwargs
    if isinstance(text, str):
        parsed = parse_literal(text)
        out.update(parsed if isinstance(parsed, dict) else {})
    elif isinstance(text, dict):
        out.update(text)
    for key, value in (data.get("policy_kwargs") or {}).items():
        if not key.startswith(":"):
            out[key] = parse_literal(value) if isinstance(value, str) else value
    return out


def _algo_from_data(data: dict, family: str) -> str:
    """The algorithm's name; where several share a policy class, told apart by the
    hyperparameters they save (PPO's clip range; DDPG is TD3 without delay or noise)."""
    module = str((data.get("policy_class") or {}).get("__module__", ""))
    m = re.match(r"(?:stable_baselines3|sb3_contrib)\.(\w+)\.policies", module)
    algo = m.group(1) if m and m.group(1) in algos() else family
    if algo == "ppo":  # A2C, PPO and TRPO share ActorCriticPolicy
        return "ppo" if "clip_range" in data else "trpo" if "cg_max_steps" in data else "a2c"
    if algo == "td3" and data.get("policy_delay") == 1 and data.get("target_noise_clip") == 0.0:
        return "ddpg"
    return algo


def _policy_class_name(data: dict) -> str | None:
    """The policy class's name, read from the opcodes of its pickled reference (never
    unpickled): ``ARSLinearPolicy`` and ``ARSPolicy`` differ only in their defaults."""
    blob = (data.get("policy_class") or {}).get(":serialized:")
    if not isinstance(blob, str):
        return None
    try:
        strings = [arg for op, arg, _ in pickletools.genops(base64.b64decode(blob)) if isinstance(arg, str)]
    except Exception:  # not a pickle we can read: the defaults stay unknown
        return None
    return strings[-1] if strings else None


CHECKPOINT_ZIP = re.compile(r"rl_model_(\d+)_steps\.zip")


def pick_zip(folder: Path, load_best: bool = False, load_checkpoint: int | None = None,
             load_last_checkpoint: bool = False) -> Path:
    """The zip of an RL Zoo run folder a command takes, chosen as ``rl_zoo3.enjoy`` chooses:
    ``best_model.zip`` (``load_best``), ``rl_model_N_steps.zip`` (``load_checkpoint=N``),
    the latest of those (``load_last_checkpoint``), else the final model: the one zip that
    is neither (``best_model.zip`` where there is no other). Two final models are refused
    with their names: a folder is one policy."""
    folder = Path(folder)
    if sum([load_best, load_checkpoint is not None, load_last_checkpoint]) > 1:
        raise QuarlError("--load-best, --load-checkpoint and --load-last-checkpoint pick one zip each: give one")
    if not folder.is_dir():
        if load_best or load_checkpoint is not None or load_last_checkpoint:
            raise QuarlError(f"--load-best / --load-checkpoint / --load-last-checkpoint pick a zip of a run folder; "
                             f"{folder} is not a folder")
        return folder
    checkpoints = {int(m.group(1)): p for p in folder.glob("rl_model_*_steps.zip") if (m := CHECKPOINT_ZIP.fullmatch(p.name))}
    if load_best:
        if not (folder / "best_model.zip").is_file():
            raise QuarlError(f"--load-best: {folder} has no best_model.zip (it is written by training with evaluation)")
        return folder / "best_model.zip"
    if load_checkpoint is not None:
        if load_checkpoint not in checkpoints:
            have = ", ".join(str(n) for n in sorted(checkpoints)) or "none"
            raise QuarlError(f"--load-checkpoint {load_checkpoint}: {folder} has no rl_model_{load_checkpoint}_steps.zip "
                             f"(checkpoints: {have})")
        return checkpoints[load_checkpoint]
    if load_last_checkpoint:
        if not checkpoints:
            raise QuarlError(f"--load-last-checkpoint: {folder} has no rl_model_N_steps.zip checkpoint")
        return checkpoints[max(checkpoints)]
    finals = sorted(p for p in folder.glob("*.zip") if p.name != "best_model.zip" and p not in checkpoints.values())
    if len(finals) > 1:
        raise QuarlError(f"{folder} holds {len(finals)} policies ({', '.join(p.name for p in finals)}): a run folder "
                         f"is one policy; name the zip to use (e.g. {finals[0]})")
    finals = finals or sorted(folder.glob("best_model.zip"))
    if not finals:
        raise QuarlError(f"{folder} holds no .zip checkpoint: expected an RL Zoo run folder like ppo/CartPole-v1_1")
    return finals[0]


def _zoo_files(path: Path) -> tuple[Path, Path | None, str | None]:
    """(zip, config folder, algo) for a zoo run folder or a zip (maybe inside one)."""
    if path.is_dir():
        zip_path = pick_zip(path)
    elif path.suffix == ".zip" or path.is_file():
        zip_path = path
    else:
        raise QuarlError(f"checkpoint {str(path)!r} does not exist")
    folder = zip_path.parent
    env_name = zip_path.stem
    config_dir = folder / env_name if (folder / env_name / "config.yml").exists() else None
    if config_dir is None and zip_path.suffix == ".zip":
        # best_model.zip, rl_model_N_steps.zip (or a renamed zip) inside a run folder: its ENV/ holds the
        # statistics the agent was trained with, as rl_zoo3 --load-best / --load-checkpoint finds them
        found = sorted(d for d in folder.iterdir() if d.is_dir() and (d / "config.yml").is_file())
        if len(found) > 1:
            raise QuarlError(f"{zip_path} sits beside {len(found)} RL Zoo config folders "
                             f"({', '.join(d.name for d in found)}): cannot tell which is its own")
        config_dir = found[0] if found else None
    algo_dir = folder.parent.name.lower()
    return zip_path, config_dir, algo_dir if algo_dir in algos() else None


def state_noise(sd: dict[str, torch.Tensor], policy_kwargs: dict, policy: Policy, what: str) -> StateNoise | None:
    """The state-dependent noise head of an SAC / TQC / CrossQ actor or a gSDE policy, built
    from the state dict as SB3 samples with it (None for other heads): its network is the
    acting network's layers up to the action layer (the latent), plus SAC's log-std layer."""
    if policy.head not in ("clip", "unscale") or not isinstance(policy.network, nn.Sequential):
        return None
    layers = list(policy.network)
    action_layer = max((i for i, m in enumerate(layers) if isinstance(m, nn.Linear)), default=None)
    if action_layer is None:
        return None
    import copy

    latent = copy.deepcopy(nn.Sequential(*layers[:action_layer]))
    width = layers[action_layer].in_features
    if "actor.log_std.weight" in sd:  # SAC without gSDE: log_std = Linear(latent_pi), clamped in sampling
        head = _linear(sd, "actor.log_std")
        if head.in_features != width or head.out_features != int(np.prod(policy.action_space.shape or ())):
            raise QuarlError(f"{what}: actor.log_std of shape {tuple(head.weight.shape)} does not fit the actor")
        return StateNoise("squashed_gaussian", nn.Sequential(*latent, head).eval().requires_grad_(False))
    log_std = sd.get("actor.log_std", sd.get("log_std"))
    if not isinstance(log_std, torch.Tensor) or log_std.ndim != 2:
        return None
    n_actions = int(np.prod(policy.action_space.shape or ()))
    if log_std.shape[0] != width or log_std.shape[1] not in (1, n_actions):
        raise QuarlError(f"{what}: gSDE's log_std of shape {tuple(log_std.shape)} does not fit a latent of {width} "
                         f"and {n_actions} actions")
    if float(log_std.abs().max()) > MAX_ABS_LOG_STD:
        raise QuarlError(f"{what}: gSDE's log_std reaches {float(log_std.abs().max()):.4g}, beyond +-{MAX_ABS_LOG_STD}")
    raw = log_std.double()
    if policy_kwargs.get("use_expln"):  # SB3's expln: exp below 0, log1p(x) + 1 above (kept > 0, slow growth)
        std = torch.where(raw <= 0, torch.exp(raw), torch.log1p(raw.clamp(min=0) + 1e-6) + 1.0)
    else:
        std = torch.exp(raw)
    std = std.expand(width, n_actions)  # full_std=False keeps one column, broadcast as SB3's get_std does
    return StateNoise("gsde", latent.eval().requires_grad_(False), std=std.numpy().copy(),
                      squash=policy.head == "unscale")


MAX_ABS_LOG_STD = 20.0
"""A Gaussian's log std beyond this (std above 5e8 or below 2e-9) is not a trained policy's."""


def load_checkpoint(path: str | Path, trust_pickle: bool = False, zip_override: Path | None = None) -> Checkpoint:
    """Load an SB3 ``.zip``, an RL Zoo run folder (``ppo/CartPole-v1_1``), a legacy
    stable-baselines pickle of rl-baselines-zoo (``ppo2/CartPole-v1.pkl``, see
    :mod:`quarl.policies.legacy`) or a model written by ``quarl export`` (``NAME.onnx``
    with its sidecar, see :mod:`quarl.policies.onnx_artifact`) or an agent on the Hugging
    Face Hub, ``hf://ORG/REPO`` (see :mod:`quarl.hub`). ``zip_override``: read the weights
    from this zip instead, with the folder's zoo files."""
    from quarl import hub

    if hub.is_hub(path):
        path = hub.fetch(str(path))
    path = Path(path)
    if not path.exists():
        raise QuarlError(f"checkpoint {str(path)!r} does not exist")
    if is_actorq_run(path):  # quarl actorq's OUT/policy.pt + summary.json
        policy, spec, algo = load_actorq_run(path)
        return Checkpoint(policy=policy, env_spec=spec, algo=algo, path=path)
    if is_artifact(path):  # quarl export's NAME.onnx + NAME.json: evaluated as exported
        policy, spec = load_artifact(path)
        return Checkpoint(policy=policy, env_spec=spec, algo=policy.algo, path=path)
    if is_legacy_pickle(path):
        policy, algo, env_id = load_legacy(path)
        spec = EnvSpec(env_id=current_env_id(env_id))
        return Checkpoint(policy=policy, env_spec=spec, algo=algo, path=path)
    zip_path, config_dir, zoo_algo = _zoo_files(path)
    # another zip acting in this folder's env (a recovered folder's original policy)
    data, sd = _read_zip(zip_override or zip_path)
    config = read_zoo_config(config_dir / "config.yml") if config_dir else ZooConfig()
    obs_space = _space_from_json(data.get("observation_space"), "observation space")
    act_space = _space_from_json(data.get("action_space"), "action space")
    kwargs = _policy_kwargs(data, config)
    if _policy_class_name(data) == "ARSLinearPolicy":  # ARS's linear policy clips; its MLP squashes
        kwargs.setdefault("squash_output", False)
    algo = zoo_algo or _algo_from_data(data, _layout(sd).name)
    policy = build_policy(sd, obs_space, act_space, kwargs, algo=algo)
    log_std = sd.get("log_std")
    if policy.head == "clip" and isinstance(log_std, torch.Tensor) and log_std.shape == policy.action_space.shape:
        # a diagonal Gaussian's state-independent log std (A2C / PPO / TRPO; gSDE's is a matrix): what
        # predict(deterministic=False) samples with; an absurd one would overflow (NaN / inf: check_tensors refused)
        if float(log_std.abs().max()) > MAX_ABS_LOG_STD:
            raise QuarlError(f"{zip_override or zip_path}: policy.pth's log_std {log_std.tolist()} is not finite "
                             f"within +-{MAX_ABS_LOG_STD}")
        policy.meta["log_std"] = [float(v) for v in log_std.reshape(-1)]
    policy.noise = state_noise(sd, kwargs, policy, str(zip_override or zip_path))
    rate = data.get("exploration_rate")
    if policy.head in ("argmax", "quantile_argmax") and isinstance(rate, (int, float)) and 0.0 <= rate <= 1.0:
        policy.meta["exploration_rate"] = float(rate)  # what SB3's predict(deterministic=False) explores with

    env_spec = None
    if config_dir is not None:
        env_spec = _zoo_env_spec(config_dir, config_dir.name, config)
        if config.normalize:
            stats_path = config_dir / "vecnormalize.pkl"
            if not stats_path.exists():
                raise QuarlError(f"{config_dir} says normalize=True but has no vecnormalize.pkl")
            stats = load_vecnormalize(stats_path, trust_pickle=trust_pickle, obs_shape=policy.input_shape)
            if stats["norm_obs"]:
                policy.obs_normalizer = ObsNormalizer(stats["mean"], stats["var"], stats["clip_obs"], stats["epsilon"])
        qat_file = config_dir / QAT_FILE
        if qat_file.exists():  # a quantization-aware trained run: act as it was trained
            from quarl.quant.api import from_qat_state

            from quarl.training.qat_sb3 import read_qat_state

            # a typed QATStateRecord: NaN, inf or zero-width ranges refused here as on resume
            policy = from_qat_state(policy, read_qat_state(qat_file))
    log.info("loaded %s %s policy from %s", algo, type(policy.action_space).__name__, path)
    return Checkpoint(policy=policy, env_spec=env_spec, algo=algo, path=path)


MAX_EPISODE_STEPS_KWARG = 10**6
"""``max_episode_steps`` in a folder's env kwargs at most: 9x the Atari cap of 108,000 frames
(27,000 steps), 1,000x a MuJoCo episode; 10^12 made one evaluation episode endless."""


def _steps(value: Any) -> Any:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 1 <= value <= MAX_EPISODE_STEPS_KWARG):
        raise ValueError(f"max_episode_steps={reprlib.repr(value)} must be a whole number in 1..{MAX_EPISODE_STEPS_KWARG:,}")
    return value


class EnvKwargs(Record):
    """An env's keyword arguments (``env_kwargs.yml``, or ``env_kwargs`` of ``args.yml``): the
    one quarl acts on typed, the others passed to the env as they are."""

    model_config = ConfigDict(extra="allow")
    max_episode_steps: Annotated[int | None, BeforeValidator(_steps)] = None


def _frame_stack(value: Any) -> Any:
    if not value:  # the zoo's "no stacking" as rl_zoo3 reads it
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_FRAME_STACK:
        raise ValueError(f"frame_stack={reprlib.repr(value)} must be a whole number in 1..{MAX_FRAME_STACK}")
    return value


class ZooConfig(Record):
    """The fields of an RL Zoo ``config.yml`` (the run's hyperparameters) the loader reads;
    the others are the algorithm's, left as they are."""

    model_config = ConfigDict(extra="allow")
    policy_kwargs: str | dict[str, Any] | None = None
    """Python literal text (``dict(net_arch=[64, 64])``) or a mapping."""
    normalize: bool | str | dict[str, Any] | None = None
    """VecNormalize: ``True``, or its options (a mapping, or its text)."""
    env_wrapper: str | list[Any] | dict[str, Any] | None = None
    frame_stack: Annotated[int | None, BeforeValidator(_frame_stack)] = None
    """Frames stacked (absent, or a falsy value: 1)."""


class ZooArgs(Record):
    """The fields of an RL Zoo ``args.yml`` (the command line of the run) the loader reads."""

    model_config = ConfigDict(extra="allow")
    env: str | None = None
    env_kwargs: EnvKwargs | None = None
    gym_packages: list[str] | str | None = None


def read_zoo_config(path: Path) -> ZooConfig:
    """``config.yml`` (read by the safe YAML loader) as a :class:`ZooConfig`."""
    return parse_record(ZooConfig, load_zoo_yaml(path), path)


def _env_kwargs(raw: Any, record: EnvKwargs | None) -> dict:
    """The env kwargs as the file holds them (a :class:`EnvKwargs` checked them)."""
    return dict(raw) if record is not None and isinstance(raw, dict) else {}


def _zoo_env_spec(config_dir: Path, env_name: str, config: ZooConfig) -> EnvSpec:
    env_kwargs: dict = {}
    args_file = config_dir / "args.yml"
    raw_args = load_zoo_yaml(args_file) if args_file.exists() else {}
    args = parse_record(ZooArgs, raw_args, args_file)
    if raw_args.get("env_kwargs"):  # as rl_zoo3.enjoy reads them; env_kwargs.yml (quarl's) over them
        env_kwargs = _env_kwargs(raw_args["env_kwargs"], args.env_kwargs)
    kwargs_file = config_dir / "env_kwargs.yml"
    if kwargs_file.exists():
        raw_kwargs = load_zoo_yaml(kwargs_file) or {}
        env_kwargs.update(_env_kwargs(raw_kwargs, parse_record(EnvKwargs, raw_kwargs, kwargs_file)))
    env_id = env_name
    if raw_args:
        env_id = args.env if args.env is not None else env_name
        packages = args.gym_packages or []
        if packages:  # rl_zoo3 records the modules that register the agent's custom env: imported only if allowed
            from quarl.envs import import_named_by_file

            log.info("importing %s (gym_packages of %s)", ", ".join(map(str, packages)), args_file)
            import_named_by_file(packages if isinstance(packages, list) else [packages], f"{args_file} gym_packages")
    return EnvSpec(
        env_id=current_env_id(env_id),
        env_kwargs=env_kwargs,
        wrappers=wrapper_names(config.env_wrapper),
        frame_stack=config.frame_stack or 1,
    )


def resolve_env_spec(checkpoint: Checkpoint, env_id: str | None) -> EnvSpec:
    """The env to evaluate in: ``env_id`` when given (keeping the zoo's wrappers when it
    names the same env), else the zoo folder's own."""
    spec = checkpoint.env_spec
    if env_id is None:
        if spec is None:
            raise QuarlError(f"{checkpoint.path} is a bare checkpoint: pass --env ENV_ID")
        return spec
    if spec is not None and current_env_id(env_id) == spec.env_id:
        return spec
    if spec is not None:  # another version of the zoo env: keep its wrappers
        return EnvSpec(current_env_id(env_id), spec.env_kwargs, spec.wrappers, spec.frame_stack)
    return env_spec_for_policy(env_id, checkpoint.policy.input_shape)
