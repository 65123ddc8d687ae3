"""Load the paper's agents: legacy stable-baselines (TensorFlow) pickles from
rl-baselines-zoo (``trained_agents/ALGO/ENV.pkl``, with ``ENV/obs_rms.pkl`` when the
observations were normalized).

Such a file is ``cloudpickle.dump((data, params))``: ``data`` holds hyperparameters, the
gym spaces and the policy class; ``params`` is the list of TensorFlow variables in the
order the policy created them, as numpy arrays. It is read with an unpickler that only
rebuilds numpy arrays and plain containers: every other global (gym spaces, policy
classes, cloudpickled learning-rate functions) becomes an inert record that keeps its
pickled attributes and runs no code. The network is rebuilt from the variables' shapes
and creation order, which stable-baselines fixes per policy:

    a2c / ppo2 / acktr / trpo   MlpPolicy: (pi_fc_i, vf_fc_i) per hidden layer, tanh;
                                then vf, pi (+ logstd for Box actions), q
    dqn                         action_value: fc [+ LayerNorm beta, gamma], relu ...,
                                scores; then state_value (dueling) the same way; then
                                the target network (skipped)
    ddpg                        pi: fc [+ LayerNorm], relu ..., tanh output; then the
                                critic and the targets (skipped)

Networks act exactly as the TensorFlow graph did: Q = V + A - mean(A) for dueling DQN,
LayerNorm with TensorFlow's epsilon.
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any, NoReturn

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from quarl.core.errors import QuarlError
from quarl.core.limits import check_tensors, model_file_cap, read_capped
from quarl.envs import EnvSpec, current_env_id
from quarl.policies.base import ObsNormalizer, Policy
from quarl.policies.checkpoint import Checkpoint
from quarl.policies.safe_load import AllowListUnpickler, Record, Refused, obs_statistics

log = logging.getLogger(__name__)

ALGOS = {"a2c": "a2c", "ppo2": "ppo", "acktr": "a2c", "trpo": "ppo", "dqn": "dqn", "ddpg": "ddpg"}
"""Legacy algorithm folder -> the algorithm whose acting network it has."""

TF_LAYER_NORM_EPS = 1e-12
"""tf.contrib.layers.layer_norm's variance epsilon."""


class _Inert(Record):
    """Stand-in for any non-numpy global: built, called or given state, it records and
    runs nothing (cloudpickle calls what it rebuilds, hence ``__call__``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:
        return _Inert()


class _InertUnpickler(AllowListUnpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:  # numpy and plain containers as the allow-list rebuilds them
            return super().find_class(module, name)
        except pickle.UnpicklingError:
            return type(name, (_Inert,), {})


def read_pickle(path: Path) -> Any:
    """Unpickle ``path`` with numpy arrays rebuilt and everything else inert."""
    try:
        return _InertUnpickler(read_capped(path, model_file_cap(), "a legacy stable-baselines pickle")).load()
    except QuarlError:
        raise
    except Refused as exc:
        raise QuarlError(f"{path} asks for {exc}: refused") from None
    except Exception as exc:  # truncated, not a pickle, or a layout no stand-in can take
        raise QuarlError(f"{path} is not a readable legacy stable-baselines pickle "
                         f"({exc.__class__.__name__}: {exc})") from None


def is_legacy_pickle(path: Path) -> bool:
    return path.is_file() and path.suffix == ".pkl"


# ---------------------------------------------------------------------------- spaces


def _space(record: Any, what: str, path: Path) -> gym.spaces.Space[Any]:
    kind = type(record).__name__  # stand-in classes carry the pickled class's name
    if kind == "Discrete":
        return gym.spaces.Discrete(int(record.n))
    if kind == "Box":
        dtype = np.dtype(getattr(record, "dtype", np.float32))
        return gym.spaces.Box(np.asarray(record.low, dtype), np.asarray(record.high, dtype), dtype=dtype)
    raise QuarlError(f"{path}: {what} of type {kind} is not supported: allowed Box and Discrete")


# ---------------------------------------------------------------------------- networks


def _linear(weight: np.ndarray, bias: np.ndarray) -> nn.Linear:
    # TensorFlow stores dense kernels as (in, out)
    layer = nn.Linear(weight.shape[0], weight.shape[1])
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(weight.T, dtype=np.float32)))
        layer.bias.copy_(torch.from_numpy(np.asarray(bias, dtype=np.float32)))
    return layer


def _layer_norm(beta: np.ndarray, gamma: np.ndarray) -> nn.LayerNorm:
    norm = nn.LayerNorm(len(beta), eps=TF_LAYER_NORM_EPS)
    with torch.no_grad():
        norm.bias.copy_(torch.from_numpy(np.asarray(beta, dtype=np.float32)))
        norm.weight.copy_(torch.from_numpy(np.asarray(gamma, dtype=np.float32)))
    return norm


class _Reader:
    """Walks the variable list in creation order."""

    def __init__(self, params: list[np.ndarray], path: Path) -> None:
        self.params, self.pos, self.path = [np.asarray(p) for p in params if np.ndim(p) > 0], 0, path

    def peek(self, ahead: int = 0) -> np.ndarray | None:
        i = self.pos + ahead
        return self.params[i] if i < len(self.params) else None

    def take(self) -> np.ndarray:
        if self.pos >= len(self.params):
            self.fail("fewer variables than the policy needs")
        self.pos += 1
        return self.params[self.pos - 1]

    def dense(self, n_in: int) -> nn.Linear:
        weight, bias = self.take(), self.take()
        if weight.ndim != 2 or weight.shape[0] != n_in or bias.shape != (weight.shape[1],):
            self.fail(f"expected a dense layer from {n_in} inputs, found {weight.shape} and {bias.shape}")
        return _linear(weight, bias)

    def fail(self, why: str) -> NoReturn:
        raise QuarlError(f"{self.path}: unsupported policy layout ({why}); quarl reads stable-baselines MlpPolicy, "
                         "DQN MLP policies (dueling, layer norm) and DDPG MLP policies")


def _feedforward_stream(reader: _Reader, n_in: int, n_out: int, activation: type[nn.Module]) -> nn.Sequential:
    """dense [+ LayerNorm], activation ... until the layer with ``n_out`` outputs."""
    layers: list[nn.Module] = []
    width = n_in
    while True:
        weight = reader.peek()
        if weight is None or weight.ndim != 2:
            reader.fail("a stream does not end in a dense layer")
        dense = reader.dense(width)
        width = dense.out_features
        layers.append(dense)
        after = reader.peek()
        if width == n_out and (after is None or after.ndim == 2):
            return nn.Sequential(*layers)
        gamma = reader.peek(1)
        if after is not None and after.shape == (width,) and gamma is not None and gamma.shape == (width,):
            layers.append(_layer_norm(reader.take(), reader.take()))  # beta is created before gamma
        layers.append(activation())


class DuelingQ(nn.Module):
    """stable-baselines' dueling head: Q = V + A - mean(A)."""

    def __init__(self, advantage: nn.Sequential, value: nn.Sequential) -> None:
        super().__init__()
        self.advantage, self.value = advantage, value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.advantage(x)
        q: torch.Tensor = self.value(x) + a - a.mean(dim=1, keepdim=True)
        return q


def _actor_critic(reader: _Reader, obs_dim: int, n_out: int, path: Path) -> nn.Sequential:
    """MlpPolicy: hidden layers come in (pi_fc_i, vf_fc_i) pairs, then vf (1 output), then pi."""
    hidden: list[tuple[np.ndarray, np.ndarray]] = []
    while True:
        weight = reader.peek()
        if weight is None or weight.ndim != 2:
            reader.fail("no value layer after the hidden layers")
        if weight.shape[1] == 1 and hidden and len(hidden) % 2 == 0:
            break  # vf: one output, after as many pi as vf layers
        hidden.append((reader.take(), reader.take()))
    pi_hidden = hidden[0::2]
    layers: list[nn.Module] = []
    width = obs_dim
    for weight, bias in pi_hidden:
        if weight.shape[0] != width:
            reader.fail(f"policy layer from {weight.shape[0]} inputs after a layer of {width}")
        layers += [_linear(weight, bias), nn.Tanh()]
        width = weight.shape[1]
    reader.dense(hidden[-1][0].shape[1])  # vf (after the last vf_fc), not needed to act
    layers.append(reader.dense(width))  # pi: logits or the Gaussian's mean
    if layers[-1].out_features != n_out:
        reader.fail(f"policy output of {layers[-1].out_features}, the action space needs {n_out}")
    return nn.Sequential(*layers)


def build_network(algo: str, params: list[np.ndarray], obs_space: gym.spaces.Space[Any],
                  act_space: gym.spaces.Space[Any], path: Path) -> tuple[nn.Module, str]:
    """The acting network and its action head."""
    obs_shape = obs_space.shape or ()
    if len(obs_shape) != 1:
        raise QuarlError(f"{path}: observations of shape {obs_space.shape}: only flat (MLP) policies are supported")
    obs_dim = int(obs_shape[0])
    discrete = isinstance(act_space, gym.spaces.Discrete)
    n_out = int(act_space.n) if isinstance(act_space, gym.spaces.Discrete) else int(np.prod(act_space.shape or ()))
    reader = _Reader(params, path)
    if algo == "dqn":
        if not discrete:
            reader.fail("DQN with a continuous action space")
        advantage = _feedforward_stream(reader, obs_dim, n_out, nn.ReLU)
        try:  # dueling: a state_value stream of the same depth, ending in one output
            value = _feedforward_stream(reader, obs_dim, 1, nn.ReLU)
        except QuarlError:  # what follows is the target network of a non-dueling DQN
            return advantage, "argmax"
        return (DuelingQ(advantage, value), "argmax") if len(value) == len(advantage) else (advantage, "argmax")
    if algo == "ddpg":
        if discrete:
            reader.fail("DDPG with a discrete action space")
        actor = _feedforward_stream(reader, obs_dim, n_out, nn.ReLU)
        return nn.Sequential(*actor, nn.Tanh()), "unscale"
    network = _actor_critic(reader, obs_dim, n_out, path)
    return network, "argmax" if discrete else "clip"


# ---------------------------------------------------------------------------- loading


def _algo(path: Path, data: dict[str, object]) -> str:
    folder = path.parent.name.lower()
    if folder in ALGOS:
        return folder
    keys = set(data)
    if {"prioritized_replay", "exploration_fraction"} <= keys:
        return "dqn"
    if {"actor_lr", "critic_lr"} <= keys:
        return "ddpg"
    if {"cliprange", "noptepochs"} <= keys:
        return "ppo2"
    if {"lr_schedule", "alpha"} <= keys:
        return "a2c"
    raise QuarlError(f"{path}: cannot tell the algorithm (put it in an ALGO/ folder: {', '.join(ALGOS)})")


def load_running_mean_std(path: Path, shape: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``mean`` and ``var`` of a legacy ``obs_rms.pkl`` (stable-baselines RunningMeanStd),
    checked as :func:`~quarl.policies.safe_load.obs_statistics` checks them."""
    rms = read_pickle(path)
    mean, var = getattr(rms, "mean", None), getattr(rms, "var", None)
    if mean is None or var is None:
        raise QuarlError(f"{path} holds no running mean and variance")
    return obs_statistics(mean, var, str(path), shape)


def load_legacy(path: Path) -> tuple[Policy, str, str]:
    """The policy of a legacy stable-baselines pickle, its algorithm (quarl's name) and
    the env id its file name gives."""
    blob = read_pickle(path)
    if not (isinstance(blob, tuple) and len(blob) == 2 and isinstance(blob[0], dict)):
        raise QuarlError(f"{path} is not a stable-baselines model file: expected (data, params), got "
                         f"{type(blob).__name__}")
    data, params = blob
    if isinstance(params, dict):  # stable-baselines >= 2.7 saved names with the arrays
        params = list(params.values())
    if not isinstance(params, list):
        raise QuarlError(f"{path}: the parameters are a {type(params).__name__}, not a list of arrays")
    arrays = {f"parameter {i}": torch.from_numpy(np.asarray(p, np.float32)) for i, p in enumerate(params)
              if isinstance(p, np.ndarray) and np.issubdtype(p.dtype, np.number)}
    check_tensors(arrays, str(path))  # finite, and within the parameter cap, before a layer is built
    legacy_algo = _algo(path, data)
    policy_class = getattr(data.get("policy"), "__name__", "") or ""
    if "Cnn" in policy_class or "Lstm" in policy_class:  # LstmPolicy, LnLstmPolicy, CnnLstmPolicy
        raise QuarlError(f"{path}: policy {policy_class} is not supported: only MLP policies")
    obs_space = _space(data.get("observation_space"), "observation space", path)
    act_space = _space(data.get("action_space"), "action space", path)
    if data.get("normalize_observations"):
        raise QuarlError(f"{path}: DDPG's in-graph observation normalization is not supported")
    network, head = build_network(legacy_algo, params, obs_space, act_space, path)
    algo = ALGOS[legacy_algo]
    policy = Policy(network=network, observation_space=obs_space, action_space=act_space, head=head, algo=algo)
    stats = path.parent / path.stem / "obs_rms.pkl"
    if stats.exists():  # rl-baselines-zoo saved VecNormalize's statistics beside the model
        mean, var = load_running_mean_std(stats, tuple(obs_space.shape or ()))
        policy.obs_normalizer = ObsNormalizer(mean, var)
    log.info("loaded legacy %s policy (%s) from %s", legacy_algo, policy_class or "?", path)
    return policy, algo, path.stem


def detect(path: Path) -> bool:
    return is_legacy_pickle(path)


def load(path: Path, trust_pickle: bool = False) -> Checkpoint:
    """The legacy pickle's checkpoint, in the env its file name gives (its inert reader
    needs no ``trust_pickle``)."""
    policy, algo, env_id = load_legacy(path)
    return Checkpoint(policy=policy, env_spec=EnvSpec(env_id=current_env_id(env_id)), algo=algo, path=path)
