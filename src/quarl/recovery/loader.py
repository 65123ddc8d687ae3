"""The recovered format: an RL Zoo run folder that ``quarl recover`` wrote, with
``ENV/recovery.json`` beside its ``config.yml``. It loads as the zoo folder it is (the
student's weights, on the kernel's grid, as RL Zoo users load it), after every file it holds
is checked against the SHA-256 manifest that recovery.json records: a folder edited after
it was written is refused in one line, whichever command loads it (``quarl play``,
``quarl.load``), not only ``ptq`` (which also reads the original and the real kernel:
:func:`quarl.recovery.folder.load_recovered`). Importing this module registers the format
(``recovered``) in :data:`quarl.policies.formats.FORMATS`, asked before the plain zoo format."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from quarl.core.errors import QuarlError
from quarl.envs import EnvSpec
from quarl.evaluation.episodes import acting
from quarl.policies.base import Policy
from quarl.policies.checkpoint import Checkpoint, CheckpointFormat
from quarl.policies.formats import register_format
from quarl.policies.zoo import load_zoo
from quarl.recovery.folder import RecoveredFolder, check_recovered, find_recovery, load_recovered


def detect(path: Path) -> bool:
    if not path.exists():
        return False
    try:
        return find_recovery(path) is not None
    except QuarlError:  # a recovered folder without its policy: load says so in one line
        return True


def load(path: Path, trust_pickle: bool = False) -> Checkpoint:
    """The folder's policy (the student), once recovery.json and its manifest are checked
    (before anything is unpickled: every file the load reads is one recovery wrote); the
    checked record is its payload (:class:`~quarl.recovery.folder.RecoveredFolder`)."""
    folder = check_recovered(path)
    return dataclasses.replace(load_zoo(path, trust_pickle), payload=folder)


FORMAT = register_format(CheckpointFormat("recovered", detect, load,
                                          "an RL Zoo run folder that quarl recover wrote (with recovery.json)"))


def recovered_cells(checkpoint: Path, folder: RecoveredFolder, env_spec: EnvSpec, stochastic: bool,
                    trust_pickle: bool) -> tuple[dict[str, Policy], str]:
    """What ``ptq`` plays instead of quantizing a policy ``quarl recover`` wrote: fp32 is the
    ORIGINAL policy and the recovered precision its real kernel (cell label -> acting policy),
    with that precision. ``folder``: the record loading ``checkpoint`` checked (its payload),
    so the folder is not read and hashed again."""
    recovered = load_recovered(checkpoint, trust_pickle, folder)
    assert recovered is not None  # a checked folder always loads (or raises one line)
    return ({"fp32": acting(recovered.original, env_spec, stochastic),
             recovered.precision: acting(recovered.kernel, env_spec, stochastic)}, recovered.precision)
