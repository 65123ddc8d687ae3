"""The checkpoint formats quarl loads: :data:`FORMATS`, one registry entry each, asked
newest registered first (a specific claim before a general one). Each entry says what it
reads (``describes``); :func:`describe_formats` lists them (the docs' list is its
output). The built-in ones are registered at the
end of this module (the zoo format, which claims any existing path, first, so asked last).

Formats whose code lives above this package (ActorQ's run folder, the QAT-trained and the
recovered zoo folder) register themselves when their module is imported;
:mod:`quarl.checkpoints` imports them all, and the entry points (``quarl.load``, the CLI)
load through it. This module imports nothing above :mod:`quarl.policies`.

A folder ``quarl recover`` wrote loads as the zoo folder it is (its zip holds the student's
weights on the grid), once ``recovered`` has checked its files against recovery.json's
manifest; what makes it a recovered one, its original policy and real kernel, is read by
:func:`quarl.recovery.load_recovered`, which loads the original through
:func:`quarl.policies.zoo.load_zoo`'s ``zip_override`` (the folder's zoo files, the
original's weights).

A format is a :class:`~quarl.policies.checkpoint.CheckpointFormat` (``detect(path)``,
``load(path, trust_pickle)``); adding one is one :func:`register_format` call.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from quarl.core.errors import QuarlError
from quarl.core.registry import Registry
from quarl.policies import hub, legacy, onnx_artifact, zoo
from quarl.policies.checkpoint import Checkpoint, CheckpointFormat

FORMATS: Registry[CheckpointFormat] = Registry("checkpoint format", newest_first=True)
"""name -> format, in the order they are asked (newest registered first)."""


def register_format(fmt: CheckpointFormat) -> CheckpointFormat:
    """Add a format, asked before those registered earlier; returns it."""
    return FORMATS.register(fmt.name, fmt)


def format_of(path: str | Path) -> CheckpointFormat | None:
    """The first registered format that claims ``path``, or None."""
    path = Path(path)
    return FORMATS.first(lambda fmt: fmt.detect(path))


def load_checkpoint(path: str | Path, trust_pickle: bool = False) -> Checkpoint:
    """Load ``path`` through the first registered format that claims it; a path none claims
    (one that does not exist) is refused in one line. Only the formats registered so far
    are asked: :func:`quarl.checkpoints.load_checkpoint` has them all."""
    fmt = format_of(path)
    if fmt is None:
        raise QuarlError(f"checkpoint {str(Path(path))!r} does not exist")
    return dataclasses.replace(fmt.load(Path(path), trust_pickle), format=fmt.name)


def describe_formats() -> list[str]:
    """``name: what it reads`` of every format registered so far, in the order they are asked."""
    return FORMATS.listing(lambda fmt: fmt.describes)


# registered first = asked last: the zoo format claims any existing path
register_format(CheckpointFormat("zoo", zoo.detect, zoo.load, "an SB3 .zip or an RL Zoo run folder"))
register_format(CheckpointFormat("legacy", legacy.detect, legacy.load, "a stable-baselines (TF) .pkl"))
register_format(CheckpointFormat("onnx", onnx_artifact.detect, onnx_artifact.load,
                                 "quarl export's NAME.onnx with its NAME.json, or its folder"))
register_format(CheckpointFormat("hub", hub.detect, hub.load, "hf://ORG/REPO[@REVISION] on the Hugging Face Hub"))
