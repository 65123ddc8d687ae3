"""The QAT format: an RL Zoo run folder that quantization-aware training wrote, with
``qat.json`` (bits, scheme, the monitored ranges by layer name) beside ``config.yml``. It
loads as the zoo folder it is, then acts as it was trained: each layer's weights on the
n-bit grid and its output fake-quantized within the monitored range
(:func:`quarl.quantization.api.from_qat_state`). Importing this module registers the format
(``qat``) in :data:`quarl.policies.formats.FORMATS`, asked before the plain zoo format."""

from __future__ import annotations

from pathlib import Path

from quarl.core.errors import QuarlError
from quarl.policies.checkpoint import Checkpoint, CheckpointFormat
from quarl.policies.formats import register_format
from quarl.policies.zoo import QAT_FILE, load_zoo
from quarl.policies.zoo_folder import zoo_files


def qat_file(path: Path) -> Path | None:
    """``ENV/qat.json`` of a zoo run folder (or its zip), else None."""
    if not path.exists():
        return None
    try:
        _, config_dir, _ = zoo_files(path)
    except QuarlError:  # not a zoo folder: another format's, or refused by the zoo format
        return None
    return config_dir / QAT_FILE if config_dir is not None and (config_dir / QAT_FILE).exists() else None


def detect(path: Path) -> bool:
    return qat_file(path) is not None


def load(path: Path, trust_pickle: bool = False) -> Checkpoint:
    """The zoo folder's policy acting with its trained quantizers."""
    from quarl.quantization.api import from_qat_state
    from quarl.training.qat_sb3 import read_qat_state  # Stable-Baselines3 comes with it

    state_file = qat_file(path)
    checkpoint = load_zoo(path, trust_pickle)
    if state_file is not None:
        # a typed QATState: NaN, inf or zero-width ranges refused here as on resume
        checkpoint.policy = from_qat_state(checkpoint.policy, read_qat_state(state_file))
    return checkpoint


FORMAT = register_format(CheckpointFormat("qat", detect, load, "an RL Zoo run folder that QAT wrote (with qat.json)"))
