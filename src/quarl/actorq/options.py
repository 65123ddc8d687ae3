"""The options of ActorQ's algorithms: each registry entry (:mod:`quarl.actorq.algorithms`)
owns a frozen dataclass of the fields only it reads, each with a default and a docstring
under it, and their checks. :class:`ReplayOptions` is what actors returning n-step
transitions and a replay read (dqn, d4pg), :class:`UnrollOptions` what actors returning
unrolls and a queue read (impala, ppo); an algorithm's own class extends one. Light (no
torch): ``quarl actorq run --help`` makes its options from these classes."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Self

from quarl.core.errors import QuarlError

if TYPE_CHECKING:
    from quarl.actorq.config import ActorQConfig

REPLAYS = ("uniform", "prioritized")


@dataclass(frozen=True)
class AlgorithmOptions:
    """An algorithm's own options: a subclass declares each field with its default and a
    docstring under it (CleanRL's style: the docstring is the option's ``--help``; the option
    is ``--field-name``, a bool True by default ``--no-field-name`` too). The base has none.

    A field's name is its key in the run's flat JSON (``summary.json``, ``checkpoint.pt``), so
    no field may share a name with :class:`~quarl.actorq.config.ActorQConfig`'s own."""

    __pydantic_config__ = {"use_attribute_docstrings": True}
    """pydantic reads each field's docstring as its description (the CLI's help,
    :func:`quarl.cli.actorq_options.field_docs`); a plain dict, so this module imports no pydantic."""

    def validate(self, config: ActorQConfig) -> None:
        """Checks of these options (one line each), ``config`` for the ones that need a shared
        field too; a subclass extends its base's."""
        for f in fields(self):  # NaN passes every comparison; inf is no setting
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise QuarlError(f"{f.name.replace('_', '-')}={value} must be a finite number")

    @classmethod
    def of(cls, config: ActorQConfig) -> Self:
        """``config``'s options as this class (an entry's learner reads its own fields through
        it); a config of another algorithm is a programming error."""
        options = config.options
        if not isinstance(options, cls):
            raise TypeError(f"--algo {config.algo}'s options are {type(options).__name__}, not {cls.__name__}")
        return options

    def run_name(self, algo: str) -> str:
        """The algorithm's part of a default run folder's name (an ablation adds to it)."""
        return algo


def _at_least_one(options: AlgorithmOptions, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(options, name) < 1:
            raise QuarlError(f"{name}={getattr(options, name)} must be at least 1")


def _layers(widths: tuple[int, ...], name: str, outputs: int = 1) -> None:
    """Hidden ``widths`` priced with the layer of ``outputs`` after them, before any is allocated."""
    from quarl.core.limits import check_layer_sizes  # torch: only when a config is built

    flag = f"--{name.replace('_', '-')}"
    if not widths or min(widths) < 1:
        raise QuarlError(f"{flag} {widths} must be positive widths, e.g. 512,512,512")
    check_layer_sizes((1, *widths, outputs), f"{flag} {','.join(map(str, widths))}"
                      + (f" with {outputs:,} outputs" if outputs > 1 else ""))


@dataclass(frozen=True)
class ReplayOptions(AlgorithmOptions):
    """What actors that explore around the greedy action and return n-step transitions, and
    a learner sampling them from a replay, read (dqn's and d4pg's)."""

    n_step: int = 3
    """Steps of the n-step returns the actors hand over."""
    target_update_period: int = 100
    """Learner steps between hard target-network updates."""
    max_exploration: float = 0.2
    """Actor i explores with sigma (continuous actions) or epsilon (discrete) = max * (i + 1) / actors."""
    replay: str = "uniform"
    """uniform, or prioritized (proportional, Schaul et al. 2016)."""
    priority_exponent: float = 0.6
    """Prioritized replay's alpha: 0 samples uniformly, 1 in proportion to priority."""
    importance_exponent: float = 0.4
    """Prioritized replay's beta: how much importance weights undo the sampling bias."""
    replay_size: int = 1_000_000
    """Transitions the replay holds."""
    min_replay: int = 1_000
    """Transitions in replay before learning starts."""
    samples_per_insert: float = 32.0
    """Rate limiter: items sampled per item inserted (Reverb's SampleToInsertRatio)."""
    samples_per_insert_tolerance: float = 0.1
    """Rate limiter: allowed drift from that ratio, as a fraction of it times min-replay."""

    def validate(self, config: ActorQConfig) -> None:
        super().validate(config)
        if self.replay not in REPLAYS:
            raise QuarlError(f"unknown --replay {self.replay!r}: allowed {', '.join(REPLAYS)}")
        for name in ("priority_exponent", "importance_exponent"):
            if not 0 <= getattr(self, name) <= 1:
                raise QuarlError(f"{name}={getattr(self, name)} must be in [0, 1]")
        _at_least_one(self, ("n_step", "target_update_period", "replay_size", "min_replay"))
        if self.samples_per_insert <= 0:
            raise QuarlError(f"samples_per_insert={self.samples_per_insert} must be > 0")
        if self.min_replay > self.replay_size:
            raise QuarlError(f"min_replay={self.min_replay} exceeds replay_size={self.replay_size}")

    def exploration(self, actor_index: int, actors: int) -> float:
        """Actor ``actor_index``'s epsilon or sigma, of ``actors``."""
        return self.max_exploration * (actor_index + 1) / actors


@dataclass(frozen=True)
class DQNOptions(ReplayOptions):
    """dqn: double DQN on n-step returns; the replay's options and nothing more."""


MIN_ATOMS, MAX_ATOMS = 2, 10_000
"""The atoms a distributional critic may have (C51's and D4PG's: 51)."""


@dataclass(frozen=True)
class D4PGOptions(ReplayOptions):
    """d4pg: distributional DDPG, its critic a categorical distribution over fixed atoms."""

    critic_layers: tuple[int, ...] = (512, 512, 512)
    """Hidden widths of the distributional critic."""
    v_min: float = -150.0
    """The lowest atom of the critic's return distribution."""
    v_max: float = 150.0
    """The highest atom of the critic's return distribution."""
    n_atoms: int = 51
    """Atoms of the critic's return distribution."""

    def validate(self, config: ActorQConfig) -> None:
        super().validate(config)
        # one atom divides by zero in the projection; each atom is an output of the critic
        # (10^9 of them asked torch for 2 TB, a RuntimeError traceback)
        if not MIN_ATOMS <= self.n_atoms <= MAX_ATOMS:
            raise QuarlError(f"--n-atoms {self.n_atoms:,} must be in {MIN_ATOMS}..{MAX_ATOMS:,} (D4PG's is 51)")
        if not self.v_min < self.v_max:
            raise QuarlError(f"v_min={self.v_min} must be below v_max={self.v_max}")
        _layers(self.critic_layers, "critic_layers", self.n_atoms)


@dataclass(frozen=True)
class UnrollOptions(AlgorithmOptions):
    """What actors that sample their own policy and hand over whole unrolls, and an
    actor-critic learner on a queue of them, read (impala's and ppo's)."""

    unroll_length: int = 20
    """Steps per unroll (the V-trace / GAE horizon); an actor's chunk is whole unrolls."""
    policy_sigma: float = 0.3
    """Continuous actions: the Gaussian policy's standard deviation (fixed, in the policy's
    [-1, 1] action range); the network gives its mean."""
    entropy_cost: float = 0.01
    """Weight of the policy's entropy bonus."""
    baseline_cost: float = 0.5
    """Weight of the value loss."""
    critic_layers: tuple[int, ...] = (512, 512, 512)
    """Hidden widths of the value network."""

    def validate(self, config: ActorQConfig) -> None:
        super().validate(config)
        if self.unroll_length < 1 or config.chunk_steps % self.unroll_length:
            raise QuarlError(f"--unroll-length {self.unroll_length} must divide the actors' chunk of "
                             f"{config.chunk_steps} steps (e.g. 10, 20, 25, 50)")
        if not 0 < self.policy_sigma <= 2:
            raise QuarlError(f"policy_sigma={self.policy_sigma} must be in (0, 2]")
        if self.entropy_cost < 0 or self.baseline_cost <= 0:
            raise QuarlError(f"--entropy-cost {self.entropy_cost} must be >= 0 and baseline_cost="
                             f"{self.baseline_cost} > 0")
        _layers(self.critic_layers, "critic_layers")


@dataclass(frozen=True)
class IMPALAOptions(UnrollOptions):
    """impala: an actor-critic on the actors' unrolls with V-trace corrections."""

    rho_bar: float = 1.0
    """V-trace's clip on the importance ratio pi / mu in the targets and the policy gradient."""
    c_bar: float = 1.0
    """V-trace's clip on the traces (how far a correction reaches back), at most rho-bar."""
    correction: bool = True
    """--no-correction learns from the actors' unrolls as if they were the learner's own
    (ratios taken as 1: a plain n-step actor-critic), the ablation of V-trace."""

    def validate(self, config: ActorQConfig) -> None:
        super().validate(config)
        if not 0 < self.c_bar <= self.rho_bar:
            raise QuarlError(f"--c-bar {self.c_bar} and --rho-bar {self.rho_bar} must satisfy 0 < c-bar <= rho-bar")

    def run_name(self, algo: str) -> str:
        return algo if self.correction else f"{algo}-no-correction"
