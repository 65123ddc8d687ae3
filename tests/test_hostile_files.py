"""Hostile files (issue 46, "trust"): quarl never deletes, truncates or appends outside what
it created, reads a recovered folder's files only as far as its manifest vouches for them,
publishes files that belong together whole, and says in one line when a disk limit stops a
write, leaving nothing half written as if whole.

Each case is the probe's: a link in an output folder to another folder or file (a folder
copied with its links), a named pipe where a lock is, a manifest naming /proc or a 1 TB
sparse file, a recovered folder whose original is another policy, a writer killed between
two renames, two writers in one folder, a file-size limit (``ulimit -f``)."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quarl.core import atomic
from quarl.core.errors import QuarlError
from quarl.recovery import RecoverConfig, load_recovered, run_recover
from tests import forked_cli
from tests.conftest import run_cli
from tests.test_recovered_manifest import CONFIG
from tests.test_study_full_disk import _leave_free, small_disk  # noqa: F401  (a 1 MB tmpfs, where root may mount one)

ROOT = Path(__file__).resolve().parents[1]
PTQ = ["--env", "CartPole-v1", "--precisions", "fp32", "--episodes", "2", "--max-steps", "50", "--decide-episodes", "0"]


def _one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in err, err[-2000:]
    return errors[0]


def _agent(folder: Path, seed: int = 0) -> Path:
    from stable_baselines3 import PPO

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64, n_epochs=1, seed=seed, device="cpu",
                policy_kwargs={"net_arch": [16]})
    model.learn(64)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"ppo-{seed}.zip"
    model.save(path)
    return path


def _recover(agent: Path, out: Path) -> Path:
    """``agent`` recovered into ``out`` (one short round: CONFIG)."""
    import quarl

    loaded = quarl.load(agent, env="CartPole-v1")
    run_recover(agent, loaded.env_spec, loaded.policy, CONFIG, out)
    return out


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _agent(tmp_path_factory.mktemp("agent"))


@pytest.fixture(scope="module")
def recovered(agent: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _recover(agent, tmp_path_factory.mktemp("recovered") / "rec")


def _victim(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A user's folder beside the output, with a file of its own."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("the user's\n")
    return victim, _snapshot(victim)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------- links in an output folder


@pytest.mark.parametrize("where", ["export", "CartPole-v1", ".recover", "verdict"])
def test_recover_never_removes_or_writes_through_a_link_in_its_out(agent: Path, tmp_path: Path, where: str) -> None:
    """OUT/export or OUT/CartPole-v1 a link to the user's folder: "strays removed" deleted
    that folder's files and recover wrote its own there; now one line naming the link,
    before any work, and the folder as it was."""
    victim, before = _victim(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / where).symlink_to(victim)
    r = run_cli("recover", str(agent), "--env", "CartPole-v1", "--precision", "int4", "--out", str(out))
    line = _one_line(r.stderr)
    assert r.returncode == 2 and f"{out / where} is a symbolic link (to {victim})" in line, line
    assert _snapshot(victim) == before and (out / where).is_symlink()


def test_a_study_s_recovered_column_never_writes_through_a_link(tiny_run: Path, tmp_path: Path) -> None:
    """``quarl study fp32,rec-int8``: S/recovered/AGENT/export a link to the user's folder."""
    import quarl

    victim, before = _victim(tmp_path)
    sha = quarl.load(tiny_run).policy.fingerprint()
    study = tmp_path / "study"
    agent_folder = study / "recovered" / f"{sha[:12]}-int8"
    agent_folder.mkdir(parents=True)
    (agent_folder / "export").symlink_to(victim)
    r = run_cli("study", str(tiny_run), "--precisions", "fp32,rec-int8", "--seeds", "0", "--episodes", "1",
                "--max-steps", "50", "--out", str(study))
    line = _one_line(r.stderr)
    assert r.returncode == 2 and f"{agent_folder / 'export'} is a symbolic link" in line, line
    assert _snapshot(victim) == before


@pytest.mark.parametrize("name", [".lock", "results.jsonl"])
def test_ptq_never_truncates_or_appends_to_a_file_a_link_leads_to(agent: Path, tmp_path: Path, name: str) -> None:
    """OUT/.lock a link: the user's file was truncated to nothing; OUT/results.jsonl a link:
    the results were appended to the user's file. Now one line, the file as it was."""
    user_file = tmp_path / "notes.txt"
    user_file.write_text("the user's notes\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / name).symlink_to(user_file)
    r = run_cli("ptq", str(agent), *PTQ, "--out", str(out))
    line = _one_line(r.stderr)
    assert r.returncode == 2 and f"{out / name} is a symbolic link (to {user_file})" in line, line
    assert user_file.read_text() == "the user's notes\n"


@pytest.mark.timeout(120)
def test_a_named_pipe_as_the_lock_is_one_line_not_a_hang(agent: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / ".lock")
    r = run_cli("ptq", str(agent), *PTQ, "--out", str(out))
    line = _one_line(r.stderr)
    assert r.returncode == 2 and f"{out / '.lock'} is a named pipe, not a regular file" in line, line


@pytest.mark.parametrize("name", ["study.sqlite", "study.sqlite-wal"])
def test_a_study_store_through_a_link_is_refused_and_the_user_s_database_kept(tmp_path: Path, name: str) -> None:
    """SQLite follows a link: S/study.sqlite (or its write-ahead log) a link to the user's
    database had the study's table created in it."""
    import sqlite3

    from quarl.study.store import StudyStore

    user_db = tmp_path / "mine.sqlite"
    db = sqlite3.connect(user_db)
    db.execute("CREATE TABLE notes (text)")
    db.commit()
    db.close()
    before = user_db.read_bytes()
    out = tmp_path / "study"
    out.mkdir()
    (out / name).symlink_to(user_db)
    with pytest.raises(QuarlError, match=f"{out / name} is a symbolic link"):
        StudyStore(out / "study.sqlite")
    assert user_db.read_bytes() == before and not Path(f"{user_db}-wal").exists()


OUTSIDE = ("absent", "file", "link to a file", "link to a folder", "fifo", "folder")


def _place(path: Path, kind: str, outside: Path) -> None:
    if kind == "file":
        path.write_text("quarl's old one\n")
    elif kind == "link to a file":
        path.symlink_to(outside / "file.txt")
    elif kind == "link to a folder":
        path.symlink_to(outside / "folder")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lock=st.sampled_from(OUTSIDE), log=st.sampled_from(OUTSIDE), table=st.sampled_from(OUTSIDE),
       sub=st.sampled_from(OUTSIDE))
def test_whatever_sits_in_an_output_folder_nothing_outside_it_changes(lock: str, log: str, table: str,
                                                                       sub: str) -> None:
    """Every writer of quarl.core.atomic (and the lock and the results log) over whatever a
    hostile hand put at its names: each writes what it owns or says one line; the folder
    outside is byte for byte as it was, and no call blocks on a pipe."""
    from quarl.core.records import ResultsLog
    from quarl.evaluation.cells import output_lock

    with tempfile.TemporaryDirectory() as tmp:
        outside, out = Path(tmp) / "outside", Path(tmp) / "out"
        (outside / "folder").mkdir(parents=True)
        (outside / "file.txt").write_text("the user's\n")
        (outside / "folder" / "policy.onnx").write_text("the user's model\n")
        (outside / "folder" / "table.csv").write_text("the user's table\n")
        out.mkdir()
        for name, kind in ((".lock", lock), ("results.jsonl", log), ("table.csv", table), ("export", sub)):
            _place(out / name, kind, outside)
        before = _snapshot(outside)
        def lock() -> None:
            with output_lock(out):
                pass

        writers = [
            lock,
            lambda: ResultsLog(out / "results.jsonl").append({"cell": 1}),
            lambda: atomic.write_all_atomic([(out / "table.csv", "a,b\n"), (out / "table.md", "| a |\n")]),
            lambda: atomic.write_atomic(atomic.owned_folder(out, "export") / "policy.onnx", b"onnx"),
        ]
        for write in writers:
            try:
                write()
            except QuarlError as exc:
                assert "\n" not in str(exc) and str(out) in str(exc)
        assert _snapshot(outside) == before
        if table != "folder":  # a link at table.csv is replaced itself, never its target
            assert (out / "table.csv").read_text() == "a,b\n" and not (out / "table.csv").is_symlink()


# ---------------------------------------------------------------------------- the recovered folder's manifest


def _copy(recovered: Path, tmp_path: Path) -> Path:
    out = tmp_path / "rec"
    shutil.copytree(recovered, out)
    return out


def _listed(out: Path, rel: str, digest: str) -> None:
    """Add ``rel`` to the manifest with ``digest``, as a hand that rewrites recovery.json would."""
    from quarl.recovery.folder import record_digest

    record_path = out / "CartPole-v1" / "recovery.json"
    record = json.loads(record_path.read_text())
    record["files"][rel] = digest
    record["record_sha256"] = record_digest(record)  # the hand hashes the record again, as recover would
    record_path.write_text(json.dumps(record, indent=1))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["link to /proc/self/pagemap", "1 TB sparse file", "link to a copy"])
def test_a_manifest_naming_an_endless_file_is_refused_without_hashing_it(recovered: Path, tmp_path: Path,
                                                                          kind: str) -> None:
    """sha256 of /proc/self/pagemap (through a link) or of a 1 TB sparse file ran for hours;
    now only a regular file of bounded size is hashed, and a link is refused."""
    out = _copy(recovered, tmp_path)
    target = out / "export" / "extra.bin"
    if kind == "link to /proc/self/pagemap":
        target.symlink_to("/proc/self/pagemap")
        expected = "is a symbolic link"
    elif kind == "link to a copy":  # the same bytes, elsewhere (a folder copied with cp -s): not the folder's own
        shutil.copy(out / "export" / "policy.onnx", tmp_path / "elsewhere.onnx")
        (out / "export" / "policy.onnx").unlink()
        (out / "export" / "policy.onnx").symlink_to(tmp_path / "elsewhere.onnx")
        target = out / "export" / "policy.onnx"
        expected = "is a symbolic link"
    else:
        with target.open("wb") as fh:
            fh.truncate(1 << 40)
        expected = f"has {1 << 40} bytes, more than"
    if target.name == "extra.bin":
        _listed(out, "export/extra.bin", "0" * 64)
    with pytest.raises(QuarlError, match=expected):
        load_recovered(out)
    r = run_cli("play", str(out), "--episodes", "1", "--max-steps", "10")
    assert r.returncode == 2 and expected in _one_line(r.stderr)


def test_load_best_of_a_recovered_folder_refuses_files_its_manifest_does_not_list(recovered: Path, tmp_path: Path,
                                                                                   agent: Path) -> None:
    """``quarl play OUT --load-best``: an added best_model.zip and env_kwargs.yml were never
    checked (the folder was not seen as a recovered one), and the edited env played."""
    from quarl.checkpoints import load_checkpoint

    out = _copy(recovered, tmp_path)
    shutil.copy(_agent(tmp_path / "other", seed=3), out / "best_model.zip")
    r = run_cli("play", str(out), "--load-best", "--episodes", "1", "--max-steps", "10")
    line = _one_line(r.stderr)
    assert r.returncode == 2 and f"{out / 'best_model.zip'} is not a file recovery wrote" in line, line
    with pytest.raises(QuarlError, match="best_model.zip is not a file recovery wrote"):
        load_checkpoint(out / "best_model.zip")
    (out / "CartPole-v1" / "env_kwargs.yml").write_text("max_episode_steps: 3\n")
    r = run_cli("play", str(out), "--load-best", "--episodes", "1", "--max-steps", "10")
    assert r.returncode == 2 and "env_kwargs.yml is not a file recovery wrote" in _one_line(r.stderr)
    (out / "best_model.zip").unlink()
    (out / "CartPole-v1" / "env_kwargs.yml").unlink()
    r = run_cli("play", str(out), "--episodes", "1", "--max-steps", "10")
    assert r.returncode == 0, r.stderr  # the folder as recover wrote it still plays


def test_a_reused_folder_s_original_is_checked_not_trusted(recovered: Path, agent: Path, tmp_path: Path) -> None:
    """A folder recovered from another policy whose recovery.json claims this policy's
    fingerprint (its manifest intact: recovery.json lists the others, not itself): recover
    reused it, so the verdict's fp32 row was the other policy's. Now the original.zip is
    loaded and fingerprinted: not this policy, so it is recovered again, from this one."""
    import quarl

    other_agent = _agent(tmp_path / "other", seed=5)
    mine = quarl.load(agent, env="CartPole-v1")
    assert quarl.load(other_agent, env="CartPole-v1").policy.fingerprint() != mine.policy.fingerprint()
    out = _recover(other_agent, tmp_path / "rec")
    record_path = out / "CartPole-v1" / "recovery.json"
    record = json.loads(record_path.read_text())
    record["original"]["policy_sha256"] = mine.policy.fingerprint()
    record_path.write_text(json.dumps(record, indent=1))
    shutil.rmtree(out / ".recover")  # a finished folder handed over (a state left there is refused: another teacher's)
    written, _ = run_recover(agent, mine.env_spec, mine.policy, CONFIG, out)
    original = out / "CartPole-v1" / "original.zip"
    assert original.read_bytes() == agent.read_bytes() != other_agent.read_bytes()
    assert written["original"]["zip_sha256"] == hashlib.sha256(agent.read_bytes()).hexdigest()
    loaded = load_recovered(out)
    assert loaded is not None and loaded.original.fingerprint() == mine.policy.fingerprint()


# ---------------------------------------------------------------------------- files published together


KILLED_BETWEEN_RENAMES = """
import os, signal, sys
real = os.replace
def replace(src, dst, *args, **kwargs):
    if str(dst).endswith("policy.json"):  # the model is renamed, its sidecar not yet
        os.kill(os.getpid(), signal.SIGKILL)
    return real(src, dst, *args, **kwargs)
os.replace = replace
from quarl.cli import app
app(sys.argv[1:])
"""


def _whole(export: Path) -> dict:
    sidecar = json.loads((export / "policy.json").read_text())
    assert sidecar["onnx_sha256"] == hashlib.sha256((export / "policy.onnx").read_bytes()).hexdigest()
    assert sorted(p.name for p in export.iterdir()) == ["policy.json", "policy.onnx"]  # no record, no temporary
    return sidecar


@pytest.mark.timeout(300)
def test_an_export_killed_between_its_two_renames_is_published_whole(agent: Path, tmp_path: Path) -> None:
    """SIGKILL after the model's rename, before the sidecar's: the new model sat beside the
    old sidecar (ptq refused the folder: the hashes differ). Now the rename record finishes
    the publication when the folder is next read: the int8 export, whole."""
    export = tmp_path / "export"
    r = run_cli("export", str(agent), "--env", "CartPole-v1", "--precision", "fp32", "--out", str(export))
    assert r.returncode == 0 and _whole(export)["precision"] == "fp32", r.stderr
    killed = forked_cli.run_code(ROOT, KILLED_BETWEEN_RENAMES, "export", str(agent), "--env", "CartPole-v1",
                                 "--precision", "int8", "--out", str(export))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]  # killed where the probe killed it
    r = run_cli("ptq", str(export), "--episodes", "1", "--max-steps", "20", "--decide-episodes", "0", "--out",
                str(tmp_path / "ptq"))
    assert r.returncode == 0, r.stderr
    assert _whole(export)["precision"] == "int8"


def test_two_writers_in_one_folder_publish_one_s_files_not_a_mix(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Two exports into one --out: the first renamed its model, the second both its files,
    then the first its sidecar: one's model with the other's sidecar, both exit 0. Now a
    publication holds the folder's lock from its record to its last rename."""
    first_in, second_done = threading.Event(), threading.Event()
    real = os.replace

    def replace(src: str, dst: str) -> None:
        real(src, dst)
        if threading.current_thread().name == "first" and str(dst).endswith("model.onnx"):
            first_in.set()
            second_done.wait(timeout=2)  # the second runs here if nothing holds it

    monkeypatch.setattr(atomic.os, "replace", replace)

    def publish(tag: str) -> None:
        atomic.write_all_atomic([(tmp_path / "model.onnx", tag), (tmp_path / "model.json", tag)])

    first = threading.Thread(target=publish, args=("first",), name="first")
    first.start()
    assert first_in.wait(timeout=30)
    second = threading.Thread(target=lambda: (publish("second"), second_done.set()), name="second")
    second.start()
    first.join(timeout=30)
    second.join(timeout=30)
    assert (tmp_path / "model.onnx").read_text() == (tmp_path / "model.json").read_text() == "second"


def test_a_publication_record_that_is_not_quarl_s_is_one_line(tmp_path: Path) -> None:
    for text in ('{"files": [["../../etc/passwd", ".x.tmp"]]}', '{"files": [["a", "b"]]}', "[" * 10_000, "{}"):
        (tmp_path / atomic.PUBLISHING).write_text(text)
        with pytest.raises(QuarlError, match="is not a record quarl wrote"):
            atomic.finish_publishing(tmp_path)
    (tmp_path / atomic.PUBLISHING).unlink()
    (tmp_path / atomic.PUBLISHING).symlink_to("/dev/zero")
    with pytest.raises(QuarlError, match="is a symbolic link"):
        atomic.finish_publishing(tmp_path)


def test_a_half_publication_that_cannot_be_finished_is_one_line(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder the reader may not rename in (read-only, as a shared mount is): one line
    saying what was left half done, never a traceback nor the half read as whole."""
    import errno

    (tmp_path / "a").write_text("new")
    (tmp_path / ".a.1.1.tmp").write_text("newer")
    (tmp_path / atomic.PUBLISHING).write_text(json.dumps({"files": [["a", ".a.1.1.tmp"]]}))

    def read_only(src: str, dst: str) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(atomic.os, "replace", read_only)
    with pytest.raises(QuarlError, match=r"holds files quarl began to replace together \(a\) and was stopped: they "
                                         r"cannot be finished here \(Read-only file system\)"):
        with atomic.reading_published(tmp_path):
            pass
    monkeypatch.undo()
    with atomic.reading_published(tmp_path):  # writable again: finished
        assert (tmp_path / "a").read_text() == "newer" and not (tmp_path / atomic.PUBLISHING).exists()


# ---------------------------------------------------------------------------- disk limits


def _limited(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


@pytest.mark.timeout(300)
def test_a_video_past_a_file_size_limit_is_one_line_and_no_cut_file(agent: Path, tmp_path: Path) -> None:
    """``ulimit -f`` (SIGXFSZ as the shell leaves it): ffmpeg's mp4 was cut at the limit and
    play said it wrote it; now one line, no mp4 and no temporary. With room, both videos."""
    videos = tmp_path / "videos"
    quarl = [str(Path(sys.executable).with_name("quarl")), "play", str(agent), "--env", "CartPole-v1", "--episodes",
             "2", "--max-steps", "60", "--video", str(videos)]
    r = subprocess.run(quarl, preexec_fn=lambda: _limited(3000), capture_output=True, text=True, timeout=240)
    line = _one_line(r.stderr)
    assert r.returncode == 2 and f"{videos / 'fp32-episode-0.mp4'} could not be written (File too large)" in line, line
    assert list(videos.iterdir()) == []
    r = run_cli(*quarl[1:])  # with room (no limit to inherit: in this process)
    assert r.returncode == 0 and "wrote 2 videos" in r.stdout, r.stderr
    assert sorted(p.name for p in videos.iterdir()) == ["fp32-episode-0.mp4", "fp32-episode-1.mp4"]


@pytest.mark.timeout(300)
def test_a_video_on_a_full_disk_is_one_line_and_no_cut_file(agent: Path, small_disk: Path) -> None:  # noqa: F811
    """A full tmpfs: ffmpeg fails (ENOSPC), moviepy ignored it, play said "wrote 1 video"."""
    _leave_free(small_disk, 2000)
    videos = small_disk / "videos"
    r = run_cli("play", str(agent), "--env", "CartPole-v1", "--episodes", "1", "--max-steps", "60", "--video",
                str(videos))
    line = _one_line(r.stderr)
    assert r.returncode == 2 and f"{videos / 'fp32-episode-0.mp4'} could not be written (No space left" in line, line
    assert list(videos.iterdir()) == []


UNDER_A_LIMIT = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # as quarl's console script does
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
from quarl.core.errors import QuarlError
try:
    exec(sys.argv[2])
except QuarlError as exc:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)
"""


def _run_limited(limit: int, code: str) -> subprocess.CompletedProcess:
    """``python -c UNDER_A_LIMIT LIMIT CODE``: a process of its own, forked from one that has
    imported torch and quarl (:mod:`tests.forked_cli`: 2 s of CPU less a case). Its stdout and
    stderr are files, under the limit too: each case prints far less than its limit (a line)."""
    return forked_cli.run_code(ROOT, UNDER_A_LIMIT, str(limit), code)


def test_torch_s_writer_past_a_file_size_limit_is_one_line(tmp_path: Path) -> None:
    """torch.save past RLIMIT_FSIZE says "unexpected pos 704 vs 598", not EFBIG: it was a
    traceback; now the disk's reason, in one line, and the file as it was."""
    path = tmp_path / "state.pt"
    code = (f"import torch; from pathlib import Path; from quarl.core.atomic import write_atomic; "
            f"write_atomic(Path({str(path)!r}), lambda tmp: torch.save({{'a': torch.zeros(100_000)}}, tmp))")
    path.write_bytes(b"the previous checkpoint")
    r = _run_limited(50_000, code)
    line = _one_line(r.stderr)
    assert r.returncode == 2 and f"{path} could not be written (File too large)" in line, line
    assert path.read_bytes() == b"the previous checkpoint" and list(tmp_path.iterdir()) == [path]


@pytest.mark.timeout(300)
def test_recover_s_state_past_a_file_size_limit_keeps_the_previous_one(agent: Path, tmp_path: Path) -> None:
    """A recovery's state.pt (written after each round) under ``ulimit -f``: one line, the
    state of the round before intact (it resumes)."""
    import quarl
    from quarl.recovery import distill, pick_spec, read_state

    loaded = quarl.load(agent, env="CartPole-v1")
    config = RecoverConfig(precision="int4", rounds=2, max_rounds=2, updates_per_round=10, finetune_steps=0,
                           closed_loop=False, episodes_per_round=1)
    spec, _ = pick_spec(loaded.policy, loaded.env_spec, config)
    state = tmp_path / ".recover" / "state.pt"
    distill(loaded.policy, loaded.env_spec, config, spec, state, rounds=1)
    before = state.read_bytes()
    code = (f"import quarl; from pathlib import Path; from quarl.recovery import RecoverConfig, distill, pick_spec\n"
            f"loaded = quarl.load(Path({str(agent)!r}), env='CartPole-v1')\n"
            f"config = {config!r}\n"
            f"spec, _ = pick_spec(loaded.policy, loaded.env_spec, config)\n"
            f"distill(loaded.policy, loaded.env_spec, config, spec, Path({str(state)!r}), rounds=2, keep_going=True)")
    r = _run_limited(len(before), code)
    line = _one_line(r.stderr)
    assert r.returncode == 2 and f"{state} could not be written (File too large)" in line, line
    assert state.read_bytes() == before and read_state(state)["history"]
    assert [p.name for p in state.parent.iterdir()] == ["state.pt"]


@pytest.mark.timeout(300)
def test_actorq_s_checkpoint_past_a_file_size_limit_keeps_the_previous_one(tmp_path: Path) -> None:
    """ActorQ's checkpoint.pt under ``ulimit -f``: one line, the previous checkpoint intact
    (the run resumes from it)."""
    from dataclasses import replace

    from quarl.actorq.config import ActorQConfig
    from quarl.actorq.system import run_actorq

    config = ActorQConfig.flat("CartPole-v1", local=True, max_minutes=3.0, out=tmp_path / "run", actors=1,
                               policy_layers=(32, 32), batch_size=32, min_replay=100, eval_episodes=1,
                               max_env_steps=300)
    run_actorq(config)
    checkpoint = tmp_path / "run" / "checkpoint.pt"
    before = checkpoint.read_bytes()
    code = ("from dataclasses import replace; from pathlib import Path; from quarl.actorq.config import ActorQConfig; "
            "from quarl.actorq.system import run_actorq\n"
            "config = ActorQConfig.flat('CartPole-v1', local=True, max_minutes=3.0, "
            f"out=Path({str(tmp_path / 'run')!r}), "
            "actors=1, policy_layers=(32, 32), batch_size=32, min_replay=100, eval_episodes=1, max_env_steps=600)\n"
            "run_actorq(config, resume=True)")
    r = _run_limited(len(before), code)
    line = _one_line(r.stderr)
    assert r.returncode == 2 and "could not be written (File too large)" in line, line
    assert checkpoint.read_bytes() == before
    assert not [p for p in (tmp_path / "run").iterdir() if ".tmp" in p.name]
    more = run_actorq(replace(config, max_env_steps=600), resume=True)  # the previous checkpoint resumes
    assert more.env_steps >= 600
