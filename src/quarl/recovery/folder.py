"""The recovered folder: an RL Zoo run folder whose zip holds the student on the grid, the
real-kernel export beside it, the original recorded by content hash; and reading one back."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import stat
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, cast

import torch

from quarl.core.atomic import owned_folder, write_atomic
from quarl.core.errors import QuarlError
from quarl.core.file_schema import parse_json, parse_record
from quarl.envs import EnvSpec
from quarl.policies.base import Policy
from quarl.quant.backends.torch_backend import TorchEngine
from quarl.quant.student import plain_network, sb3_tensors
from quarl.quant.summary import QuantSummary
from quarl.recovery.config import EXPORT_DIR, ORIGINAL_ZIP, RECOVERY_FILE, RECOVERY_FORMAT, RecoverConfig
from quarl.recovery.dagger import RecoveryResult
from quarl.recovery.report import RecoveryFile, RecoveryJson, RecoveryReport


def sha256_file(path: Path, follow: bool = True) -> str:
    """SHA-256 of a regular file of at most :func:`~quarl.core.limits.model_file_cap` bytes,
    read in chunks: a FIFO or device is refused, never waited on, and a larger file (a 1 TB
    sparse one, ``/proc`` through a link) is refused, never hashed for hours. ``follow=False``:
    a symbolic link is refused too (a recovered folder's own files are files, not links)."""
    from quarl.core.limits import model_file_cap

    cap = model_file_cap()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    except OSError as exc:
        if not follow and os.path.islink(path):
            raise QuarlError(f"{path} is a symbolic link (to {os.readlink(path)}), not a file quarl wrote") from None
        raise QuarlError(f"{path} is not a regular file ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise QuarlError(f"{path} is not a regular file")
        if info.st_size > cap:
            raise QuarlError(f"{path} has {info.st_size} bytes, more than the {cap} a file of quarl's may have: "
                             "refused (set QUARL_MAX_PARAMETERS for a bigger policy)")
        os.set_blocking(fd, True)
        h, read = hashlib.sha256(), 0
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            read += len(chunk)
            if read > cap:  # a file that says it is small but never ends (/proc)
                raise QuarlError(f"{path} holds more than the {cap} bytes a file of quarl's may have: refused")
            h.update(chunk)
    return h.hexdigest()


def zoo_paths(checkpoint: Path) -> tuple[Path, Path | None]:
    """(the agent's zip, its RL Zoo config folder or None) of ``checkpoint``, a
    Stable-Baselines3 zip or an RL Zoo run folder (:func:`quarl.policies.zoo_folder.zoo_files`);
    anything else is refused in one line (what recover takes, and what a recovered folder is)."""
    from quarl.policies.zoo_folder import zoo_files

    zip_path, config_dir, _ = zoo_files(checkpoint)
    if zip_path.suffix != ".zip":
        raise QuarlError(f"recover takes a Stable-Baselines3 .zip or an RL Zoo run folder, not {checkpoint}")
    return zip_path, config_dir


ZOO_FILES = ("config.yml", "args.yml", "env_kwargs.yml", "vecnormalize.pkl")
"""The RL Zoo files a recovered folder copies from its original's folder."""


def folder_files(out: Path, name: str) -> list[str]:
    """Every file of the recovered folder ``out`` whose zoo folder is ``name``, relative to
    ``out`` (``/``-separated): ``NAME.zip``, what ``NAME/`` holds but ``recovery.json`` (the
    record that lists the others' hashes, and its own apart: :func:`record_digest`) and what
    ``export/`` holds. The verdict, the state
    of a run in progress (``.recover/``, checked on its own) and the lock are not the folder's.
    A symbolic link is listed as the entry it is (to a folder too, never followed): no
    manifest lists one, so each is refused, and a folder of links is never walked."""
    found = [f"{name}.zip"] if os.path.lexists(out / f"{name}.zip") else []
    for folder in (out / name, out / EXPORT_DIR):
        if folder.is_symlink():
            found.append(folder.relative_to(out).as_posix())
            continue
        if not folder.is_dir():
            continue
        for root, dirs, files in os.walk(folder):  # never into a linked folder
            entries = files + [d for d in dirs if os.path.islink(os.path.join(root, d))]
            found += [(Path(root) / entry).relative_to(out).as_posix() for entry in entries
                      if Path(root) / entry != out / name / RECOVERY_FILE]
    return sorted(found)


def _file_within(out: Path, rel: str) -> Path:
    """``out/rel`` where each folder on the way is a real folder (a link there is refused in
    one line: the folder's files are the ones recover wrote, not another folder's)."""
    path = out
    for part in Path(rel).parts[:-1]:
        path = path / part
        if path.is_symlink():
            raise QuarlError(f"{path} is a symbolic link (to {os.readlink(path)}), not the folder recover wrote: run "
                             "quarl recover again")
    return out / rel


def _manifest(out: Path, name: str) -> dict[str, str]:
    """SHA-256 of every file of the recovered folder (:func:`folder_files`)."""
    return {rel: sha256_file(out / rel) for rel in folder_files(out, name)}


def _remove_strays(folder: Path, keep: set[str]) -> None:
    """Remove what ``folder`` (a real folder: :func:`~quarl.core.atomic.owned_folder`) holds
    besides ``keep`` (an earlier recovery's files, or ones added since): a rebuilt folder's
    manifest never vouches for a file recovery did not write. A link there is removed
    itself, never what it leads to."""
    if folder.is_symlink() or not folder.is_dir():
        return
    for path in folder.iterdir():
        if path.name in keep:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def check_manifest(record_path: Path, files: dict[str, str] | None) -> None:
    """Every file of the recovered folder that ``record_path`` (its ``recovery.json``)
    describes is the one recovery wrote: its SHA-256 in ``files``, nothing missing, nothing
    added; else one line naming the first file that differs."""
    out, name = record_path.parent.parent, record_path.parent.name
    again = "run quarl recover again"
    if files is None:
        raise QuarlError(f"{record_path} lists no SHA-256 of its folder's files (an older quarl wrote it): {again}")
    for rel, digest in sorted(files.items()):
        parts = Path(rel).parts
        if Path(rel).is_absolute() or ".." in parts or not parts:
            raise QuarlError(f"{record_path}: files lists {rel!r}, a path outside the recovered folder")
        path = _file_within(out, rel)
        if not os.path.lexists(path):
            raise QuarlError(f"{path} is missing: the recovered folder is incomplete; {again}")
        if sha256_file(path, follow=False) != digest:
            raise QuarlError(f"{path} changed since recovery wrote it (its SHA-256 differs from the one in "
                             f"{record_path.name}): {again}")
    for rel in folder_files(out, name):
        if rel not in files:
            raise QuarlError(f"{out / rel} is not a file recovery wrote (no SHA-256 in {record_path.name}): remove "
                             f"it, or {again}")


RECORD_HASH: Final = "record_sha256"
"""recovery.json's field holding the hash of its other fields (:func:`record_digest`)."""


def record_digest(record: Mapping[str, object]) -> str:
    """SHA-256 of recovery.json's fields but :data:`RECORD_HASH`, as canonical JSON (keys
    sorted, no spaces): the record's content, whatever the file's layout. recovery.json is
    not in its own manifest (it cannot list its own hash), so it carries this instead."""
    rest = {key: value for key, value in record.items() if key != RECORD_HASH}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _write_zip(source: Path, target: Path, tensors: dict[str, torch.Tensor]) -> None:
    """``source`` with its ``policy.pth`` tensors replaced by ``tensors`` (and the same
    names under a ``*_target`` network, so DQN / TD3 targets match); every other entry copied."""
    from quarl.core.limits import open_zip, read_zip_entry

    with open_zip(source, "a Stable-Baselines3 checkpoint") as archive:
        sd = torch.load(io.BytesIO(read_zip_entry(archive, "policy.pth", str(source))), map_location="cpu",
                        weights_only=True)
        for name, value in tensors.items():
            if name not in sd:
                raise QuarlError(f"{source} has no tensor {name!r} to write the recovered weights into")
            head, _, rest = name.partition(".")
            for key in (name, f"{head}_target.{rest}"):
                if key in sd:
                    sd[key] = value.to(sd[key].dtype).reshape(sd[key].shape)
        buffer = io.BytesIO()
        torch.save(sd, buffer)

        def write(tmp: Path) -> None:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
                for info in archive.infolist():
                    data = buffer.getvalue() if info.filename == "policy.pth" else read_zip_entry(
                        archive, info.filename, str(source))
                    out.writestr(info, data)

        write_atomic(target, write)  # a full disk leaves no half zip and no .tmp


def write_recovered(checkpoint: Path, policy: Policy, env_spec: EnvSpec, result: RecoveryResult, out: Path,
                    config: RecoverConfig, chosen: QuantSummary | None, report: RecoveryReport) -> RecoveryJson:
    """Write the recovered RL Zoo run folder ``OUT``: ``ENV.zip`` (the student's weights on
    the grid, loadable by SB3 and ``rl_zoo3.enjoy``), ``ENV/`` (the original's zoo files,
    its zip as ``original.zip`` and ``recovery.json``) and ``export/`` (the real-kernel
    model built from the student's integers, with its sidecar); ``chosen`` is the automatic
    choice's record, ``report`` what :func:`quarl.recovery.workflow.recover_stages` reported.
    Returns recovery.json."""
    from quarl.core.provenance import provenance
    from quarl.export.artifact import write_artifact

    zip_path, config_dir = zoo_paths(checkpoint)
    name = _zoo_name(checkpoint, env_spec)
    # real folders of OUT's own, never a link to another folder: its strays are removed
    zoo, export = owned_folder(out, name), owned_folder(out, EXPORT_DIR)
    copied = {item for item in ZOO_FILES if config_dir is not None and (config_dir / item).is_file()}
    _remove_strays(zoo, copied | {ORIGINAL_ZIP, RECOVERY_FILE})
    _remove_strays(export, set())
    if config_dir is not None:
        for item in sorted(copied):
            if (config_dir / item).is_file():
                write_atomic(zoo / item, (config_dir / item).read_bytes())
    if not (zoo / "args.yml").exists():  # a bare zip: the env it was recovered on, as the zoo writes it
        from quarl.envs import gym_packages

        # the modules that register a custom env, as rl_zoo3 records them: the folder loads on its own
        packages = "".join(f"    - - {name}\n" if i == 0 else f"      - {name}\n"
                           for i, name in enumerate(gym_packages()))
        write_atomic(zoo / "args.yml", "!!python/object/apply:collections.OrderedDict\n"
                                       f"- - - algo\n    - {policy.algo}\n"
                                       f"  - - env\n    - {env_spec.env_id}\n"
                                       + (f"  - - gym_packages\n{packages}" if packages else ""))
        write_atomic(zoo / "config.yml", "!!python/object/apply:collections.OrderedDict\n- []\n")
    write_atomic(zoo / ORIGINAL_ZIP, lambda tmp: shutil.copyfile(zip_path, tmp))  # never a truncated original.zip
    _write_zip(zip_path, out / f"{name}.zip", sb3_tensors(policy.network, result.student))
    recovered = policy.with_network(plain_network(result.student, on_grid=True), "fp32",
                                    TorchEngine(plain_network(result.student, on_grid=True)))
    quant: QuantSummary = {"mode": result.spec.mode, "fp32_layers": sorted(result.spec.keep),
                           "agreement": result.agreement, "block_size": result.spec.block_size,
                           "int8_weights": result.spec.int8_weights, "recovered": True}
    precision = _PRECISIONS[result.spec.bits]
    sidecar = write_artifact(recovered, precision, out / EXPORT_DIR / "policy", result.model, quant, env_spec)
    record: RecoveryJson = {
        "format": RECOVERY_FORMAT,
        "precision": precision,
        "kernel": result.spec.to_dict(),
        "original": {"path": str(checkpoint), "zip_sha256": sha256_file(zip_path),
                     "policy_sha256": policy.fingerprint(), "algo": policy.algo},
        "recovered": {"zip_sha256": sha256_file(out / f"{name}.zip"), "onnx_sha256": sidecar["onnx_sha256"],
                      "export": f"{EXPORT_DIR}/policy.onnx"},
        "env": env_spec.to_json(),
        "config": dataclasses.asdict(config),
        "automatic_choice": None if chosen is None else _untried(chosen),
        # what was written (the student, or PTQ's own model where no student was shown at least as good) and why the
        # run ended (its verdict against the original fp32 kept, or its budget was spent): recover_stages' report
        **report,
        "distill_stopped": result.stopped,
        "best_round": result.best_round,
        "target_agreement": result.target,
        "ptq_agreement": result.ptq_agreement,
        "agreement": result.agreement,
        "labelled_states": result.labelled_states,
        "heldout_states": 0 if result.heldout is None else len(result.heldout),
        "updates": result.updates,
        "wall_s": round(result.wall_s, 2),
        "seeds": [min(result.seeds), max(result.seeds)] if result.seeds else [],
        "rounds": [h.to_dict() for h in result.history],
        "provenance": provenance(),
        # every file of the folder (the sidecar and zoo files too), checked before it is loaded or reused
        "files": _manifest(out, name),
    }
    record[RECORD_HASH] = record_digest(record)  # and recovery.json's own content
    write_atomic(zoo / RECOVERY_FILE, json.dumps(record, indent=1, allow_nan=False, default=_nan_as_null))
    return record


_PRECISIONS: dict[int, Literal["int8", "int4"]] = {8: "int8", 4: "int4"}
"""recovery.json's precision of a mode's bits (a real int mode has 8 or 4)."""


def _untried(chosen: QuantSummary) -> QuantSummary:
    """The automatic choice's record less the modes it tried (recovery.json's ``automatic_choice``)."""
    choice = chosen.copy()
    choice.pop("tried", None)
    return choice


def _nan_as_null(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON")


# ------------------------------------------------------------------ reading a recovered folder


@dataclass
class Recovered:
    """What ``quarl ptq`` needs of a recovered folder."""

    original: Policy
    """The original fp32 policy (its zip copied at recovery, checked against its hash)."""
    kernel: Policy
    """The recovered policy on its real kernel (the export built from the student's integers)."""
    precision: str
    record: RecoveryJson
    """Its recovery.json, as written (checked: :func:`read_recovery_record`)."""


def find_recovery(checkpoint: Path) -> Path | None:
    """``ENV/recovery.json`` of a recovered run folder (or of a zip in one: the zoo files a
    load would read beside any zip there, ``best_model.zip`` too, are the recovered
    folder's), else None."""
    try:
        zip_path, config_dir = zoo_paths(checkpoint)
    except QuarlError:
        for record in sorted(checkpoint.glob(f"*/{RECOVERY_FILE}")) if checkpoint.is_dir() else []:
            if not (checkpoint / f"{record.parent.name}.zip").exists():  # the policy is gone, its record stays
                raise QuarlError(f"{checkpoint / record.parent.name}.zip is missing: the recovered folder is "
                                 "incomplete; run quarl recover again") from None
        return None
    for folder in dict.fromkeys([zip_path.parent / zip_path.stem, *([config_dir] if config_dir is not None else [])]):
        candidate = folder / RECOVERY_FILE
        if candidate.is_file() or candidate.is_symlink():
            return candidate
        if os.path.lexists(folder / ORIGINAL_ZIP):  # a recovered folder that lost its record: never judged as fp32
            raise QuarlError(f"{zip_path.parent} holds {folder.name}/{ORIGINAL_ZIP} but no {RECOVERY_FILE}: a "
                             "recovered folder that lost its record; run quarl recover again")
    return None


def check_reads(record_path: Path, files: dict[str, str], zip_path: Path) -> None:
    """The zip a load of the recovered folder would read (``--load-best``'s
    ``best_model.zip``, a checkpoint zip dropped beside it) is one its manifest lists: the
    zoo files it reads are checked by :func:`check_manifest`, the zip by this."""
    out = record_path.parent.parent
    try:
        rel = Path(os.path.abspath(zip_path)).relative_to(os.path.abspath(out)).as_posix()
    except ValueError:
        rel = None
    if rel not in files:
        raise QuarlError(f"{zip_path} is not a file recovery wrote (no SHA-256 in {record_path}): a recovered folder "
                         f"loads its own {record_path.parent.name}.zip; remove it, or run quarl recover again")


def check_out_folders(out: Path, checkpoint: Path, env_spec: EnvSpec) -> None:
    """Refuse in one line, before any work, a symbolic link or a file where recover writes
    a folder of ``out`` (the zoo folder, ``export/``, ``.recover/``, ``verdict/``): recover
    removes strays there, and would remove another folder's files (nothing is made here)."""
    from quarl.core.atomic import check_folder

    for part in (_zoo_name(checkpoint, env_spec), EXPORT_DIR, ".recover", "verdict"):
        check_folder(out, part)


def _zoo_name(checkpoint: Path, env_spec: EnvSpec) -> str:
    """The recovered folder's zoo folder (``OUT/NAME``): an RL Zoo folder keeps its names; a
    bare zip's folder is named after its env, as the zoo names ENV.zip."""
    zip_path, config_dir = zoo_paths(checkpoint)
    return zip_path.stem if config_dir is not None else env_spec.env_id.replace("/", "_")


RECORD_CAP = 4 << 20
"""Bytes a recovery.json may have (quarl writes a few kilobytes)."""


def read_recovery_record(path: Path) -> RecoveryJson:
    """``recovery.json`` as written, its fields checked (:data:`~quarl.recovery.report.RecoveryFile`:
    :class:`~quarl.recovery.report.RecoveryJson`), or one line naming the file (and the field)."""
    from quarl.core.limits import read_capped

    record = parse_json(read_capped(path, RECORD_CAP, "a recovery record"), path)
    if not isinstance(record, dict) or record.get("format") != RECOVERY_FORMAT:
        raise QuarlError(f"{path} is not a quarl recovery record (format {RECOVERY_FORMAT})")
    original, recovered = record.get("original"), record.get("recovered")
    if not (isinstance(original, dict) and "zip_sha256" in original and isinstance(recovered, dict)
            and "onnx_sha256" in recovered and "zip_sha256" in recovered):
        raise QuarlError(f"{path} lacks the original's or the export's hash")
    if record.get("precision") not in ("int8", "int4"):
        raise QuarlError(f"{path}: precision {record.get('precision')!r} is not int8 or int4")
    if "files" not in record:
        check_manifest(path, None)  # an older quarl's record: one line saying to recover again
    parse_record(RecoveryFile, record, path)
    if RECORD_HASH in record and record[RECORD_HASH] != record_digest(record):  # an older quarl's record has none
        raise QuarlError(f"{path} changed since recovery wrote it (its content differs from its {RECORD_HASH}): run "
                         "quarl recover again")
    return cast(RecoveryJson, record)  # the dict as written (its numbers as JSON wrote them), checked


@dataclass(frozen=True)
class RecoveredFolder:
    """A recovered folder's recovery.json, read and its manifest checked: the recovered
    format's payload, which :func:`load_recovered` takes instead of reading and hashing the
    folder again."""

    record_path: Path
    record: RecoveryJson


def check_recovered(checkpoint: Path) -> RecoveredFolder | None:
    """recovery.json of the folder ``checkpoint`` is in, read, and every file a load reads
    checked against its manifest (before anything of the folder is read); None for a
    checkpoint ``quarl recover`` did not write."""
    path = find_recovery(checkpoint)
    if path is None:
        return None
    record = read_recovery_record(path)
    check_manifest(path, record["files"])
    check_reads(path, record["files"], zoo_paths(checkpoint)[0])
    return RecoveredFolder(path, record)


def load_recovered(checkpoint: Path, trust_pickle: bool = False,
                   checked: RecoveredFolder | None = None) -> Recovered | None:
    """The original and the recovered kernel of a folder written by :func:`write_recovered`
    (None for any other checkpoint); a file that does not match its recorded hash is refused.
    ``checked``: the folder as its load already checked it (:func:`check_recovered`)."""
    from quarl.core.limits import model_file_cap, read_capped
    from quarl.policies.onnx_artifact import load_artifact
    from quarl.policies.zoo import load_zoo

    folder = checked or check_recovered(checkpoint)
    if folder is None:
        return None
    path, record = folder.record_path, folder.record
    original_sha, onnx_sha = record["original"]["zip_sha256"], record["recovered"]["onnx_sha256"]
    recovered_sha, precision = record["recovered"]["zip_sha256"], record["precision"]
    original_zip = path.parent / ORIGINAL_ZIP
    if not original_zip.is_file() or sha256_file(original_zip) != original_sha:
        raise QuarlError(f"{original_zip} is missing or is not the original policy recorded in {path.name}")
    zip_path, _ = zoo_paths(checkpoint)
    if sha256_file(zip_path) != recovered_sha:
        raise QuarlError(f"{zip_path} is not the recovered policy recorded in {path.name} (its SHA-256 differs): run "
                         "quarl recover again")
    export = zip_path.parent / EXPORT_DIR
    for name in ("policy.onnx", "policy.json"):
        if not (export / name).is_file():
            raise QuarlError(f"{export / name} is missing: the recovered folder is incomplete; run quarl recover again")
    # the original acts as its own folder did: the same zoo files, its own weights
    original = load_zoo(checkpoint, trust_pickle=trust_pickle, zip_override=original_zip).policy
    kernel, _ = load_artifact(export)
    digest = hashlib.sha256(read_capped(export / "policy.onnx", model_file_cap(), "an ONNX model")).hexdigest()
    if digest != onnx_sha:
        raise QuarlError(f"{export / 'policy.onnx'} is not the recovered model recorded in {path.name}: run quarl "
                         "recover again")
    meta = kernel.meta.copy()
    if "exploration_rate" in original.meta:  # a stochastic DQN explores as its original does
        meta["exploration_rate"] = original.meta["exploration_rate"]
    # the export's policy at the recorded precision: a new policy, nothing changed after it is built
    return Recovered(original, dataclasses.replace(kernel, precision=precision, meta=meta), precision, record)
