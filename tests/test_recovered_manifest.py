"""A recovered folder's files under one manifest of SHA-256 hashes (recovery.json's
``files``): every file the folder holds (the zip, the zoo files, original.zip, the export
and its sidecar) is checked before the folder is loaded (ptq) or reused (a recover rerun);
a changed, missing or added file is one line naming it, and a rerun writes the folder again."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from quarl.core.errors import QuarlError
from quarl.recovery import RecoverConfig, load_recovered, run_recover
from tests.conftest import run_cli

CONFIG = RecoverConfig(precision="int4", rounds=1, max_rounds=1, updates_per_round=20, finetune_steps=0,
                       closed_loop=False)
FILES = {"CartPole-v1.zip", "CartPole-v1/args.yml", "CartPole-v1/config.yml", "CartPole-v1/original.zip",
         "export/policy.onnx", "export/policy.json"}


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stable_baselines3 import PPO

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu",
                policy_kwargs={"net_arch": [16]})
    model.learn(64)
    path = tmp_path_factory.mktemp("agent") / "ppo-cartpole.zip"
    model.save(path)
    return path


@pytest.fixture(scope="module")
def recovered(agent: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import quarl

    loaded = quarl.load(agent, env="CartPole-v1")
    out = tmp_path_factory.mktemp("recovered") / "rec"
    run_recover(agent, loaded.env_spec, loaded.policy, CONFIG, out)
    return out


def _copy(recovered: Path, tmp_path: Path) -> Path:
    out = tmp_path / "rec"
    shutil.copytree(recovered, out)
    return out


def _record(out: Path) -> dict:
    return json.loads((out / "CartPole-v1" / "recovery.json").read_text())


def _rewrite(out: Path, record: dict) -> None:
    """recovery.json rewritten by a hand that hashes it again (its record_sha256), as recover would."""
    from quarl.recovery.folder import record_digest

    (out / "CartPole-v1" / "recovery.json").write_text(json.dumps({**record, "record_sha256": record_digest(record)}))


def test_recovery_json_is_laid_out_as_an_earlier_quarl_wrote_it(recovered: Path) -> None:
    """The fields of tests/data/recovery_v1's record (written before recovery.json had one
    schema), in its order, each object's too; read back as written."""
    from quarl.recovery import read_recovery_record

    path = recovered / "CartPole-v1" / "recovery.json"
    written = json.loads(path.read_text())
    before = json.loads((Path(__file__).parent / "data" / "recovery_v1" / "folder" / "CartPole-v1" /
                         "recovery.json").read_text())
    from quarl.core.cpu_kind import cpu_kind

    # issue 50 added two optional fields after shipped_stage (the run's own kernel, the models' sizes), issue 48 the
    # record's own hash, last: an earlier record without them still reads (tests/test_recovery_files.py), and every
    # other field keeps its place
    assert [k for k in written if k not in ("ptq_mode", "sizes", "record_sha256")] == list(before)
    assert list(written)[-1] == "record_sha256" and "record_sha256" not in before
    assert list(written)[list(written).index("shipped_stage") + 1:][:2] == ["ptq_mode", "sizes"]
    assert list(written["sizes"]) == ["fp32", "ptq", "shipped"]
    added = {"provenance": ["cpu_kind"]} if cpu_kind() != "native" else {}  # QUARL_CPU_KIND, recorded where it is set
    for key in ("kernel", "original", "recovered", "env", "config", "against_fp32", "budget", "provenance"):
        assert list(written[key]) == list(before[key]) + added.get(key, []), key
    assert list(written["rounds"][0]) == [*before["rounds"][0], "calibration_kept"]  # issue 48: the test's outcome
    assert list(written["stages"][0]) == list(before["stages"][0])
    assert read_recovery_record(path) == written and path.read_text() == json.dumps(written, indent=1)


def _add_normalizer(out: Path) -> None:
    """The issue's tampering: an obs_normalizer in the sidecar, the ONNX untouched."""
    sidecar = out / "export" / "policy.json"
    meta = json.loads(sidecar.read_text())
    meta["obs_normalizer"] = {"mean": [0.0, 0.0, 0.0, 0.0], "var": [1e-8, 1e-8, 1e-8, 1e-8], "epsilon": 1e-8,
                              "clip_obs": 10.0}
    sidecar.write_text(json.dumps(meta, indent=1))


def test_every_file_of_the_recovered_folder_is_in_its_manifest(recovered: Path) -> None:
    files = _record(recovered)["files"]
    assert set(files) == FILES
    assert all(len(digest) == 64 for digest in files.values())
    assert load_recovered(recovered) is not None


def test_ptq_refuses_a_sidecar_changed_after_recovery_in_one_line(recovered: Path, tmp_path: Path) -> None:
    """Before: ptq judged the tampered sidecar (a *loses* row with agree 100 %)."""
    out = _copy(recovered, tmp_path)
    _add_normalizer(out)
    with pytest.raises(QuarlError, match=r"export/policy.json changed since recovery wrote it"):
        load_recovered(out)
    r = run_cli("ptq", str(out), "--episodes", "2", "--out", str(tmp_path / "ptq"))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "policy.json changed since recovery wrote it" in lines[0], lines
    assert not (tmp_path / "ptq" / "results.jsonl").exists()


@pytest.mark.parametrize("damage", ["changed", "missing"])
@pytest.mark.parametrize("rel", sorted(FILES))
def test_a_changed_or_missing_file_is_named(recovered: Path, tmp_path: Path, rel: str, damage: str) -> None:
    out = _copy(recovered, tmp_path)
    path = out / rel
    if damage == "changed":
        path.write_bytes(path.read_bytes() + b"\n")
    else:
        path.unlink()
    with pytest.raises(QuarlError, match="changed since recovery wrote it" if damage == "changed" else "is missing"
                       ) as caught:
        load_recovered(out)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


@pytest.mark.parametrize("added", ["CartPole-v1/env_kwargs.yml", "CartPole-v1/vecnormalize.pkl", "export/extra.onnx"])
def test_a_file_added_to_the_folder_is_named(recovered: Path, tmp_path: Path, added: str) -> None:
    """A zoo file the original had not (env kwargs, normalization) would change how both play."""
    out = _copy(recovered, tmp_path)
    (out / added).write_text("{}\n")
    with pytest.raises(QuarlError, match="is not a file recovery wrote") as caught:
        load_recovered(out)
    assert str(out / added) in str(caught.value)


@pytest.mark.parametrize("edit", ["precision", "verdict", "layout", "older"])
def test_an_edit_of_recovery_json_itself_is_refused_in_one_line(recovered: Path, tmp_path: Path, edit: str) -> None:
    """recovery.json lists the other files' hashes, not its own: an edit of it (the precision
    the kernel is labelled with, the verdict recover printed) was read as written. Now its
    record_sha256 (its other fields' content) refuses it; the same content laid out otherwise,
    or a record an older quarl wrote without the field, reads as it is."""
    out = _copy(recovered, tmp_path)
    path = out / "CartPole-v1" / "recovery.json"
    record = _record(out)
    if edit == "precision":
        record["precision"] = "int8"
    elif edit == "verdict":
        record["against_fp32"]["verdict"] = "keeps (edited)"
    elif edit == "older":
        del record["record_sha256"]
    path.write_text(json.dumps(record, indent=None if edit == "layout" else 2))
    if edit in ("layout", "older"):
        loaded = load_recovered(out)
        assert loaded is not None and loaded.record == record
        return
    with pytest.raises(QuarlError) as refused:
        load_recovered(out)
    assert str(refused.value) == (f"{path} changed since recovery wrote it (its content differs from its "
                                  "record_sha256): run quarl recover again")


def test_a_record_without_a_manifest_is_refused(recovered: Path, tmp_path: Path) -> None:
    out = _copy(recovered, tmp_path)
    record = _record(out)
    del record["files"]
    (out / "CartPole-v1" / "recovery.json").write_text(json.dumps(record))
    with pytest.raises(QuarlError, match="lists no SHA-256 of its folder's files"):
        load_recovered(out)


@pytest.mark.parametrize("rel", ["../outside.txt", "/etc/hostname", "CartPole-v1.zip:x"])
def test_a_manifest_naming_a_path_outside_or_a_bad_hash_is_refused(recovered: Path, tmp_path: Path, rel: str) -> None:
    out = _copy(recovered, tmp_path)
    record = _record(out)
    if rel.endswith(":x"):
        record["files"][rel.removesuffix(":x")] = "not a hash"
        match = "files"
    else:
        record["files"][rel] = "0" * 64
        match = "outside the recovered folder"
    _rewrite(out, record)
    with pytest.raises(QuarlError, match=match):
        load_recovered(out)


def test_a_recover_rerun_writes_a_tampered_folder_again_instead_of_reusing_it(
        agent: Path, recovered: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before: the rerun reused the tampered folder as finished."""
    import quarl

    out = _copy(recovered, tmp_path)
    _add_normalizer(out)
    (out / "CartPole-v1" / "env_kwargs.yml").write_text("{}\n")  # a file recovery never wrote
    loaded = quarl.load(agent, env="CartPole-v1")
    with caplog.at_level(logging.WARNING, logger="quarl"):
        run_recover(agent, loaded.env_spec, loaded.policy, CONFIG, out)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("export/policy.json changed since recovery wrote it" in w and w.endswith(": recovering again")
               for w in warnings), warnings
    sidecar = json.loads((out / "export" / "policy.json").read_text())
    assert sidecar["obs_normalizer"] == json.loads((recovered / "export" / "policy.json").read_text())["obs_normalizer"]
    assert not (out / "CartPole-v1" / "env_kwargs.yml").exists()
    assert set(_record(out)["files"]) == FILES
    assert _record(out)["files"] == _record(recovered)["files"]  # the same recovery, written again
    assert load_recovered(out) is not None
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="quarl"):  # intact now: the next rerun reuses it
        run_recover(agent, loaded.env_spec, loaded.policy, CONFIG, out)
    assert any("finished: reused" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("added", [None, "CartPole-v1/vecnormalize.pkl"])
def test_any_load_of_a_recovered_folder_checks_its_manifest(recovered: Path, tmp_path: Path,
                                                            added: str | None) -> None:
    """Through the checkpoint registry (``quarl.load``, ``quarl play``), not only ptq: before,
    a pickle added to the folder was unpickled by any command that loaded it as a zoo folder."""
    import numpy as np

    from quarl.checkpoints import load_checkpoint
    from quarl.policies.formats import FORMATS

    assert FORMATS["recovered"].detect(recovered) and not FORMATS["recovered"].detect(tmp_path)
    out = _copy(recovered, tmp_path)
    if added is None:  # the student, as a plain zoo load of the folder gives it
        from quarl.policies.zoo import load_zoo

        x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
        got, plain = load_checkpoint(out).policy, load_zoo(out).policy
        np.testing.assert_array_equal(got.act(x), plain.act(x))
        return
    (out / added).write_bytes(b"not a pickle")
    with pytest.raises(QuarlError, match="is not a file recovery wrote"):
        load_checkpoint(out)
    r = run_cli("play", str(out), "--episodes", "1")
    assert r.returncode == 2 and "is not a file recovery wrote" in r.stdout + r.stderr, r.stdout + r.stderr


def test_ptq_reads_and_hashes_a_recovered_folder_once(recovered: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recovered format's load hands ptq the record it checked (its payload): the original
    and the kernel are then loaded without hashing the folder again."""
    from quarl.checkpoints import load_checkpoint
    from quarl.recovery import folder
    from quarl.recovery.loader import recovered_cells

    hashed: list[Path] = []
    check = folder.check_manifest
    monkeypatch.setattr(folder, "check_manifest", lambda path, files: (hashed.append(path), check(path, files)))
    ckpt = load_checkpoint(recovered)
    assert ckpt.format == "recovered" and len(hashed) == 1
    payload = ckpt.payload_of(folder.RecoveredFolder)
    assert payload is not None and payload.record == _record(recovered)
    spec = ckpt.env_spec
    assert spec is not None
    cells, precision = recovered_cells(recovered, payload, spec, False, False)
    assert precision == "int4" and set(cells) == {"fp32", "int4"} and len(hashed) == 1
    assert folder.load_recovered(recovered) is not None and len(hashed) == 2  # without it: read and hashed again
