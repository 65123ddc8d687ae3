"""A Policy: observation preprocessing -> network (nn.Module) -> action head.

The network is the part that gets quantized; preprocessing and the head are cheap
numpy code around it. ``act`` goes through an *engine* (see
:mod:`quarl.quant.backends`): a callable from a float32 batch to a float32 batch that
runs the network with some runtime at some precision.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast

import gymnasium as gym
import numpy as np
from torch import nn

from quarl.core.errors import QuarlError
from quarl.core.registry import Registry
from quarl.quant.backends.torch_backend import TorchEngine

if TYPE_CHECKING:  # the precisions' registry builds policies: only annotations name its summary here
    from quarl.quant.summary import QuantSummary

Engine = Callable[[np.ndarray], np.ndarray]


def unscale_action(space: gym.spaces.Box, action: np.ndarray) -> np.ndarray:
    """An action in [-1, 1] (a tanh output) mapped onto the space's bounds, as SB3 does."""
    return space.low + (0.5 * (action + 1.0)) * (space.high - space.low)


@dataclass(frozen=True)
class ObsNormalizer:
    """VecNormalize observation statistics (applied as Stable-Baselines3 does)."""

    mean: np.ndarray
    var: np.ndarray
    clip: float = 10.0
    epsilon: float = 1e-8

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        normalized: np.ndarray = np.clip((obs - self.mean) / np.sqrt(self.var + self.epsilon), -self.clip, self.clip)
        return normalized


GSDE_STREAM = 0x65D3
"""Tag of the per-episode gSDE matrix's noise stream, apart from the per-step streams."""


MATRIX_CACHE = 1024
"""gSDE matrices kept per StateNoise (envs playing side by side are at most 1024)."""


@dataclass(eq=False)
class StateNoise:
    """Noise whose scale depends on the state, as SB3 samples it: SAC / TQC's squashed
    Gaussian (a log-std layer on the actor's latent, clamped to [-20, 2]) and gSDE (the
    latent times a noise matrix drawn from N(0, std), one per episode as SB3 draws one per
    ``reset_noise``). Its network runs at fp32 for every precision: the acting network, what
    quantization changes and export writes, gives the mean alone, so a quantized policy
    samples around its own mean with fp32's spread."""

    kind: str
    """``squashed_gaussian`` (SAC / TQC / CrossQ) or ``gsde``."""
    network: nn.Module
    """Preprocessed observations -> log std per action (squashed_gaussian) or gSDE's latent."""
    std: np.ndarray | None = None
    """gSDE's std matrix (latent, actions): the noise matrix is N(0, std) elementwise."""
    squash: bool = True
    """The noise is added before a tanh (the acting network ends in it: SAC, gSDE with
    ``squash_output``); else to the mean, clipped to the bounds (A2C / PPO with gSDE)."""

    def __call__(self, x: np.ndarray) -> np.ndarray:
        import torch

        with torch.inference_mode():
            out: np.ndarray = self.network(torch.from_numpy(np.ascontiguousarray(x, np.float32))).double().numpy()
        return out

    def matrix(self, episode_seed: int) -> np.ndarray:
        """gSDE's noise matrix of an episode, N(0, std) from the seed alone: drawn at its
        first step and kept for the rest (a few recent seeds, one per env playing)."""
        cache: dict[int, np.ndarray] = self.__dict__.setdefault("_matrices", {})
        mat = cache.get(episode_seed)
        if mat is None:
            std = np.asarray(self.std, np.float64)
            mat = np.random.default_rng([episode_seed, GSDE_STREAM]).standard_normal(std.shape) * std
            if len(cache) >= MATRIX_CACHE:
                cache.pop(next(iter(cache)))  # the oldest: its episode has ended
            cache[episode_seed] = mat
        return mat

    def digest(self) -> bytes:
        """What decides the noise (for fingerprints)."""
        parts = [self.kind.encode(), repr(self.network).encode(), str(self.squash).encode()]
        parts += [t.detach().cpu().contiguous().numpy().tobytes() for t in self.network.state_dict().values()]
        if self.std is not None:
            parts.append(np.asarray(self.std, np.float64).tobytes())
        return b"|".join(parts)


def _box(policy: Policy) -> gym.spaces.Box:
    """The Box a continuous head acts in (checked against the env when the policy is made)."""
    return cast(gym.spaces.Box, policy.action_space)


def action_nvec(space: gym.spaces.Space[Any]) -> np.ndarray:
    """Each sub-action's number of choices of a MultiDiscrete space (the segments of its logits)."""
    return np.asarray(cast(gym.spaces.MultiDiscrete, space).nvec, np.int64).reshape(-1)


def _segments(policy: Policy, out: np.ndarray) -> list[np.ndarray]:
    """A MultiDiscrete head's logits, one (batch, n_i) block per sub-action."""
    return np.split(np.asarray(out), np.cumsum(action_nvec(policy.action_space))[:-1], axis=1)


def _multi_argmax(policy: Policy, out: np.ndarray) -> np.ndarray:
    shape = cast(gym.spaces.MultiDiscrete, policy.action_space).shape
    actions = np.stack([block.argmax(axis=1) for block in _segments(policy, out)], axis=1)
    return actions.reshape(len(actions), *shape)


HEADS: Registry[Callable[[Policy, np.ndarray], np.ndarray]] = Registry("action head", {
    # discrete: argmax of logits / Q-values
    "argmax": lambda policy, out: out.argmax(axis=-1),
    # QR-DQN: argmax of the mean over quantiles (its output is laid out as (quantile, action))
    "quantile_argmax": lambda policy, out: out.reshape(out.shape[0], policy.n_quantiles, -1).mean(1).argmax(-1),
    # MultiDiscrete: one categorical per sub-action, the logits laid end to end (A2C / PPO)
    "multi_argmax": _multi_argmax,
    # MultiBinary: one Bernoulli per bit; SB3's mode rounds the probability (0.5 rounds to 0)
    "bernoulli": lambda policy, out: (np.asarray(out) > 0).astype(np.int8).reshape(
        len(out), *cast(gym.spaces.MultiBinary, policy.action_space).shape),
    # continuous, the network gives the mean action: clipped to the bounds (A2C / PPO)
    "clip": lambda policy, out: np.clip(out, _box(policy).low, _box(policy).high),
    # continuous, the network ends in tanh: [-1, 1] mapped onto the bounds (SAC, TD3, DDPG, TQC)
    "unscale": lambda policy, out: unscale_action(_box(policy), out),
})
"""Action heads by name: network output (batch) -> env actions. A new head is one
``HEADS.register(name, head)``."""


class PolicyMeta(TypedDict, total=False):
    """What a policy carries besides its network (:attr:`Policy.meta`)."""

    quant: QuantSummary
    """What quantization did: a real int mode's summary (mode, fp32 layers, agreement with
    fp32, every mode tried); tables and export sidecars read it."""
    acting: Literal["sampled", "greedy"]
    """How an export was judged and is meant to act (its sidecar's ``acting``)."""
    exploration_rate: float
    """A Q-head's epsilon when it samples (SB3's ``predict(deterministic=False)``)."""
    log_std: list[float]
    """A diagonal Gaussian head's state-independent log standard deviations."""


@dataclass
class Policy:
    """A deterministic policy: ``act(obs_batch) -> action_batch``."""

    network: nn.Module
    """Preprocessed float32 observations -> logits / Q-values / actions in [-1, 1]."""
    observation_space: gym.spaces.Space[Any]
    action_space: gym.spaces.Space[Any]
    head: str
    """One of :data:`HEADS`."""
    algo: str = "unknown"
    obs_normalizer: ObsNormalizer | None = None
    scale_images: bool = False
    """Divide observations by 255 (SB3 normalize_images for image spaces)."""
    n_quantiles: int = 0
    precision: str = "fp32"
    """Label of the precision the engine runs at (set by quantize)."""
    engine: Engine | None = field(default=None, repr=False)
    """Runs the network; ``None`` at construction means plain PyTorch fp32."""
    meta: PolicyMeta = field(default_factory=lambda: PolicyMeta())
    """What quantization did (``"quant"``), how an export acts, a sampling head's parameters."""
    stochastic: bool = False
    """Evaluation samples actions as SB3's ``predict(deterministic=False)`` does (see
    :func:`sample_actions`) instead of acting greedily."""
    noise: StateNoise | None = field(default=None, repr=False)
    """A state-dependent noise head (SAC / TQC, gSDE): what sampling adds to the mean."""
    home_env: object = field(default=None, repr=False, compare=False)
    """The env this policy came with where it is known (a :class:`quarl.envs.EnvSpec` from
    its zoo folder or model object): the API's env when none is given. Quantized copies
    keep it."""

    def __post_init__(self) -> None:
        HEADS.lookup(self.head)  # one line naming the heads allowed
        self.network.eval()
        self.network.requires_grad_(False)
        if self.engine is None:
            self.engine = TorchEngine(self.network)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.observation_space.shape or ())

    def preprocess(self, obs: np.ndarray) -> np.ndarray:
        """Raw env observations (batch) -> float32 network input."""
        x = np.asarray(obs)
        if self.obs_normalizer is not None:
            x = self.obs_normalizer(x)
        x = x.astype(np.float32, copy=False)
        if self.scale_images:
            x = x / np.float32(255.0)
        return x

    @property
    def runs(self) -> Engine:
        """The engine (set in ``__post_init__``, never None after it)."""
        assert self.engine is not None
        return self.engine

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Network output for a preprocessed float32 batch, through the engine."""
        return self.runs(x)

    def postprocess(self, out: np.ndarray) -> np.ndarray:
        """Network output -> env actions (batch), through the policy's :data:`HEADS` entry."""
        return HEADS[self.head](self, out)

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Deterministic actions for a batch of raw observations."""
        return self.postprocess(self.forward(self.preprocess(obs)))

    def sample_rows(self, x: np.ndarray, keys: Sequence[tuple[int, int]]) -> np.ndarray:
        """Sampled actions for a preprocessed batch (:func:`sample_actions`), each row's
        network output as computed alone."""
        engine: Any = self.runs  # an engine may batch rows (rows / argmax_rows); duck-typed
        out = engine.rows(x) if hasattr(engine, "rows") else np.concatenate(
            [self.forward(x[i : i + 1]) for i in range(len(x))])
        return sample_actions(self, out, keys, x)

    def act_rows(self, x: np.ndarray) -> np.ndarray:
        """Actions for a preprocessed batch, each row's equal to what the policy does with
        that observation alone (batch 1, as deployed), at batch speed where the engine can
        show it gives the same bits (:mod:`quarl.quant.backends.batching`)."""
        engine: Any = self.runs  # an engine may batch rows (rows / argmax_rows); duck-typed
        if self.head == "argmax" and hasattr(engine, "argmax_rows"):
            top: np.ndarray | None = engine.argmax_rows(x)
            if top is not None:
                return top
        if hasattr(engine, "rows"):
            return self.postprocess(engine.rows(x))
        return self.postprocess(np.concatenate([self.forward(x[i : i + 1]) for i in range(len(x))]))

    def predict(self, observation: np.ndarray, state: Any = None, episode_start: Any = None,
                deterministic: bool = True) -> tuple[np.ndarray, None]:
        """Stable-Baselines3's ``predict``: ``(actions, None)`` for one observation or a batch
        (each row computed alone, as a deployed policy acts), so code written for an SB3
        model runs a loaded or quantized quarl policy unchanged. ``deterministic=False``
        samples as SB3 does (:func:`sample_actions`, fresh noise per call) where the head
        can; a Gaussian head is refused in one line."""
        obs = np.asarray(observation)
        single = obs.shape == tuple(self.observation_space.shape or ())
        batch = obs[None] if single else obs
        if deterministic:
            actions = self.act_rows(self.preprocess(batch))
        else:
            reason = stochastic_support(self)
            if reason is not None:
                raise QuarlError(reason)
            # one noise stream per policy object, fresh steps per call: categorical and Gaussian
            # noise is new at every call, a gSDE matrix stays, as SB3 keeps it until reset_noise
            rng = np.random.default_rng()
            stream = self.__dict__.setdefault("_predict_stream", int(rng.integers(0, 2**62)))
            steps = rng.integers(0, 2**62, size=len(batch))
            actions = self.sample_rows(self.preprocess(batch), [(stream, int(s)) for s in steps])
        return (actions[0] if single else actions), None

    def greedy(self) -> Policy:
        """This policy acting greedily: itself, or for a sampling policy one greedy copy kept
        with it (calibration episodes know a policy by identity, so every cell of a run must
        hand them the same copy)."""
        if not self.stochastic:
            return self
        copy_ = self.__dict__.get("_greedy")
        if copy_ is None:
            copy_ = self.__dict__["_greedy"] = replace(self, stochastic=False)
        return cast(Policy, copy_)

    @property
    def categorical(self) -> bool:
        """Whether the network outputs a categorical distribution's logits (one categorical:
        a MultiDiscrete or MultiBinary head's logits are several distributions)."""
        return self.head == "argmax" and self.algo in LOGIT_ALGOS

    def with_network(self, network: nn.Module, precision: str, engine: Engine) -> Policy:
        """A copy that runs ``network`` through ``engine`` (used by quantize)."""
        return replace(self, network=network, precision=precision, engine=engine, meta=self.meta.copy())

    def size_bytes(self) -> int:
        """What the acting model weighs: the engine's serialized model (ONNX) when it has
        one, else the network's tensors."""
        model = getattr(self.engine, "model", None)
        if isinstance(model, bytes):
            return len(model)
        return sum(t.numel() * t.element_size() for t in self.network.state_dict().values())

    def fingerprint(self) -> str:
        """SHA-256 of everything that decides this policy's actions: the network's
        structure and every tensor, the observation normalization, the image scaling, the
        head and the action bounds. Stored results are keyed on it, so a checkpoint
        replaced in place, or another policy in the same output folder, is evaluated anew."""
        h = hashlib.sha256()
        h.update(repr(self.network).encode())
        for name, tensor in self.network.state_dict().items():
            h.update(name.encode())
            h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        norm = self.obs_normalizer
        if norm is not None:
            for arr in (norm.mean, norm.var, np.float64(norm.clip), np.float64(norm.epsilon)):
                h.update(np.asarray(arr, np.float64).tobytes())
        h.update(repr((self.head, self.scale_images, self.n_quantiles, self.precision, self.action_space,
                       self.observation_space)).encode())
        if self.stochastic:  # only then: every greedy policy's content, and so its stored results, stay as they were
            h.update(f"stochastic {self.meta.get('exploration_rate', '')} {self.meta.get('log_std', '')}".encode())
            if self.noise is not None:
                h.update(self.noise.digest())
        if isinstance(self.action_space, gym.spaces.Box):  # repr abbreviates long bounds
            h.update(np.asarray(self.action_space.low, np.float64).tobytes())
            h.update(np.asarray(self.action_space.high, np.float64).tobytes())
        return h.hexdigest()

    def clone_network(self) -> nn.Module:
        return copy.deepcopy(self.network)

    def check_env(self, env: gym.Env) -> None:
        """Raise a clear error when ``env``'s spaces do not fit this policy."""
        name = getattr(env.spec, "id", None) or type(env).__name__
        obs_shape = tuple(env.observation_space.shape or ())
        if obs_shape != self.input_shape:
            raise QuarlError(
                f"env {name!r} gives observations of shape {obs_shape} but the policy expects "
                f"{self.input_shape}: pick the env it was trained on"
            )
        want, got = self.action_space, env.action_space
        if isinstance(want, gym.spaces.Discrete):
            if not isinstance(got, gym.spaces.Discrete) or got.n != want.n:
                raise QuarlError(f"env {name!r} has action space {got} but the policy acts in {want}")
        elif isinstance(want, gym.spaces.Box):
            if not isinstance(got, gym.spaces.Box) or got.shape != want.shape:
                raise QuarlError(f"env {name!r} has action space {got} but the policy acts in {want}")
        elif isinstance(want, (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
            if type(got) is not type(want) or got != want:
                raise QuarlError(f"env {name!r} has action space {got} but the policy acts in {want}")


def check_outputs(policy: Policy, what: str) -> None:
    """One line when ``policy``'s network does not fit its spaces: it must take an
    observation of its input shape and give, for an all-zeros and an all-ones observation,
    as many outputs as its action space needs (actions, or actions x quantiles), all
    finite. A crafted export whose head is 1 wide for 2 actions, or that divides by zero,
    would otherwise be evaluated as if it were a policy."""
    space = policy.action_space
    want = (int(cast(gym.spaces.Discrete, space).n) * max(policy.n_quantiles, 1)
            if isinstance(space, gym.spaces.Discrete) else int(action_nvec(space).sum())
            if isinstance(space, gym.spaces.MultiDiscrete) else int(np.prod(space.shape or ())))
    for fill in (0.0, 1.0):
        x = np.full((1, *policy.input_shape), fill, np.float32)
        try:
            out = np.asarray(policy.forward(x))
        except Exception as exc:  # torch's RuntimeError, ONNX Runtime's own types (an allocation that fails)
            raise QuarlError(f"{what} does not run on an observation of shape {policy.input_shape}: "
                             f"{(str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]}") from None
        if out.ndim != 2 or out.shape != (1, want):
            raise QuarlError(f"{what} gives outputs of shape {tuple(out.shape[1:])} for one observation but its action "
                             f"space {space} needs {want}")
        if not np.isfinite(out).all():
            raise QuarlError(f"{what} outputs NaN or inf for an all-{int(fill)} observation: not a policy, refused")


LOGIT_ALGOS = ("a2c", "ppo", "trpo", "ppo_mask")
"""Discrete actor-critics: the network's output is a categorical distribution's logits."""
Q_VALUE_ALGOS = ("dqn", "qrdqn")


DETERMINISTIC_ALGOS = ("td3", "ddpg", "ars")
"""Algorithms whose SB3 ``predict`` ignores ``deterministic``: sampling is acting greedily
(TD3 / DDPG explore with action noise in training only; ARS is a deterministic search)."""


def stochastic_support(policy: Policy) -> str | None:
    """Why ``policy`` cannot be evaluated stochastically here (None: it can)."""
    if policy.head in ("argmax", "multi_argmax", "bernoulli") and policy.algo in LOGIT_ALGOS:
        return None
    if policy.head in ("argmax", "quantile_argmax") and policy.algo in Q_VALUE_ALGOS:
        return None
    if policy.head == "argmax" or policy.algo in DETERMINISTIC_ALGOS:
        return None
    if policy.noise is not None:
        return None
    if policy.head == "clip" and "log_std" in policy.meta:
        return None
    if "acting" in policy.meta:  # set by loading an export (its sidecar's acting), never by a checkpoint
        return (f"{policy.algo}'s continuous actions cannot be sampled from an exported model (it holds the mean "
                "alone, not the noise): evaluate the checkpoint it came from with --stochastic, or drop --stochastic")
    return (f"{policy.algo}'s continuous actions cannot be sampled here (its noise layers were not found in the "
            "checkpoint): drop --stochastic")


def sample_actions(policy: Policy, out: np.ndarray, keys: Sequence[tuple[int, int]],
                   x: np.ndarray | None = None) -> np.ndarray:
    """Actions sampled from the network outputs ``out`` (one row per env) as SB3's
    ``predict(deterministic=False)`` samples them: a categorical head by the Gumbel-max
    trick, a Q-head epsilon-greedy with its saved ``exploration_rate``, a diagonal Gaussian
    (``clip`` head) as mean + std * N(0, 1) clipped to the bounds, a squashed Gaussian or
    gSDE head (:class:`StateNoise`, which needs the preprocessed inputs ``x``) as SB3's
    distributions do. Row j's noise comes from ``keys[j]`` = (episode seed, step) alone (a
    gSDE matrix from the episode seed), so a precision and fp32 playing one seed draw the
    same noise at the same step (common random numbers): their episodes part only where
    their action distributions really differ."""
    greedy = policy.postprocess(out)
    if policy.algo in DETERMINISTIC_ALGOS:
        return greedy
    if policy.noise is not None:
        if x is None:
            raise ValueError("a state-dependent noise head samples from the inputs: pass x")
        return _state_noise_sample(policy, policy.noise, out, keys, x)
    if policy.head == "clip" and "log_std" in policy.meta:  # mean + std * N(0, 1), clipped to the bounds as SB3 does
        box = _box(policy)
        std = np.exp(np.asarray(policy.meta["log_std"], np.float64)).reshape(box.shape)
        noise = np.stack([np.random.default_rng(list(key)).standard_normal(std.shape) for key in keys])
        return np.clip(np.asarray(out, np.float64) + std * noise, box.low, box.high).astype(np.float32)
    if policy.algo in Q_VALUE_ALGOS:
        rate = float(policy.meta.get("exploration_rate", 0.0))
        n = int(cast(gym.spaces.Discrete, policy.action_space).n)
        for j, key in enumerate(keys):
            u, pick = np.random.default_rng(list(key)).random(2)
            if u < rate:
                greedy[j] = min(int(pick * n), n - 1)
        return greedy
    if policy.algo not in LOGIT_ALGOS:
        return greedy
    if policy.head == "bernoulli":  # bit i is 1 when u_i < sigmoid(logit_i)
        logits = np.asarray(out, np.float64)
        u = np.stack([np.random.default_rng(list(key)).random(logits.shape[1]) for key in keys])
        return (u < 1.0 / (1.0 + np.exp(-logits))).astype(np.int8).reshape(greedy.shape)
    if policy.head == "multi_argmax":  # Gumbel-max per sub-action, from one draw per row
        logits = np.asarray(out, np.float64)
        gumbel = np.stack([np.random.default_rng(list(key)).gumbel(size=logits.shape[1]) for key in keys])
        return _multi_argmax(policy, logits + gumbel)
    logits = np.asarray(out, np.float64)
    gumbel = np.stack([np.random.default_rng(list(key)).gumbel(size=logits.shape[1]) for key in keys])
    chosen: np.ndarray = (logits + gumbel).argmax(axis=1)
    return chosen


TANH_EDGE = 1.0 - 1e-7
"""A tanh output is inverted within +-this: beyond it float32 holds no pre-tanh mean (|mean|
> ~8), and any noise SB3 draws leaves the action saturated there too."""


def _state_noise_sample(policy: Policy, noise: StateNoise, out: np.ndarray, keys: Sequence[tuple[int, int]],
                        x: np.ndarray) -> np.ndarray:
    """SAC's tanh(mean + exp(log_std) * N(0, 1)) or gSDE's mean + latent @ N(0, std)
    (tanh-squashed where the head is), then the head maps to the bounds as SB3 does."""
    out64 = np.asarray(out, np.float64)
    mean = np.arctanh(np.clip(out64, -TANH_EDGE, TANH_EDGE)) if noise.squash else out64
    z = noise(x)
    if noise.kind == "squashed_gaussian":
        eps = np.stack([np.random.default_rng(list(key)).standard_normal(mean.shape[1]) for key in keys])
        gaussian = mean + np.exp(np.clip(z, -20.0, 2.0)) * eps
    else:
        mats = np.stack([noise.matrix(key[0]) for key in keys])
        gaussian = mean + np.einsum("bl,bla->ba", z, mats)
    actions = np.tanh(gaussian) if noise.squash else gaussian
    return policy.postprocess(actions.astype(np.float32))

