"""Every checkpoint format quarl loads, those registered from above :mod:`quarl.policies`
included: the ActorQ run (:mod:`quarl.actorq.run_loader`), the QAT-trained zoo folder
(:mod:`quarl.training.qat_loader`) and the recovered one (:mod:`quarl.recovery.loader`)
register themselves when imported, which this module does. The entry points that load a checkpoint
(``quarl.load``, the CLI, the feature packages) load through :func:`load_checkpoint` here; the registry itself is
:mod:`quarl.policies.formats`."""

from __future__ import annotations

from pathlib import Path

import quarl.actorq.run_loader  # noqa: F401  registers "actorq-run"
import quarl.recovery.loader  # noqa: F401  registers "recovered"
import quarl.training.qat_loader  # noqa: F401  registers "qat"
from quarl.policies import formats
from quarl.policies.checkpoint import Checkpoint


def load_checkpoint(path: str | Path, trust_pickle: bool = False) -> Checkpoint:
    """Load ``path`` through the first format of :data:`quarl.policies.formats.FORMATS` that
    claims it (every format quarl has: :func:`describe_formats` lists them). A path none
    claims is refused in one line (QuarlError)."""
    return formats.load_checkpoint(path, trust_pickle)


def describe_formats() -> list[str]:
    """``name: what it reads`` of every checkpoint format, in the order they are asked."""
    return formats.describe_formats()
