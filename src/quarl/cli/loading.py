"""Loading the policy a command was given: the checkpoint and its env (a policy that names
no env refused in one line, a bare zip whose statistics are missing said so), the acting
protocol (``--stochastic`` / ``--deterministic``, ``--sticky-actions``), exported models."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from quarl.core.errors import QuarlError

if TYPE_CHECKING:
    from quarl.cli.settings import Acting
    from quarl.envs import EnvSpec
    from quarl.policies.base import Policy
    from quarl.policies.checkpoint import Checkpoint


def load(checkpoint: Path, env: str | None, trust_pickle: bool) -> tuple[Checkpoint, EnvSpec]:
    """quarl.load: fails before any work when the env does not fit the policy."""
    from quarl.api import load_checkpoint_and_env as load_policy

    ckpt = load_policy(checkpoint, env, trust_pickle)
    if ckpt.env_spec is None:  # quarl.load gives the env or raises; this says so to the type checker
        raise QuarlError(f"{checkpoint} names no env: pass --env ENV_ID")
    if checkpoint.suffix == ".zip" and ckpt.policy.obs_normalizer is None and not ckpt.policy.scale_images \
            and not is_export(checkpoint) and not (checkpoint.parent / checkpoint.stem / "config.yml").exists():
        from quarl.training.hyperparams import missing_statistics

        note = missing_statistics(ckpt.algo, ckpt.env_spec.env_id, checkpoint.name)
        if note:
            logging.getLogger("quarl").warning("%s", note)
    return ckpt, ckpt.env_spec


def protocol(policy: Policy, spec: EnvSpec, acting: Acting) -> tuple[EnvSpec, Policy]:
    """The env spec with ``--sticky-actions`` and the policy acting as ``--stochastic`` /
    ``--deterministic`` say (or the RL Zoo's default)."""
    from quarl.evaluation.episodes import protocol as acting_protocol

    return acting_protocol(policy, spec, acting.stochastic, acting.sticky_actions)


def is_export(checkpoint: Path) -> bool:
    """Whether ``checkpoint`` is an exported model (a quarl export folder or .onnx)."""
    from quarl.policies.onnx_artifact import is_artifact

    return is_artifact(checkpoint)
