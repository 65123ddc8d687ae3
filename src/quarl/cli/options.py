"""The options of ``quarl recover`` until it takes the option groups of
:mod:`quarl.cli.settings`: declared as typer defaults and attached by
:func:`quarl.cli.groups.with_options` and :func:`load_choice`."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import typer

from quarl.cli import early
from quarl.cli.common import setup
from quarl.cli.loading import is_export, load  # noqa: F401  (recover's, until it takes settings)
from quarl.cli.settings import checked_path, gym_packages_callback, trust_gym_packages_callback
from quarl.core import validate

CheckpointArg = typer.Argument(..., help="the policy: an SB3 .zip, an RL Zoo run folder (ppo/CartPole-v1_1), a legacy "
                                         "stable-baselines .pkl, hf://ORG/REPO (Hugging Face Hub), a quarl actorq run "
                                         "folder, or a quarl export (its folder or .onnx)")
EnvOpt = typer.Option(None, "--env", help="gymnasium env id (default: the zoo folder's env)")
EpisodesOpt = typer.Option(20, "--episodes", help="episodes per precision (episode i uses seed + i)")
SeedOpt = typer.Option(0, "--seed")
NEnvsOpt = typer.Option(32, "--n-envs", help="envs stepped side by side per process, the policy called on their batch "
                                               "(each env's action exactly as if alone)")
MaxStepsOpt = typer.Option(None, "--max-steps", help="cut episodes after this many steps")
WorkersOpt = typer.Option(None, "--workers", help="processes playing episodes side by side (default: this machine's "
                                                  "cores, or $QUARL_WORKERS); the same returns as --workers 1")
OutOpt = typer.Option(None, "--out", parser=validate.out_option, help="output folder (default results/<command>/<policy>)")
TrustOpt = typer.Option(False, "--trust-pickle", help="allow arbitrary unpickling of vecnormalize.pkl")
VerboseOpt = typer.Option(False, "--verbose", "-v")
GymPackagesOpt = typer.Option(None, "--gym-packages", metavar="MODULE", is_eager=True, callback=gym_packages_callback,
                              help="modules to import first, so the envs they register are known here and in every "
                                   "worker (rl_zoo3's option; repeatable or comma-separated; installed modules or "
                                   "modules in the current folder). A run folder's args.yml gym_packages are imported "
                                   "only when named here, or with --trust-gym-packages (a file naming code to run)")
"""Shown in each command's help; the group takes the option before any command parses
(an eager option, :func:`quarl.cli.settings.gym_packages_callback`)."""
TrustGymPackagesOpt = typer.Option(False, "--trust-gym-packages", is_eager=True, callback=trust_gym_packages_callback,
                                   help="import the gym_packages a run folder's "
                                   "args.yml names (code a file asks to run) without naming them with --gym-packages; "
                                   "taken, like --gym-packages, before the command parses")
"""Shown where a command loads run folders; taken by the group first, so always False here."""
WideOpt = typer.Option(False, "--wide", help="print the table as one wide table even where it is wider than the "
                       "terminal (it then prints one block per row; the CSV is always wide)")
StickyOpt = typer.Option(None, "--sticky-actions", help="Atari / MinAtar: repeat the previous action with this "
                         "probability (0.25: Machado et al., ALE v5), so a deterministic agent's seeds are different "
                         "games")
AgentsStickyOpt = typer.Option(None, "--sticky-actions", help="Atari / MinAtar agents: repeat the previous action "
                               "with this probability (0.25: ALE v5); the other agents play as they are")
StochasticOpt = typer.Option(None, "--stochastic/--deterministic", help="sample actions as rl_zoo3.enjoy "
                             "--stochastic does (fp32 and each precision share their noise per seed and step), or act "
                             "greedily; default: the RL Zoo's (stochastic on Atari and MinAtar)")
BitsOpt = typer.Option("8,7,6,5,4,3,2", help="comma list of widths in 2..16")
SchemeOpt = typer.Option("quarl", help="quarl (paper, unclamped), affine or symmetric")
GranularityOpt = typer.Option("auto", help="auto (paper: tensor for dense, channel for conv), tensor, channel, "
                                           "block (per --block-size inputs)")
PRECISIONS_HELP = "{precisions}"
"""Every label --precisions takes, from the registries (see :mod:`quarl.cli.help_lists`)."""
Int8WeightsOpt = typer.Option("auto", help="8-bit weights of the MatMulInteger / QDQ modes: auto (symmetric int8 "
                                           "where the CPU has VNNI, else asymmetric uint8), asymmetric, symmetric")
BlockSizeOpt = typer.Option(32, "--block-size", help="inputs per block of the MatMulNBits modes: 16, 32, 64, 128 or 256")


def load_choice(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Gives a command rl_zoo3.enjoy's ``--load-best``, ``--load-checkpoint N`` and
    ``--load-last-checkpoint``: which zip of a run folder its CHECKPOINT means
    (:func:`quarl.policies.zoo_folder.pick_zip`); the zip then finds its folder's statistics.
    What can be checked before torch loads is checked first (:mod:`quarl.cli.early`): the path,
    ``--env``, ``--out``."""
    extra = [
        inspect.Parameter("load_best", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=typer.Option(
            False, "--load-best", help="a run folder's best_model.zip (as rl_zoo3.enjoy --load-best)")),
        inspect.Parameter("load_checkpoint", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[int],
                          default=typer.Option(None, "--load-checkpoint", help="a run folder's rl_model_N_steps.zip")),
        inspect.Parameter("load_last_checkpoint", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=typer.Option(
            False, "--load-last-checkpoint", help="a run folder's latest rl_model_N_steps.zip")),
    ]

    @functools.wraps(fn)
    def wrapper(*args: Any, load_best: bool = False, load_checkpoint: Optional[int] = None,
                load_last_checkpoint: bool = False, **kwargs: Any) -> Any:
        setup(bool(kwargs.get("verbose")))  # the command's logging, before a check may log (an env id renamed)
        checkpoint = kwargs.get("checkpoint")
        if isinstance(checkpoint, Path):
            checked_path(checkpoint)
        if load_best or load_checkpoint is not None or load_last_checkpoint:
            from quarl.policies.zoo_folder import pick_zip

            kwargs["checkpoint"] = pick_zip(kwargs["checkpoint"], load_best, load_checkpoint, load_last_checkpoint)
        # before any option that needs the registries (torch, ONNX Runtime): a mistake answers at once
        early.env_id(kwargs.get("env"))
        if isinstance(kwargs.get("out"), Path):
            early.out_folder(kwargs["out"], [kwargs["checkpoint"]])
        return fn(*args, **kwargs)

    signature = inspect.signature(fn)
    setattr(wrapper, "__signature__", signature.replace(parameters=[*signature.parameters.values(), *extra]))
    return wrapper
