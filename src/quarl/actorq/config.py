"""ActorQConfig: one distributed actor-learner run, validated when built."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from quarl.core.errors import QuarlError
from quarl.core.validate import digits
from quarl.core import validate
from quarl.core.limits import check_layer_sizes
from quarl.actorq.actor_precisions import actor_precisions

MAX_ACTORS = 4096
"""Actors of one run at most (each takes a CPU of the cluster; Ray would not start with a
million slots)."""
MAX_LOCAL_ACTORS = 64
"""Actors in one process (--local): each holds an env and a model."""
REPLAYS = ("uniform", "prioritized")
WIRE_BITS = (32, 16, 8, 7, 6, 5, 4, 3, 2)


@dataclass(frozen=True)
class ActorQConfig:
    """Everything a run needs; the same object drives the local and the Ray run."""

    env_id: str
    algo: str = "dqn"
    """dqn (discrete actions: double DQN), d4pg (continuous: distributional DDPG) or impala
    (either: an actor-critic learned on the actors' unrolls with V-trace, on-policy)."""
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
    critic_layers: tuple[int, ...] = (512, 512, 512)
    """D4PG critic (DQN has no critic)."""
    n_step: int = 3
    gamma: float = 0.99
    batch_size: int = 256
    learning_rate: float = 1e-4
    target_update_period: int = 100
    """Learner steps between hard target-network updates."""
    replay: str = "uniform"
    """uniform, or prioritized (proportional, Schaul et al. 2016)."""
    priority_exponent: float = 0.6
    """Prioritized replay's alpha: 0 samples uniformly, 1 in proportion to priority."""
    importance_exponent: float = 0.4
    """Prioritized replay's beta: how much importance weights undo the sampling bias."""
    replay_size: int = 1_000_000
    min_replay: int = 1_000
    """Transitions in replay before learning starts."""
    samples_per_insert: float = 32.0
    """Items sampled per item inserted (Reverb's SampleToInsertRatio)."""
    samples_per_insert_tolerance: float = 0.1
    """Allowed drift from that ratio, as a fraction of it times ``min_replay``."""
    max_exploration: float = 0.2
    """Actor i explores with sigma (d4pg) or epsilon (dqn) = max * (i + 1) / actors."""
    v_min: float = -150.0
    v_max: float = 150.0
    n_atoms: int = 51
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
    unroll_length: int = 20
    """impala: steps per unroll (the V-trace horizon); an actor's chunk is whole unrolls."""
    rho_bar: float = 1.0
    """impala: V-trace's clip on the importance ratio pi / mu in the targets and the policy gradient."""
    c_bar: float = 1.0
    """impala: V-trace's clip on the traces (how far a correction reaches back), at most rho_bar."""
    correction: bool = True
    """impala: False learns from the actors' unrolls as if they were the learner's own
    (ratios taken as 1: a plain n-step actor-critic), the ablation of V-trace."""
    entropy_cost: float = 0.01
    baseline_cost: float = 0.5
    policy_sigma: float = 0.3
    """impala and ppo, continuous actions: the Gaussian policy's standard deviation (fixed,
    in the policy's [-1, 1] action range); the network gives its mean."""
    clip_range: float = 0.2
    """ppo: the surrogate's clip on the ratio pi / mu (mu: the actors' quantized policy)."""
    gae_lambda: float = 0.95
    """ppo: GAE's lambda."""
    ppo_epochs: int = 4
    """ppo: passes over each batch of unrolls."""
    ppo_minibatches: int = 4
    """ppo: minibatches (of whole unrolls) per pass."""
    chunk_steps: int = 100
    """Env steps an actor runs per call before handing its transitions over."""
    checkpoint_every_s: float = 60.0
    checkpoint_replay: bool = False
    """Also checkpoint the replay contents (large; without them a resumed run refills
    replay to ``min_replay`` before learning again)."""
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
        from quarl.actorq.algorithms import get_algorithm

        algorithm = get_algorithm(self.algo)
        most = MAX_LOCAL_ACTORS if self.local else MAX_ACTORS
        if not isinstance(self.actors, int) or not 1 <= self.actors <= most:
            raise QuarlError(f"--actors {self.actors} must be in 1..{most}" + (" in one process (--local)" if self.local
                                                                              else " (one CPU of the cluster each)"))
        allowed = actor_precisions()
        if self.actor_precision not in allowed:
            raise QuarlError(f"unknown --actor-precision {self.actor_precision!r}: allowed {', '.join(allowed)}")
        if self.replay not in REPLAYS:
            raise QuarlError(f"unknown --replay {self.replay!r}: allowed {', '.join(REPLAYS)}")
        for name in ("priority_exponent", "importance_exponent"):
            if not 0 <= getattr(self, name) <= 1:
                raise QuarlError(f"{name}={getattr(self, name)} must be in [0, 1]")
        if self.wire_bits not in WIRE_BITS:
            raise QuarlError(f"--wire-bits {self.wire_bits} is not supported: allowed {', '.join(map(str, WIRE_BITS))}")
        for name in ("update_period", "push_period", "n_step", "batch_size", "target_update_period", "replay_size",
                     "min_replay", "eval_episodes", "chunk_steps", "n_atoms"):
            if getattr(self, name) < 1:
                raise QuarlError(f"{name}={getattr(self, name)} must be at least 1")
        if not self.policy_layers or min(self.policy_layers) < 1:
            raise QuarlError(f"--policy-layers {self.policy_layers} must be positive widths, e.g. 2048,2048,2048")
        # priced before any is allocated (the learner holds the policy, its target and Adam's two moments)
        check_layer_sizes((1, *self.policy_layers, 1), f"--policy-layers {','.join(map(str, self.policy_layers))}")
        check_layer_sizes((1, *self.critic_layers, 1), f"--critic-layers {','.join(map(str, self.critic_layers))}")
        if not 0 < self.gamma <= 1:
            raise QuarlError(f"gamma={self.gamma} must be in (0, 1]")
        for name in ("learning_rate", "eval_every_s", "checkpoint_every_s"):
            if not getattr(self, name) > 0:
                raise QuarlError(f"{name}={getattr(self, name)} must be > 0")
        if self.eval_every_steps is not None and self.eval_every_steps < 1:
            raise QuarlError(f"--eval-freq {self.eval_every_steps} must be at least 1 (or unset: every "
                             "--eval-seconds)")
        if not self.v_min < self.v_max:
            raise QuarlError(f"v_min={self.v_min} must be below v_max={self.v_max}")
        if self.samples_per_insert <= 0:
            raise QuarlError(f"samples_per_insert={self.samples_per_insert} must be > 0")
        if self.max_env_steps is not None and self.max_env_steps < 1:
            raise QuarlError(f"--max-env-steps {self.max_env_steps} must be at least 1 (or unset)")
        if not self.max_minutes > 0:
            raise QuarlError(f"--max-minutes {self.max_minutes} must be > 0")
        _check_device(self.learner_device)
        algorithm.validate(self)
        if self.min_replay > self.replay_size:
            raise QuarlError(f"min_replay={self.min_replay} exceeds replay_size={self.replay_size}")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["out"] = str(self.out)
        return out

    def exploration(self, actor_index: int) -> float:
        return self.max_exploration * (actor_index + 1) / self.actors


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
