"""The acting side of ActorQ: the parameter broadcaster and the actors.

Broadcaster: takes the learner's fp32 weights with a version, builds what actors load
(int8 actors: a ready ONNX Runtime int8 model; fp32 / fp16 / bf16 actors: the weights in
the wire format), serializes it once per version and serves the latest.

Actor loop (one process, one thread, its own env and seed)::

    while True:
        if steps_since_pull >= update_period: pull()     # loads only when the version moved
        action = policy(obs) + exploration               # gaussian sigma_i or epsilon_i
        obs', r, term, trunc = env.step(action)
        transitions += nstep.add(obs, action, r, obs', term, trunc)

Each call of :meth:`Actor.run` returns its n-step transitions and the time spent in
inference, env steps, pulls, deserialization and weight loading.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch

from quarl.actorq import wire
from quarl.actorq.actor_precisions import INT8_ACTOR_KEEP, onnx_mode
from quarl.actorq.config import ActorQConfig
from quarl.actorq.learners import policy_network
from quarl.actorq.options import ReplayOptions, UnrollOptions
from quarl.actorq.replay import Batch, NStep, Unroll, stack, stack_unrolls
from quarl.core.errors import QuarlError
from quarl.envs import EnvSpec, check_env_id, make_env
from quarl.policies.base import Policy, unscale_action
from quarl.quant.backends.torch_backend import TorchEngine
from quarl.quant.primitives import FLOAT_DTYPES

_ONNX_MAGIC = b"QONX"


@dataclass(frozen=True)
class EnvInfo:
    obs_dim: int
    act_dim: int
    """Number of actions (discrete) or action dimensions (continuous)."""
    discrete: bool
    observation_space: gym.spaces.Box
    action_space: gym.spaces.Space[Any]
    reward_threshold: float | None = None

    def to_env(self, action: np.ndarray) -> np.ndarray:
        """A continuous action in [-1, 1] (the policy's tanh range) -> the env's bounds
        (the core's scaling, :func:`quarl.policies.base.unscale_action`)."""
        return unscale_action(cast(gym.spaces.Box, self.action_space), action)

    def policy(self, network: torch.nn.Module) -> Policy:
        """``network`` (the learner's layout) as a core :class:`Policy` of this env."""
        return Policy(network, self.observation_space, self.action_space, "argmax" if self.discrete else "unscale")


def env_info(config: ActorQConfig) -> EnvInfo:
    """Check the env against the algorithm (one clear line when they do not fit)."""
    check_env_id(config.env_id)
    env = make_env(EnvSpec(config.env_id))
    obs, act = env.observation_space, env.action_space
    threshold = getattr(env.spec, "reward_threshold", None)
    env.close()
    if not isinstance(obs, gym.spaces.Box) or len(obs.shape) != 1:
        raise QuarlError(f"ActorQ needs flat vector observations; {config.env_id} gives {obs}")
    if not isinstance(act, (gym.spaces.Discrete, gym.spaces.Box)):
        raise QuarlError(f"ActorQ needs discrete or box actions; {config.env_id} has {act}")
    from quarl.actorq.algorithms import get_algorithm

    get_algorithm(config.algo).check_actions(isinstance(act, gym.spaces.Discrete), config.env_id, act)
    if isinstance(act, gym.spaces.Discrete):
        return EnvInfo(int(obs.shape[0]), int(act.n), True, obs, act, threshold)
    return EnvInfo(int(obs.shape[0]), int(np.prod(act.shape)), False, obs, act, threshold)


def make_network(config: ActorQConfig, info: EnvInfo) -> torch.nn.Sequential:
    from quarl.actorq.algorithms import get_algorithm

    continuous = not info.discrete and get_algorithm(config.algo).tanh_for_continuous
    return policy_network(config, info.obs_dim, info.act_dim, continuous)


def quantize_uint8(w: np.ndarray) -> tuple[np.ndarray, np.float32, np.uint8]:
    """Per-tensor asymmetric uint8, as ONNX Runtime's dynamic quantizer quantizes a weight
    (the range widened to include 0; tested equal to its output, bit for bit)."""
    rmin, rmax = min(float(w.min()), 0.0), max(float(w.max()), 0.0)
    scale = np.float32((rmax - rmin) / 255.0) if rmax > rmin else np.float32(1.0)
    zero_point = np.uint8(np.clip(np.round(-rmin / scale), 0, 255))
    return np.clip(np.round(w / scale) + zero_point, 0, 255).astype(np.uint8), scale, zero_point


def quantize_4bit_blocks(w: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A ``(K, N)`` weight as ONNX Runtime's MatMulNBits quantizer packs it (asymmetric 4-bit,
    ``block_size`` rows of a column per block): ``(packed, scales, zero_points)``, through the
    same C++ routine it calls (tested initializer for initializer against its output)."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits

    rows, cols = w.shape
    k_blocks = (rows + block_size - 1) // block_size
    padded = np.zeros((k_blocks * block_size, cols), np.float32)
    padded[:rows] = w
    packed = np.zeros((cols, k_blocks, (block_size + 1) // 2), np.uint8)
    zero_points = np.zeros((cols, (k_blocks + 1) // 2), np.uint8)
    scales = np.zeros((cols, k_blocks), np.float32)
    quantize_matmul_4bits(packed, padded, scales, zero_points, block_size, cols, rows, False)
    return packed, scales, zero_points


class ActorModelTemplate:
    """The int8 / int4 actors' model built once by ONNX Runtime's quantizer, then refilled
    for each new weight version: the graph never changes, only its weight initializers
    (quantized weights, scales, zero points, the fp32 layer and the biases). int8 (dynamic,
    ``NAME_quantized``): 0.42 s -> 0.009 s per version for a 3 x 1024 policy; int4
    (MatMulNBits, ``NAME_Q4``): 0.10-0.13 s -> 0.03 s; on the CPU the actors and the
    learner share."""

    def __init__(self, model: bytes) -> None:
        import onnx
        from onnx import helper

        self.model = onnx.load_from_string(model)
        self.initializers = {init.name: init for init in self.model.graph.initializer}
        self.block_sizes = {node.input[1]: int(helper.get_attribute_value(a)) for node in self.model.graph.node
                            if node.op_type == "MatMulNBits" for a in node.attribute if a.name == "block_size"}

    def _set(self, name: str, value: np.ndarray) -> None:
        from onnx import numpy_helper

        # 0-d stays 0-d
        self.initializers[name].CopyFrom(numpy_helper.from_array(np.require(value, requirements="C"), name))

    def fill(self, weights: dict[str, np.ndarray]) -> bytes:
        for name, value in weights.items():
            if f"{name}_quantized" in self.initializers:  # an int8 layer's weight, stored (in, out)
                q, scale, zero_point = quantize_uint8(value.T)
                self._set(f"{name}_quantized", q)
                self._set(f"{name}_scale", np.asarray(scale, np.float32))
                self._set(f"{name}_zero_point", np.asarray(zero_point, np.uint8))
            elif f"{name}_Q4" in self.initializers:  # an int4 layer's weight, packed from (in, out)
                packed, scales, zero_points = quantize_4bit_blocks(np.ascontiguousarray(value.T, np.float32),
                                                                   self.block_sizes[f"{name}_Q4"])
                self._set(f"{name}_Q4", packed)
                self._set(f"{name}_scales", scales)
                self._set(f"{name}_zero_points", zero_points)
            elif name in self.initializers:  # a bias, or the fp32 layer's weight (transposed in the export)
                stored = self.initializers[name]
                self._set(name, value.T if len(stored.dims) == 2 else value)
            else:
                raise QuarlError(f"the actor model has no initializer for {name!r}")
        serialized: bytes = self.model.SerializeToString()
        return serialized


class Broadcaster:
    """Serves the latest weights, built and serialized once per version."""

    def __init__(self, config: ActorQConfig, info: EnvInfo) -> None:
        self.config = config
        self.info = info
        self.version = -1
        self.payload: bytes | None = None
        self.stats: dict[str, float] = {}
        self.template: ActorModelTemplate | None = None
        self.mode = onnx_mode(config.actor_precision)
        """The ONNX Runtime mode int actors run (None: float actors, wire-format weights)."""

    def publish(self, version: int, weights: dict[str, np.ndarray]) -> dict[str, float]:
        started = time.perf_counter()
        if self.mode is not None:
            payload = self._onnx_model(self.mode, version, weights)
        else:
            payload = wire.encode(weights, version, self.config.wire_bits)
        self.version, self.payload = version, payload
        self.stats = {"build_s": time.perf_counter() - started, "bytes": float(len(payload)), "version": float(version)}
        return self.stats

    def _onnx_model(self, label: str, version: int, weights: dict[str, np.ndarray]) -> bytes:
        from quarl.quant.backends.onnxruntime import export_onnx
        from quarl.quant.modes import BuildRequest, get_mode

        if self.template is not None:
            return _ONNX_MAGIC + struct.pack("<q", version) + self.template.fill(weights)
        net = make_network(self.config, self.info)
        net.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
        request = BuildRequest(net.eval(), export_onnx(net.eval(), (self.info.obs_dim,)), None, keep=INT8_ACTOR_KEEP)
        mode = get_mode(label).runnable(net)  # its fallback on a CPU that cannot run it (inexact int8 kernels)
        model = mode.build(request)
        self.template = ActorModelTemplate(model)  # later versions refill this graph
        return _ONNX_MAGIC + struct.pack("<q", version) + model

    def get_stats(self) -> dict[str, float]:
        return dict(self.stats)

    def pull(self, have_version: int) -> bytes | None:
        """The latest payload, or None when the caller already has it."""
        return None if self.payload is None or self.version == have_version else self.payload


def payload_version(payload: bytes) -> int:
    if payload[:4] == _ONNX_MAGIC:
        return int(struct.unpack_from("<q", payload, 4)[0])
    return wire.version_of(payload)


Action = np.ndarray | np.integer[Any]
"""An actor's action: an index (discrete) or a vector in [-1, 1] (continuous)."""


class ActorPolicy:
    """The network an actor runs, at its compute precision."""

    def __init__(self, config: ActorQConfig, info: EnvInfo) -> None:
        self.config, self.info = config, info
        self.precision = config.actor_precision
        self.mode = onnx_mode(self.precision)
        self.network = None if self.mode is not None else make_network(config, info).eval()
        self.engine: Callable[[np.ndarray], np.ndarray] | None = None
        self.version = -1

    def load(self, payload: bytes) -> tuple[float, float]:
        """Install a broadcast payload; returns (deserialize seconds, load seconds)."""
        t0 = time.perf_counter()
        if payload[:4] == _ONNX_MAGIC:
            if self.mode is None:
                raise QuarlError("an ONNX model was broadcast to a float actor")
            from quarl.quant.backends.onnxruntime import OrtEngine

            version, model = struct.unpack_from("<q", payload, 4)[0], payload[12:]
            t1 = time.perf_counter()
            self.engine = OrtEngine(model, per_row=True)
        else:
            if self.network is None:
                raise QuarlError(f"wire-format weights were broadcast to an {self.precision} actor (it loads a model)")
            version, weights = wire.decode(payload)
            t1 = time.perf_counter()
            dtype = FLOAT_DTYPES[self.precision]
            self.network.float().load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
            self.network.to(dtype)
            self.engine = TorchEngine(self.network, dtype)
        self.version = version
        return t1 - t0, time.perf_counter() - t1

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        if self.engine is None:
            raise RuntimeError("the actor has no weights yet")
        return self.engine(obs)


@dataclass
class ActorTimes:
    """Seconds spent per part of the actor step (summed)."""

    inference: float = 0.0
    env: float = 0.0
    pull: float = 0.0
    deserialize: float = 0.0
    load: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


@dataclass
class ActorResult:
    index: int
    batch: Batch | Unroll | None
    """n-step transitions, or whole unrolls (the algorithm's ``unrolls``); None when none finished."""
    steps: int
    episode_returns: list[float]
    times: dict[str, float]
    version: int
    pulls: int = 0
    loads: int = 0
    wall_s: float = 0.0
    node: str = "local"
    """The Ray node id the actor ran on ("local" in this process)."""


class Actor:
    """One actor: its env (seed + index), its exploration, its quantized policy."""

    def __init__(self, config: ActorQConfig, info: EnvInfo, index: int, fetch: Callable[[int], bytes | None]) -> None:
        torch.set_num_threads(1)
        from quarl.actorq.algorithms import get_algorithm

        self.config, self.info, self.index = config, info, index
        self.unrolls = get_algorithm(config.algo).unrolls  # sample own policy, return unrolls (else explore, n-step)
        self.fetch = fetch
        self.policy = ActorPolicy(config, info)
        self.env = make_env(EnvSpec(config.env_id))
        self.rng = np.random.default_rng(config.seed + index)
        self.obs, _ = self.env.reset(seed=config.seed + index)
        if not self.unrolls:  # the entry's options are ReplayOptions (register_algorithm checks)
            options = ReplayOptions.of(config)
            self.nstep = NStep(options.n_step, config.gamma)
            self.exploration = options.exploration(index, config.actors)
        self.since_pull = config.update_period  # pull before the first step
        self.episode_return = 0.0

    def pull(self, times: ActorTimes, counts: dict[str, int]) -> None:
        t = time.perf_counter()
        payload = self.fetch(self.policy.version)
        times.pull += time.perf_counter() - t
        counts["pulls"] += 1
        if payload is not None:
            ds, ld = self.policy.load(payload)
            times.deserialize += ds
            times.load += ld
            counts["loads"] += 1
        self.since_pull = 0

    def act(self, obs: np.ndarray) -> Action:
        out = self.policy(obs[None].astype(np.float32))[0]
        if self.info.discrete:
            if self.rng.random() < self.exploration:
                return np.int64(self.rng.integers(self.info.act_dim))
            return np.int64(out.argmax())
        noisy: np.ndarray = np.clip(out + self.rng.normal(0.0, self.exploration, out.shape), -1.0, 1.0)
        return noisy.astype(np.float32)  # in [-1, 1]; scaled to the env's bounds on step

    def sample(self, obs: np.ndarray) -> tuple[Action, np.ndarray]:
        """impala: an action drawn from the actor's own policy mu (softmax of its logits, or a
        Gaussian around its mean), and the network output that defines mu."""
        out = self.policy(obs[None].astype(np.float32))[0]
        if self.info.discrete:
            logits = out.astype(np.float64)
            probs = np.exp(logits - logits.max())
            cumulative = np.cumsum(probs)
            action = min(int(np.searchsorted(cumulative, self.rng.random() * cumulative[-1], side="right")),
                         len(probs) - 1)
            return np.int64(action), out
        action = out + self.rng.normal(0.0, UnrollOptions.of(self.config).policy_sigma, out.shape)
        return action.astype(np.float32), out  # the env gets it clipped to [-1, 1], then scaled

    def run(self, steps: int) -> ActorResult:
        """``steps`` env steps: dqn / d4pg explore around the greedy action and return n-step
        transitions; impala samples its own policy mu and returns whole unrolls."""
        started = time.perf_counter()
        played = self._play_unrolls(steps) if self.unrolls else self._play_transitions(steps)
        batch, times, counts, returns, n = played
        return ActorResult(self.index, batch, n, returns, times.as_dict(), self.policy.version, counts["pulls"],
                           counts["loads"], time.perf_counter() - started)

    def _play_unrolls(self, steps: int) -> tuple[Unroll | None, ActorTimes, dict[str, int], list[float], int]:
        gamma, played = self.config.gamma, []

        def act(obs: np.ndarray) -> tuple[Action, Action, np.ndarray]:
            action, behaviour = self.sample(obs)
            env = action if self.info.discrete else self.info.to_env(np.clip(action, -1.0, 1.0))
            return action, env, behaviour

        def keep(obs: np.ndarray, action: Action, reward: float, next_obs: np.ndarray, terminated: bool,
                 truncated: bool, behaviour: Any) -> None:
            played.append((obs, action, reward, 0.0 if terminated else gamma,
                           0.0 if terminated or truncated else 1.0, next_obs, behaviour, self.policy.version))

        times, counts, returns, n = self._play(steps, act, keep)
        return stack_unrolls(played, UnrollOptions.of(self.config).unroll_length), times, counts, returns, n

    def _play_transitions(self, steps: int) -> tuple[Batch | None, ActorTimes, dict[str, int], list[float], int]:
        transitions: list[tuple[Any, ...]] = []

        def act(obs: np.ndarray) -> tuple[Action, Action, None]:
            action = self.act(obs)
            return action, action if self.info.discrete else self.info.to_env(np.asarray(action)), None

        def keep(obs: np.ndarray, action: Action, reward: float, next_obs: np.ndarray, terminated: bool,
                 truncated: bool, behaviour: Any) -> None:
            transitions.extend(self.nstep.add(obs, action, reward, next_obs, terminated, truncated))

        times, counts, returns, n = self._play(steps, act, keep)
        return (stack(transitions) if transitions else None), times, counts, returns, n

    def _play(self, steps: int, act: Callable[[np.ndarray], tuple[Action, Action, Any]],
              keep: Callable[..., None]) -> tuple[ActorTimes, dict[str, int], list[float], int]:
        """The actor loop: pulls every update period, ``act`` (action, env action, behaviour),
        the env step, ``keep`` what was played; returns the times, pull counts, finished
        episodes' returns and the steps played (0 until weights are published)."""
        times, counts = ActorTimes(), {"pulls": 0, "loads": 0}
        returns: list[float] = []
        played = 0
        for _ in range(steps):
            if self.since_pull >= self.config.update_period or self.policy.engine is None:
                self.pull(times, counts)
                if self.policy.engine is None:  # nothing published yet
                    break
            t = time.perf_counter()
            action, env_action, behaviour = act(self.obs)
            t2 = time.perf_counter()
            next_obs, reward, terminated, truncated, _ = self.env.step(env_action)
            times.inference += t2 - t
            times.env += time.perf_counter() - t2
            self.episode_return += float(reward)
            keep(self.obs, action, float(reward), next_obs, terminated, truncated, behaviour)
            played += 1
            self.since_pull += 1
            if terminated or truncated:
                returns.append(self.episode_return)
                self.episode_return = 0.0
                self.obs, _ = self.env.reset()
            else:
                self.obs = next_obs
        return times, counts, returns, played

    def close(self) -> None:
        self.env.close()
