"""The options of the run ``quarl actorq run`` and ``compare`` share, declared once:
:class:`RunSettings`, a frozen dataclass whose fields are the options (each an ``Annotated``
typer type, its default the field's), made into click parameters by typer itself
(:func:`quarl.cli.command.parameters_of`) and added by the commands' class after each
command's own (:class:`quarl.cli.actorq_options.ActorQCommand`). Each is the
:class:`~quarl.actorq.config.ActorQConfig` field of its name (or the one
:data:`quarl.actorq.launch.RENAMED` gives, or one of its ``NOT_CONFIG``), as
:func:`quarl.actorq.launch.prepare` takes them. ``--gym-packages`` and ``--verbose``, which
every command takes, stay in each command's signature (:mod:`quarl.cli.settings`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from quarl.actorq.algorithms import algorithms_help
from quarl.cli.settings import Out, Seed

Algo = Annotated[str, typer.Option("--algo", help=algorithms_help())]
Actors = Annotated[int, typer.Option("--actors", help="actor processes")]
ActorPrecision = Annotated[str, typer.Option("--actor-precision", help="{actor_precisions} (ONNX Runtime)")]
WireBits = Annotated[int, typer.Option("--wire-bits", help="weights sent to float actors at {wire_bits} bits")]
UpdatePeriod = Annotated[int, typer.Option("--update-period", help="actor env steps between weight pulls")]
PushPeriod = Annotated[int, typer.Option("--push-period", help="learner steps between weight pushes")]
PolicyLayers = Annotated[str, typer.Option("--policy-layers", help="hidden widths of the policy")]
TargetReward = Annotated[float | None, typer.Option(
    "--target-reward", help="stop at this running-mean eval return (default: env's threshold)")]
MaxMinutes = Annotated[float, typer.Option("--max-minutes", help="time budget of one run")]
MaxEnvSteps = Annotated[int | None, typer.Option("--max-env-steps", help="also stop after this many env steps")]
LearningRate = Annotated[float, typer.Option("--lr")]
BatchSize = Annotated[int, typer.Option("--batch-size")]
CheckpointReplay = Annotated[bool, typer.Option("--checkpoint-replay", help="also checkpoint replay (for --resume)")]
EvalSeconds = Annotated[float, typer.Option(
    "--eval-seconds", help="seconds between evaluations (without --eval-freq)")]
EvalFreq = Annotated[int | None, typer.Option(
    "--eval-freq", help="evaluate every N env steps instead, as train's --eval-freq (fleets of different speeds "
                        "compared at the same learning progress)")]
EvalEpisodes = Annotated[int, typer.Option("--eval-episodes")]
Address = Annotated[str | None, typer.Option(
    "--address", help="join this Ray cluster, HOST:PORT (default: start a local one)")]
Local = Annotated[bool, typer.Option("--local", help="everything in this process (no Ray)")]
LearnerDevice = Annotated[str, typer.Option("--learner-device", help="cpu, or cuda / cuda:N for a GPU learner")]


@dataclass(frozen=True)
class RunSettings:
    """The run ``actorq run`` and ``compare`` both start, in the order ``--help`` lists it
    (after each command's own options and ``--gym-packages``, before ``--verbose`` and the
    algorithm's options)."""

    algo: Algo = "dqn"
    actors: Actors = 2
    actor_precision: ActorPrecision = "int8"
    wire_bits: WireBits = 32
    update_period: UpdatePeriod = 300
    push_period: PushPeriod = 100
    policy_layers: PolicyLayers = "2048,2048,2048"
    target_reward: TargetReward = None
    max_minutes: MaxMinutes = 10.0
    max_env_steps: MaxEnvSteps = None
    learning_rate: LearningRate = 1e-4
    batch_size: BatchSize = 256
    checkpoint_replay: CheckpointReplay = False
    eval_seconds: EvalSeconds = 10.0
    eval_freq: EvalFreq = None
    eval_episodes: EvalEpisodes = 5
    seed: Seed = 0
    address: Address = None
    local: Local = False
    learner_device: LearnerDevice = "cpu"
    out: Out = None

    @classmethod
    def parsed(cls, ctx: typer.Context) -> RunSettings:
        """The settings click parsed into ``ctx.params``."""
        return cls(**{name: ctx.params[name] for name in NAMES})

    def run_options(self) -> dict[str, Any]:
        """Each option by its name (:func:`quarl.actorq.launch.prepare`)."""
        return {name: getattr(self, name) for name in NAMES}


NAMES = tuple(f.name for f in dataclasses.fields(RunSettings))
"""The parameter names of :class:`RunSettings`, in order."""
