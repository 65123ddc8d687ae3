"""Nothing quarl starts outlives a SIGKILL of quarl: the real command runs in a subprocess,
is killed with ``kill -9`` (no clean-up runs), and every process it had started (the
evaluation fork server, its workers, multiprocessing's resource tracker) must be gone
within a generous bound."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.conftest import ZOO

GONE_WITHIN_S = 30.0
"""A bound for a loaded machine: the processes end in well under a second (the kernel's
parent-death signal), or within a poll of their parent (0.5 s) where it is missing."""


def _agent(request: pytest.FixtureRequest) -> Path:
    zoo = ZOO / "ppo" / "CartPole-v1_1"
    return zoo if zoo.exists() else request.getfixturevalue("tiny_run")


def _gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _kill_all(processes: list[psutil.Process], proc: subprocess.Popen) -> None:
    """End whatever a failed test left running (never the rest of the suite's business)."""
    for p in processes:
        try:
            p.kill()
        except psutil.Error:
            pass
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _survivors(tree: list[psutil.Process], within_s: float) -> list[psutil.Process]:
    """Wait up to ``within_s`` for ``tree`` and anything they start to end; what is left."""
    known = {p.pid: p for p in tree}
    deadline = time.monotonic() + within_s
    while True:
        for p in list(known.values()):
            try:
                known.update({c.pid: c for c in p.children(recursive=True)})
            except psutil.NoSuchProcess:
                pass
        alive = [p for p in known.values() if not _gone(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _tree_when(main: psutil.Process, proc: subprocess.Popen, ready: Callable[[list[psutil.Process]], bool],
               poll_s: float) -> list[psutil.Process]:
    """``main``'s process tree once ``ready`` holds of it (or ``proc`` ended, or 300 s: a
    loaded machine starts late; the bound is not the point)."""
    tree: list[psutil.Process] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            tree = main.children(recursive=True)
            if ready(tree):
                break
        except psutil.NoSuchProcess:  # a process between two looks
            pass
        time.sleep(poll_s)
    return tree


def _server(tree: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in tree if "multiprocessing.forkserver" in " ".join(p.cmdline())]


def _playing(tree: list[psutil.Process]) -> bool:
    """Two workers (the fork server's children) that have used CPU: episodes are being played."""
    servers = _server(tree)
    workers = [w for s in servers for w in s.children()]
    return len(workers) >= 2 and all(sum(w.cpu_times()[:2]) > 0.3 for w in workers)


def _importing(tree: list[psutil.Process]) -> bool:
    """The fork server exists and has no worker yet: it is importing torch."""
    servers = _server(tree)
    return bool(servers) and not any(s.children() for s in servers)


@pytest.mark.slow
@pytest.mark.parametrize("when", ["playing", "importing"])
def test_nothing_ptq_started_outlives_a_sigkill(when: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """``quarl ptq --workers 2`` killed while its workers play episodes, or while its fork
    server still imports torch (before: the server lived on about 2 s, or 6 s, owned by
    init, and the resource tracker with it)."""
    ready: Callable[[list[psutil.Process]], bool] = _playing if when == "playing" else _importing
    log = tmp_path / "stderr.txt"
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "quarl.cli", "ptq", str(_agent(request)), "--precisions",
                                 "fp32,fp16", "--episodes", "3000", "--workers", "2", "--out", str(tmp_path / "out")],
                                env={**os.environ, "QUARL_WORKERS": "2"}, stdout=subprocess.DEVNULL, stderr=err)
    main = psutil.Process(proc.pid)
    tree: list[psutil.Process] = []
    try:
        tree = _tree_when(main, proc, ready, 0.05)
        assert proc.poll() is None and ready(tree), f"never {when}: {log.read_text()[-2000:]}"
        tree = main.children(recursive=True)
        names = {p.pid: " ".join(p.cmdline())[:80] for p in tree}
        assert any("resource_tracker" in n for n in names.values()), names  # the tracker is counted too
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        alive = _survivors(tree, GONE_WITHIN_S)
        assert not alive, [(p.pid, names.get(p.pid)) for p in alive]
    finally:  # a failed assertion never leaves 3,000 episodes playing under the rest of the suite
        _kill_all([*tree, main], proc)


def test_the_lifeline_ends_an_orphan_and_spares_a_child(tmp_path: Path) -> None:
    """quarl.core.lifeline alone: a grandchild guarded on its parent ends once that parent is
    SIGKILLed, with the kernel's signal and with only the polling thread (where prctl is
    missing), and one whose parent lives plays on."""
    code = r"""
import os, subprocess, sys, time
child = '''
import os, sys, time
from quarl.core import lifeline
lifeline.guard(os.getppid(), pdeathsig=sys.argv[1] == "1")
print("guarded", flush=True)
time.sleep(600)
'''
p = subprocess.Popen([sys.executable, "-c", child, sys.argv[1]], stdout=subprocess.PIPE)
assert p.stdout.readline() == b"guarded\n"
print(p.pid, flush=True)
time.sleep(600)
"""
    for pdeathsig in ("1", "0"):
        parent = subprocess.Popen([sys.executable, "-c", code, pdeathsig], stdout=subprocess.PIPE)
        try:
            assert parent.stdout is not None
            child = psutil.Process(int(parent.stdout.readline()))
            time.sleep(1.5)  # three polls: a child whose parent lives is not ended
            assert not _gone(child)
            parent.kill()
            parent.wait()
            assert not _survivors([child], GONE_WITHIN_S), f"pdeathsig={pdeathsig}"
        finally:
            parent.kill()
            parent.wait()
            parent.stdout.close()  # type: ignore[union-attr]


def test_a_reaper_ends_what_its_roots_started_once_the_process_that_started_it_is_killed() -> None:
    """quarl.core.lifeline.reap_after_exit: a root that ignores its parent's death (a shell)
    and the child it started are ended once the process holding the reaper's pipe is
    SIGKILLed; while it lives they are left alone."""
    code = r"""
import subprocess, sys, time
from quarl.core import lifeline
root = subprocess.Popen(["sh", "-c", "sleep 600 & wait"])
lifeline.reap_after_exit([root.pid])
print(root.pid, lifeline._reapers[-1].pid if lifeline._reapers else 0, flush=True)
time.sleep(600)
"""
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    tree: list[psutil.Process] = []
    try:
        assert parent.stdout is not None
        root_pid, reaper_pid = (int(n) for n in parent.stdout.readline().split())
        root = psutil.Process(root_pid)
        assert reaper_pid, "no reaper was started"
        deadline = time.monotonic() + 60
        while not root.children() and time.monotonic() < deadline:  # the shell starts its sleep
            time.sleep(0.05)
        tree = [root, *root.children()]
        assert len(tree) == 2
        reaper = [psutil.Process(reaper_pid)]
        assert not _gone(reaper[0]) and "reap()" in " ".join(reaper[0].cmdline()), "the reaper ended early"
        time.sleep(1.5)  # three of the reaper's polls: nothing is ended while its parent lives
        assert not any(_gone(p) for p in tree)
        parent.kill()
        parent.wait()
        assert not _survivors([*tree, *reaper], GONE_WITHIN_S)
    finally:
        for p in tree:
            try:
                p.kill()
            except psutil.Error:
                pass
        parent.kill()
        parent.wait()
        parent.stdout.close()  # type: ignore[union-attr]


@pytest.mark.slow
def test_nothing_a_local_ray_study_started_outlives_a_sigkill(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """``quarl study --workers 2`` (a local Ray of its own) killed while its cells play: Ray's
    GCS and raylet end with their driver, but the raylet's dashboard and runtime-env agents
    waited 60 s for the dead GCS (measured: 61 s); quarl's reaper ends them at once."""
    log = tmp_path / "stderr.txt"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}  # whatever ~/.ray holds (as tests/test_ray_cluster.py)
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "quarl.cli", "study", str(_agent(request)), "--precisions",
                                 "fp32,fp16", "--seeds", "0,1", "--episodes", "3000", "--workers", "2", "--out",
                                 str(tmp_path / "out")], env=env, stdout=subprocess.DEVNULL, stderr=err)
    main = psutil.Process(proc.pid)
    tree: list[psutil.Process] = []

    def cells_playing(tree: list[psutil.Process]) -> bool:
        names = {p.pid: p.name() for p in tree}
        agents = {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= set(names.values())
        cells = [p for p in tree if names[p.pid].startswith("ray::evaluate")]
        return agents and bool(cells) and all(sum(p.cpu_times()[:2]) > 0.3 for p in cells)

    try:
        tree = _tree_when(main, proc, cells_playing, 0.1)
        assert proc.poll() is None and cells_playing(tree), f"no cell played: {log.read_text()[-2000:]}"
        tree = main.children(recursive=True)
        names = {p.pid: p.name() for p in tree}
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        alive = _survivors(tree, GONE_WITHIN_S)
        assert not alive, [(p.pid, names.get(p.pid)) for p in alive]
    finally:
        _kill_all([*tree, main], proc)


def test_a_reaper_given_a_folder_ends_whoever_holds_a_file_there(tmp_path: Path) -> None:
    """quarl.core.lifeline.reap_after_exit(marker=...): started before any helper exists, it
    ends (once the process that started it is SIGKILLed) every process holding a file open
    under the folder, whoever started it (here one that left its parent: a daemon), and
    removes the folder; a process with files elsewhere is spared."""
    marked, elsewhere = tmp_path / "marked", tmp_path / "elsewhere"
    marked.mkdir()
    elsewhere.mkdir()
    code = r"""
import subprocess, sys, time
from quarl.core import lifeline
lifeline.reap_after_exit([], marker=sys.argv[1])
time.sleep(0.5)  # the reaper runs before the helper exists
def holder(folder):  # a daemon: its parent (a shell) exits at once, so it is no descendant of this process
    shell = subprocess.Popen(["sh", "-c", f"exec 3>{folder}/log; sleep 600 <&- >&- 2>&- & echo $!"],
                             stdout=subprocess.PIPE)
    return int(shell.stdout.readline())
print(holder(sys.argv[1]), holder(sys.argv[2]), lifeline._reapers[-1].pid, flush=True)
time.sleep(600)
"""
    parent = subprocess.Popen([sys.executable, "-c", code, str(marked), str(elsewhere)], stdout=subprocess.PIPE)
    helpers: list[psutil.Process] = []
    try:
        assert parent.stdout is not None
        inside, outside, reaper_pid = (int(n) for n in parent.stdout.readline().split())
        helpers = [psutil.Process(inside), psutil.Process(outside)]
        assert all(p.ppid() != parent.pid for p in helpers)  # not the parent's children: only the folder finds them
        time.sleep(1.0)
        assert not any(_gone(p) for p in helpers)  # nothing is ended while the parent lives
        parent.kill()
        parent.wait()
        assert not _survivors([helpers[0], psutil.Process(reaper_pid)], GONE_WITHIN_S)
        assert not _gone(helpers[1]) and not marked.exists() and elsewhere.exists()
    finally:
        _kill_all(helpers, parent)
        parent.stdout.close()  # type: ignore[union-attr]


def _ray_starting(phase: str) -> Callable[[list[psutil.Process]], bool]:
    """Ray's start has reached ``phase``: its GCS runs (``gcs``), or the raylet has started
    its agents (``agents``); no actor of the run exists yet (ray.init has not returned)."""
    def reached(tree: list[psutil.Process]) -> bool:
        names = {p.name() for p in tree}
        if any(name.startswith(("ray::RemoteActor", "ray::Broadcaster", "ray::Evaluator")) for name in names):
            return False
        return "gcs_server" in names if phase == "gcs" else "ray::DashboardAgent" in names
    return reached


@pytest.mark.slow  # each case starts a local Ray: 10 to 20 s on 2 shared cores
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("phase", ["gcs", "agents"])
def test_nothing_a_ray_actorq_run_started_outlives_it_when_stopped_while_ray_starts(
        phase: str, signum: int, tmp_path: Path) -> None:
    """``quarl actorq run`` on a local Ray, stopped while Ray starts (its GCS up, or its
    raylet's agents up, before ray.init returns): the agents outlived a SIGKILL or a SIGTERM
    (60 s: the reaper was started after ray.init, with pids it never learnt), and a SIGTERM
    exited 15 without a word (Ray's own handler). Now nothing outlives it, Ray's folder is
    removed, and a SIGTERM takes Ctrl-C's path (exit 143, the command that resumes)."""
    log = tmp_path / "stderr.txt"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "COLUMNS": "200"}
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "quarl.cli", "actorq", "run", "CartPole-v1", "--policy-layers",
                                 "8", "--actors", "1", "--max-minutes", "2", "--out", str(tmp_path / "run")], env=env,
                                stdout=subprocess.DEVNULL, stderr=err)
    main = psutil.Process(proc.pid)
    tree: list[psutil.Process] = []
    reached = _ray_starting(phase)
    try:
        tree = _tree_when(main, proc, reached, 0.01)
        assert proc.poll() is None and reached(tree), f"Ray never reached {phase}: {log.read_text()[-2000:]}"
        folders = {arg.split("=", 1)[1].split("/session_")[0] for p in tree for arg in p.cmdline()
                   if "quarl-ray-" in arg and "=" in arg}
        proc.send_signal(signum)
        proc.wait(120)
        tree = [*tree, *_survivors(tree, 0)]
        names = {p.pid: p.name() for p in tree if not _gone(p)}
        alive = _survivors(tree, GONE_WITHIN_S)
        assert not alive, [(p.pid, names.get(p.pid)) for p in alive]
        assert folders and not any(Path(f).exists() for f in folders), folders
        if signum == signal.SIGTERM:
            assert proc.returncode == 143 and "interrupted: what finished is kept; to continue, run: quarl actorq run" \
                in log.read_text(), (proc.returncode, log.read_text()[-2000:])
    finally:
        _kill_all([*tree, main], proc)
