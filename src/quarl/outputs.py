"""Where each command writes when no ``--out`` is given: every default output folder rule
in one place, each a function of what the command was given (no folder is created here).

=========================  ===============================================================
command                    default folder
=========================  ===============================================================
ptq                        ``results/ptq/<algo>-<name>-<env>`` (:func:`policy_folder`)
sweep                      ``results/sweep/<algo>-<name>-<env>/<scheme>-<granularity>[-act]``
analyze                    ``results/analyze/<algo>-<name>-weights``
export, recover            ``results/<command>/<algo>-<name>-<env>-<precision>``
qat                        ``results/qat/<algo>-<env>``
actorq run                 ``results/actorq/<algo>[-no-correction]-<env>-<actor precision>``
actorq compare             ``results/actorq/compare-<algo>[-no-correction]-<env>``
train, demo, study, model  fixed: :data:`TRAIN_RUNS`, :data:`DEMO`, :data:`STUDY`, :data:`ACTORQ_MODEL`
=========================  ===============================================================

``<name>`` is the checkpoint's own name (a zip's or pickle's stem, a run folder's name),
``<algo>`` the folder above it (RL Zoo ``ALGO/ENV_1``, legacy ``ALGO/ENV.pkl``; a zip
outside a zoo run folder: its own folder); a policy from the Hugging Face Hub is
``hf-<org>-<repo>``, an exported model its name alone. Two checkpoints of one name get two
folders: the first claims it (:data:`SOURCE_FILE`), the other adds a hash of its path.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path

from quarl.core.atomic import write_atomic
from quarl.core.errors import QuarlError

RESULTS = Path("results")
TRAIN_RUNS = Path("runs")
"""``quarl train``'s default OUT (run folders go to OUT/ALGO/ENV_N, as the RL Zoo's)."""
DEMO = RESULTS / "demo"
STUDY = RESULTS / "study"
ACTORQ_MODEL = RESULTS / "actorq" / "model"


def env_part(env_id: str) -> str:
    """An env id as one path component (``dm_control/cartpole-balance-v0``)."""
    return env_id.replace("/", "_")


SOURCE_FILE = ".quarl-source"
"""In a default output folder: the resolved path of the checkpoint it holds results of, so
another checkpoint of the same name gets a folder of its own (:func:`policy_folder`)."""
ZOO_RUN = re.compile(r".+_\d+$")
"""An RL Zoo run folder's name: ``ENV_N``."""


def _base_name(checkpoint: Path) -> str:
    """``<algo>-<name>`` of a checkpoint (see the module docstring)."""
    path = checkpoint.resolve()
    name = path.name.removesuffix(".zip").removesuffix(".pkl").removesuffix(".onnx")
    if checkpoint.is_dir() or path.suffix == ".pkl":  # zoo folder ALGO/ENV_1, legacy pickle ALGO/ENV.pkl
        return f"{path.parent.name}-{name}"
    if ZOO_RUN.fullmatch(path.parent.name):  # a zip in its zoo folder: ALGO/ENV_1/ENV.zip
        return f"{path.parent.parent.name}-{name}"
    return f"{path.parent.name}-{name}"  # a zip anywhere else (a copied best_model.zip): its own folder's name


def policy_folder(kind: str, checkpoint: Path, env_id: str) -> Path:
    """``results/KIND/<policy>-<env>``: the policy named by its algorithm folder and file;
    where that folder already holds another checkpoint's results (its
    :data:`SOURCE_FILE`), ``-<8 hex digits of this checkpoint's path>`` is added."""
    from quarl.policies import hub
    from quarl.policies.onnx_artifact import is_artifact

    if hub.is_hub(checkpoint):  # hf://ORG/REPO
        repo = hub.parse(str(checkpoint))[0].replace("/", "-")
        return RESULTS / kind / f"hf-{repo}-{env_part(env_id)}"
    path = checkpoint.resolve()
    if is_artifact(path):  # an exported model: its own name says enough
        name = path.name.removesuffix(".onnx")
        folder = RESULTS / kind / f"{name}-{env_part(env_id)}"
    else:
        folder = RESULTS / kind / f"{_base_name(checkpoint)}-{env_part(env_id)}"
    return own_folder(folder, checkpoint)


def own_folder(folder: Path, checkpoint: Path) -> Path:
    """``folder``, or ``folder-<8 hex digits of the checkpoint's path>`` where ``folder``
    holds another checkpoint's results."""
    path = checkpoint.resolve()
    owner = _owner(folder)
    if owner is not None and owner != str(path):
        return folder.with_name(f"{folder.name}-{hashlib.sha256(str(path).encode()).hexdigest()[:8]}")
    return folder


def _owner(folder: Path) -> str | None:
    if not (folder / SOURCE_FILE).is_file() or (folder / SOURCE_FILE).is_symlink():  # a FIFO would block the read
        return None
    try:
        with open(folder / SOURCE_FILE, encoding="utf-8") as file:
            return file.read(4096).strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def claim(folder: Path, checkpoint: Path) -> Path:
    """Mark a default output folder as holding ``checkpoint``'s results (created if
    needed); returns ``folder``. A sweep's variant folder marks its policy folder."""
    from quarl.policies import hub

    marked = folder.parent if folder.parent.parent.name == "sweep" else folder
    if hub.is_hub(checkpoint) or _owner(marked) is not None:
        return folder
    marked.mkdir(parents=True, exist_ok=True)
    write_atomic(marked / SOURCE_FILE, str(checkpoint.resolve()) + "\n")
    return folder


def sweep_variant(scheme: str, granularity: str, activations: bool) -> str:
    """What a sweep quantized, as its subfolder and title say it."""
    return f"{scheme}-{granularity}" + ("-act" if activations else "")


def sweep_folder(checkpoint: Path, env_id: str, scheme: str, granularity: str, activations: bool) -> Path:
    return policy_folder("sweep", checkpoint, env_id) / sweep_variant(scheme, granularity, activations)


def analyze_folder(checkpoint: Path) -> Path:
    return policy_folder("analyze", checkpoint, "weights")


def precision_folder(kind: str, checkpoint: Path, env_id: str, precision: str) -> Path:
    """export and recover: one folder per precision (as the user spelled it)."""
    from quarl.policies import hub

    if hub.is_hub(checkpoint):
        folder = policy_folder(kind, checkpoint, env_id)
        return folder.with_name(f"{folder.name}-{precision}")
    return own_folder(RESULTS / kind / f"{_base_name(checkpoint)}-{env_part(env_id)}-{precision}", checkpoint)


def qat_folder(algo: str, env_id: str) -> Path:
    return RESULTS / "qat" / f"{algo.lower()}-{env_part(env_id)}"


def actorq_folder(run_name: str, env_id: str, actor_precision: str | None = None) -> Path:
    """An ActorQ run's folder (``actor_precision`` given), else a comparison's; ``run_name``
    is the algorithm's, as its options give it (``impala-no-correction``)."""
    name = f"{run_name}-{env_part(env_id)}"
    return RESULTS / "actorq" / (f"compare-{name}" if actor_precision is None else f"{name}-{actor_precision}")


def apart_from_inputs(out: Path | None, inputs: Iterable[Path | str | None], option: str = "--out") -> Path | None:
    """``out`` when it is none of ``inputs`` (the checkpoint, run folder or agents a command
    reads), does not hold one and is not inside one; else one line, before anything is
    written: an output folder there could overwrite what the command reads (``recover
    DIR/ENV.zip --out DIR`` replaced the user's zip with the student). Hub policies
    (``hf://``) live in a cache, never an output folder."""
    if out is None or str(out) == "\0":
        return out
    where = Path(os.path.abspath(out)).resolve()
    for given in inputs:
        if given is None or str(given).startswith("hf://"):
            continue
        source = Path(os.path.abspath(given)).resolve()
        if where == source:
            relation = "is the input"
        elif where in source.parents:
            relation = "holds the input"
        elif source in where.parents:
            relation = "is inside the input"
        else:
            continue
        raise QuarlError(f"{option} {out} {relation} {given}: an output folder may not be, hold or be inside an "
                         "input (it could overwrite it); give another folder")
    return out
