"""Loading the policy a command was given: the checkpoint and its env (a policy that names
no env refused in one line, a bare zip whose statistics are missing said so), the acting
protocol (``--stochastic`` / ``--deterministic``, ``--sticky-actions``). A checkpoint loads once
(:func:`read`): a command asks what loaded (its format, its typed payload), never the path."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quarl.cli.settings import Acting
    from quarl.envs import EnvSpec
    from quarl.policies.base import Policy
    from quarl.policies.checkpoint import Checkpoint


def load(checkpoint: Path, env: str | None, trust_pickle: bool) -> tuple[Checkpoint, EnvSpec]:
    """quarl.load: fails before any work when the env does not fit the policy."""
    return with_env(read(checkpoint, env, trust_pickle), env)


def read(checkpoint: Path, env: str | None, trust_pickle: bool) -> Checkpoint:
    """The checkpoint as its format loads it, its env not made yet: a command that refuses a
    kind of checkpoint (``checkpoint.format``, ``checkpoint.payload_of(ExportedModel)``) says
    so before the env; :func:`with_env` then makes it. ``--env`` is checked first, as
    quarl.load does."""
    from quarl.checkpoints import load_checkpoint
    from quarl.envs import check_env_id

    if env is not None:
        check_env_id(env)
    return load_checkpoint(checkpoint, trust_pickle)


def with_env(ckpt: Checkpoint, env: str | None) -> tuple[Checkpoint, EnvSpec]:
    """The env ``ckpt`` acts in (``--env``, else the one it names), checked against the policy
    as quarl.load checks it; a bare zip whose statistics are missing said so."""
    from quarl.policies.checkpoint import checked_env_spec
    from quarl.policies.onnx_artifact import ExportedModel

    spec = checked_env_spec(ckpt, env)
    path = ckpt.path
    if path.suffix == ".zip" and ckpt.policy.obs_normalizer is None and not ckpt.policy.scale_images \
            and ckpt.payload_of(ExportedModel) is None and not (path.parent / path.stem / "config.yml").exists():
        from quarl.training.hyperparams import missing_statistics

        note = missing_statistics(ckpt.algo, spec.env_id, path.name)
        if note:
            logging.getLogger("quarl").warning("%s", note)
    return ckpt, spec


def protocol(policy: Policy, spec: EnvSpec, acting: Acting) -> tuple[EnvSpec, Policy]:
    """The env spec with ``--sticky-actions`` and the policy acting as ``--stochastic`` /
    ``--deterministic`` say (or the RL Zoo's default)."""
    from quarl.evaluation.episodes import protocol as acting_protocol

    return acting_protocol(policy, spec, acting.stochastic, acting.sticky_actions)

