"""What loading a checkpoint gives (:class:`Checkpoint`) and what a checkpoint format is
(:class:`CheckpointFormat`: how it recognises a path, how it loads one). The formats
themselves are registered in :mod:`quarl.policies.formats`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from quarl.core.errors import QuarlError
from quarl.envs import EnvSpec, current_env_id, env_spec_for_policy, make_env
from quarl.policies.base import Policy

P = TypeVar("P")


@dataclass
class Checkpoint:
    """A loaded checkpoint: the policy, how to build its env, which format read it, and what
    that format knows beyond the policy (its typed payload)."""

    policy: Policy
    env_spec: EnvSpec | None
    """From the zoo folder's config; ``None`` for a bare zip (pass the env id)."""
    algo: str
    path: Path
    format: str = ""
    """The name of the registered format that loaded it (set by
    :func:`quarl.policies.formats.load_checkpoint`; empty for a checkpoint built by hand)."""
    payload: object = None
    """What the format read besides the policy, as its own type (an export's
    :class:`~quarl.policies.onnx_artifact.ExportedModel`, ...), or None: read it with
    :meth:`payload_of`, so a command asks what it loaded instead of sniffing the path or
    loading it again."""

    def payload_of(self, kind: type[P]) -> P | None:
        """The payload if it is a ``kind``, else None."""
        return self.payload if isinstance(self.payload, kind) else None


@dataclass(frozen=True)
class CheckpointFormat:
    """One kind of checkpoint quarl loads (an SB3 zip or RL Zoo folder, a legacy pickle, an
    ONNX export, an ActorQ run, ...). Adding one is one
    :func:`quarl.policies.formats.register_format` call."""

    name: str
    detect: Callable[[Path], bool]
    """Whether ``path`` is one of these (asked newest registered first; the first that says
    yes loads it). Never raises: a path it cannot read is not its own."""
    load: Callable[[Path, bool], Checkpoint]
    """``load(path, trust_pickle)``: the checkpoint, or one line (QuarlError)."""
    describes: str = ""
    """What it reads, in a few words (the docs' list of formats)."""


def resolve_env_spec(checkpoint: Checkpoint, env_id: str | None) -> EnvSpec:
    """The env to evaluate in: ``env_id`` when given (keeping the zoo's wrappers when it
    names the same env), else the zoo folder's own."""
    spec = checkpoint.env_spec
    if env_id is None:
        if spec is None:
            raise QuarlError(f"{checkpoint.path} is a bare checkpoint: pass --env ENV_ID")
        return spec
    if spec is not None and current_env_id(env_id) == spec.env_id:
        return spec
    if spec is not None:  # another version of the zoo env: keep its wrappers
        return EnvSpec(current_env_id(env_id), spec.env_kwargs, spec.wrappers, spec.frame_stack)
    return env_spec_for_policy(env_id, checkpoint.policy.input_shape)


def checked_env_spec(checkpoint: Checkpoint, env_id: str | None) -> EnvSpec:
    """:func:`resolve_env_spec`, set on ``checkpoint`` and checked: one env made and its
    spaces compared with what the policy reads and acts in (one line where they differ)."""
    spec = checkpoint.env_spec = resolve_env_spec(checkpoint, env_id)
    probe = make_env(spec)
    try:
        checkpoint.policy.check_env(probe)
    finally:
        probe.close()
    return spec
