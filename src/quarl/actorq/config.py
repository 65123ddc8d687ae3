"""ActorQConfig: one distributed actor-learner run, validated when built: the fields every
algorithm shares, and the chosen algorithm's own options (its registry entry's dataclass,
:mod:`quarl.actorq.algorithms`). Saved as one flat JSON object with a version
(:meth:`ActorQConfig.to_json`); older flat files, which held every algorithm's options, still
load (:meth:`ActorQConfig.from_json`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, get_type_hints

from quarl.actorq.actor_precisions import actor_precisions
from quarl.actorq.algorithms import get_algorithm
from quarl.actorq.options import AlgorithmOptions
from quarl.core import validate
from quarl.core.errors import QuarlError
from quarl.core.validate import digits

MAX_ACTORS = 4096
"""Actors of one run at most (each takes a CPU of the cluster; Ray would not start with a
million slots)."""
MAX_LOCAL_ACTORS = 64
"""Actors in one process (--local): each holds an env and a model."""
WIRE_BITS = (32, 16, 8, 7, 6, 5, 4, 3, 2)
CONFIG_VERSION = 2
"""The version of the flat JSON a config is saved as: 2 holds the shared fields and the
chosen algorithm's options; 1 (no ``config_version`` key) held every algorithm's options."""
VERSION_KEY = "config_version"

if TYPE_CHECKING:
    from pydantic import JsonValue

ConfigValue: TypeAlias = "JsonValue | tuple[JsonValue, ...]"
"""A value of a saved config: a JSON value, or a field's tuple (layer widths) before it was
written as a JSON list."""
ConfigJSON: TypeAlias = "dict[str, ConfigValue]"
"""A config as :meth:`ActorQConfig.to_json` saves it (a flat JSON object), or as read back."""


@dataclass(frozen=True)
class ActorQConfig:
    """Everything a run needs; the same object drives the local and the Ray run."""

    env_id: str
    algo: str = "dqn"
    """A registered algorithm (:func:`quarl.actorq.algorithms.algorithm_names`): dqn (discrete
    actions: double DQN), d4pg (continuous: distributional DDPG), impala (either: an
    actor-critic learned on the actors' unrolls with V-trace, on-policy) or ppo."""
    options: AlgorithmOptions = AlgorithmOptions()
    """The algorithm's own options (its entry's dataclass); left out: its defaults."""
    actors: int = 2
    actor_precision: str = "int8"
    """What actors compute in: fp32 / fp16 / bf16 (PyTorch), int8 (ONNX Runtime MatMulInteger)
    or int4 (ONNX Runtime MatMulNBits, 4-bit block-wise weights); any registered precision
    an actor can run (:func:`quarl.actorq.actor_precisions.actor_precisions`)."""
    wire_bits: int = 32
    """Width of the weights sent to fp32/fp16/bf16 actors (32: raw fp32, 16: fp16,
    8..2: per-tensor affine integers); int8 actors receive a ready int8 model."""
    update_period: int = 300
    """Actor env steps between two (synchronous) pulls of the latest weights."""
    push_period: int = 100
    """Learner steps between two (asynchronous) weight pushes."""
    policy_layers: tuple[int, ...] = (2048, 2048, 2048)
    """Hidden widths of the policy network (what the actors run)."""
    gamma: float = 0.99
    batch_size: int = 256
    learning_rate: float = 1e-4
    target_reward: float | None = None
    """Stop when the running mean (window 10) of evaluations reaches it; None: the env's
    reward threshold when it has one."""
    max_minutes: float = 10.0
    max_env_steps: int | None = None
    """Also stop once the actors have inserted this many env steps (None: no step budget):
    a run that ends on steps, not on a machine's speed."""
    eval_every_s: float = 10.0
    """Seconds between evaluations (when ``eval_every_steps`` is None)."""
    eval_every_steps: int | None = None
    """Evaluate every this many env steps instead (SB3's ``eval_freq``): the running mean's
    window then covers the same learning progress whatever the actors' speed, where a
    window in seconds adds the same delay to a fast and a slow fleet's time to reward."""
    eval_episodes: int = 5
    chunk_steps: int = 100
    """Env steps an actor runs per call before handing its transitions over."""
    checkpoint_every_s: float = 60.0
    checkpoint_replay: bool = False
    """Also checkpoint the replay contents (large; without them a resumed run refills
    replay to its ``min_replay`` before learning again)."""
    seed: int = 0
    out: Path = Path("results/actorq/run")
    local: bool = False
    """Run every piece in this process (tests, debugging) instead of on Ray."""
    address: str | None = None
    """Ray cluster to join; None starts a local Ray."""
    learner_device: str = "cpu"
    """Where the learner trains: cpu, or cuda / cuda:N (the paper's GPU learner)."""

    def __post_init__(self) -> None:
        for f in fields(self):  # NaN passes every comparison below; inf is no budget or rate
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise QuarlError(f"{f.name.replace('_', '-')}={value} must be a finite number")
        validate.seed(self.seed)
        algorithm = get_algorithm(self.algo)
        if type(self.options) is AlgorithmOptions:  # left out: the algorithm's defaults
            object.__setattr__(self, "options", algorithm.options())
        elif type(self.options) is not algorithm.options:
            raise QuarlError(f"options {type(self.options).__name__} are not --algo {self.algo}'s: it takes "
                             f"{algorithm.options.__name__}")
        clash = sorted(shared_fields() & {f.name for f in fields(self.options)})
        if clash:  # the saved JSON is flat
            raise TypeError(f"{algorithm.options.__name__}.{clash[0]} has the name of a shared ActorQConfig field")
        most = MAX_LOCAL_ACTORS if self.local else MAX_ACTORS
        if not isinstance(self.actors, int) or not 1 <= self.actors <= most:
            raise QuarlError(f"--actors {self.actors} must be in 1..{most}" + (" in one process (--local)" if self.local
                                                                              else " (one CPU of the cluster each)"))
        allowed = actor_precisions()
        if self.actor_precision not in allowed:
            raise QuarlError(f"unknown --actor-precision {self.actor_precision!r}: allowed {', '.join(allowed)}")
        if self.wire_bits not in WIRE_BITS:
            raise QuarlError(f"--wire-bits {self.wire_bits} is not supported: allowed {', '.join(map(str, WIRE_BITS))}")
        for name in ("update_period", "push_period", "batch_size", "eval_episodes", "chunk_steps"):
            if getattr(self, name) < 1:
                raise QuarlError(f"{name}={getattr(self, name)} must be at least 1")
        if not self.policy_layers or min(self.policy_layers) < 1:
            raise QuarlError(f"--policy-layers {self.policy_layers} must be positive widths, e.g. 2048,2048,2048")
        from quarl.core.limits import check_layer_sizes

        # priced before any is allocated (the learner holds the policy, its target and Adam's two moments)
        check_layer_sizes((1, *self.policy_layers, 1), f"--policy-layers {','.join(map(str, self.policy_layers))}")
        if not 0 < self.gamma <= 1:
            raise QuarlError(f"gamma={self.gamma} must be in (0, 1]")
        for name in ("learning_rate", "eval_every_s", "checkpoint_every_s"):
            if not getattr(self, name) > 0:
                raise QuarlError(f"{name}={getattr(self, name)} must be > 0")
        if self.eval_every_steps is not None and self.eval_every_steps < 1:
            raise QuarlError(f"--eval-freq {self.eval_every_steps} must be at least 1 (or unset: every "
                             "--eval-seconds)")
        if self.max_env_steps is not None and self.max_env_steps < 1:
            raise QuarlError(f"--max-env-steps {self.max_env_steps} must be at least 1 (or unset)")
        if not self.max_minutes > 0:
            raise QuarlError(f"--max-minutes {self.max_minutes} must be > 0")
        _check_device(self.learner_device)
        self.options.validate(self)

    @classmethod
    def flat(cls, env_id: str, algo: str = "dqn", **values: Any) -> ActorQConfig:
        """A config from flat values, as the saved JSON holds them: every shared field and the
        algorithm's own options by name (a name that is neither is refused in one line)."""
        options = get_algorithm(algo).options
        own = {f.name for f in fields(options)}
        shared = shared_fields()
        unknown = sorted(set(values) - own - shared)
        if unknown:
            flags = ", ".join(f"--{name.replace('_', '-')}" for name in sorted(own)) or "none"
            raise QuarlError(f"--{unknown[0].replace('_', '-')} is not an option of --algo {algo} (its own: {flags})")
        return cls(env_id, algo, options(**{k: v for k, v in values.items() if k in own}),
                   **{k: v for k, v in values.items() if k in shared})

    def with_values(self, **values: Any) -> ActorQConfig:
        """This config with some fields changed by name, shared or the algorithm's options
        (:func:`dataclasses.replace` changes shared ones only)."""
        current = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("env_id", "algo", "options")}
        current.update({f.name: getattr(self.options, f.name) for f in fields(self.options)})
        return ActorQConfig.flat(self.env_id, self.algo, **{**current, **values})

    def to_json(self) -> ConfigJSON:
        """One flat JSON object: the version, the shared fields and the algorithm's options."""
        out: ConfigJSON = {VERSION_KEY: CONFIG_VERSION}
        for f in fields(self):
            if f.name == "options":
                out.update({o.name: getattr(self.options, o.name) for o in fields(self.options)})
            else:
                out[f.name] = str(self.out) if f.name == "out" else getattr(self, f.name)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ActorQConfig:
        """The config :meth:`to_json` saved (or a version-1 file, every algorithm's options in
        it), validated as when it was built."""
        values: dict[str, ConfigValue | Path] = dict(current_json(data))
        values.pop(VERSION_KEY)
        algo = str(values.pop("algo", "dqn"))
        hints = {**get_type_hints(cls), **get_type_hints(get_algorithm(algo).options)}
        for name, value in values.items():
            if isinstance(value, list) and "tuple" in str(hints.get(name)):
                values[name] = tuple(value)
        out = values.get("out")
        if isinstance(out, (str, Path)):
            values["out"] = Path(out)
        elif "out" in values:
            raise QuarlError(f"a saved ActorQ config's out {out!r:.60} is not a folder")
        return cls.flat(str(values.pop("env_id")), algo, **values)  # current_json checked env_id is a string


def shared_fields() -> set[str]:
    """The fields every algorithm shares (the saved JSON's keys but the version and the options)."""
    return {f.name for f in fields(ActorQConfig)} - {"options"}


def current_json(data: Mapping[str, Any]) -> ConfigJSON:
    """A saved config as this version writes it: a version-1 file (no ``config_version``; it
    held every algorithm's options) keeps the shared fields and its algorithm's options only.
    A file of a newer version is refused in one line."""
    version = data.get(VERSION_KEY, 1)
    if not isinstance(version, int) or not 1 <= version <= CONFIG_VERSION:
        raise QuarlError(f"{VERSION_KEY} {version!r} is not one this quarl reads: allowed 1..{CONFIG_VERSION} "
                         "(a newer quarl wrote it)")
    if not isinstance(data.get("algo", "dqn"), str) or not isinstance(data.get("env_id"), str):
        raise QuarlError(f"a saved ActorQ config needs env_id and algo strings, got {data.get('env_id')!r} and "
                         f"{data.get('algo')!r}")
    keep = shared_fields() | {f.name for f in fields(get_algorithm(str(data.get("algo", "dqn"))).options)}
    values = {k: v for k, v in data.items() if k in keep or version > 1 and k != VERSION_KEY}
    return {VERSION_KEY: CONFIG_VERSION, **values}


def _check_device(device: str) -> None:
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (index and (kind == "cpu" or not digits(index))):
        raise QuarlError(f"--learner-device {device!r} is not a device: allowed cpu, cuda, cuda:N")
    if kind == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise QuarlError(f"--learner-device {device}: this machine has no CUDA GPU that PyTorch can use; "
                             "use --learner-device cpu")
        if index and int(index) >= torch.cuda.device_count():
            raise QuarlError(f"--learner-device {device}: only {torch.cuda.device_count()} CUDA device(s) here")
