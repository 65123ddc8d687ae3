"""Helper processes that end with the process that started them.

A SIGKILLed quarl runs no clean-up, so each process it starts must notice on its own that
quarl is gone: on Linux the kernel tells it (``prctl(PR_SET_PDEATHSIG)``: a signal when the
thread that started it ends), elsewhere, and as a second guard, a thread polls the parent.

Importing this module does nothing, except in the process it was named for: the
evaluation fork server imports it first of its preloaded modules (:func:`spawning_fork_server`
says which process spawns it, and whether that thread lives as long as its process), so
the server ends with quarl even while it is still importing torch.

Processes that quarl does not start itself (a local Ray's agents, started by its raylet)
are ended by a reaper (:func:`reap_after_exit`): a small process that outlives quarl just
long enough to end what quarl's helpers started: the descendants of the processes it was
given, and every process holding a file open in a folder it was given (a local Ray's
logs: each of its processes writes there, whoever started it)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

PARENT_POLL_S = 0.5
"""How often a guarded process checks that its parent is still alive."""

_ENV = "QUARL_LIFELINE_PARENT"
"""Set by the spawning process around the fork server's start: ``PID`` or ``PID:pdeathsig``
(the spawning thread is its process's main thread, so the kernel's parent-death signal,
sent when that thread ends, means the process ended)."""

_PR_SET_PDEATHSIG = 1


def parent_death_signal(signum: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``signum`` to this process when the thread that started it
    ends (Linux only); True when it was set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)) == 0
    except (OSError, AttributeError):  # pragma: no cover - no libc prctl
        return False


def exit_when_orphaned(parent: int, poll_s: float = PARENT_POLL_S) -> None:
    """A daemon thread that ends this process (``os._exit``, no clean-up: the parent that
    would have wanted one is gone) once its parent is no longer ``parent``: an orphan is
    adopted by init or a subreaper."""

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(poll_s)

    threading.Thread(target=watch, name="quarl-lifeline", daemon=True).start()


def guard(parent: int, pdeathsig: bool) -> None:
    """End this process with ``parent``: the kernel's signal where it is safe (``pdeathsig``)
    and a polling thread always."""
    if pdeathsig:
        parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the signal was asked for
        os._exit(1)
    exit_when_orphaned(parent)


_reapers: list[Any] = []
"""The reapers started by this process, kept so that their pipes stay open until it ends."""


def reap_after_exit(roots: list[int], marker: str | None = None) -> None:
    """Start a reaper: a process in a session of its own that, once this process ends
    (however: its end of a pipe closes), ends ``roots`` and every process they started
    meanwhile, and every process that then holds a file open under folder ``marker``
    (SIGTERM, then SIGKILL after a grace; the folder is removed after), for helpers that
    would otherwise linger (a local Ray's agents wait 60 s for its dead GCS before they
    exit). With a ``marker`` it is started before the helpers exist, so a kill at any
    moment of their start leaves none."""
    import subprocess

    import psutil

    stamped = []
    for pid in roots:
        try:
            stamped.append(f"{pid}:{psutil.Process(pid).create_time()!r}")
        except psutil.Error:
            continue
    if not stamped and marker is None:
        return
    marked = [f"--marker={marker}"] if marker is not None else []
    try:
        _reapers.append(subprocess.Popen([sys.executable, "-c", "from quarl.core.lifeline import reap; reap()",
                                          *marked, *stamped], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True))
    except OSError:  # pragma: no cover - no process to spare: Ray ends its own helpers, later
        pass


def holding_files_under(folder: str, since: float = 0.0, spare: int = 0) -> list[Any]:
    """The processes (psutil) of this user started at ``since`` or later, this one and
    ``spare`` excepted, with a file open under ``folder``: read from ``/proc/PID/fd`` on
    Linux (every descriptor, not only regular files), else from psutil's open files."""
    import psutil

    prefix = os.path.join(os.path.realpath(folder), "")
    found = []
    for p in psutil.process_iter(["uids", "create_time"]):
        if p.pid in (os.getpid(), spare) or (p.info["create_time"] or 0.0) < since or \
                (hasattr(os, "getuid") and p.info["uids"] and p.info["uids"].real != os.getuid()):
            continue
        try:
            if os.path.isdir(f"/proc/{p.pid}/fd"):
                links = []
                for fd in os.listdir(f"/proc/{p.pid}/fd"):
                    try:
                        links.append(os.readlink(f"/proc/{p.pid}/fd/{fd}"))
                    except OSError:  # closed between the two looks
                        continue
            else:  # pragma: no cover - not Linux
                links = [f.path for f in p.open_files()]
        except (OSError, psutil.Error):  # ended, or not ours to read
            continue
        if any(link.startswith(prefix) for link in links):
            found.append(p)
    return found


def reap(argv: list[str] | None = None, poll_s: float = PARENT_POLL_S, grace_s: float = 0.5) -> None:
    """The reaper's main (see :func:`reap_after_exit`): ``PID:CREATE_TIME`` roots in ``argv``,
    a process counted only while its start time matches (a pid reused later is spared)."""
    import select

    import psutil

    known: dict[int, float] = {}
    marker = None
    # the process that started this one may still be ending (its interpreter closes our pipe
    # before it exits) and holds files under the marker itself (a Ray driver's logs): it is
    # spared, and so is any process older than this one (the marker's helpers start after it)
    parent, since = os.getppid(), psutil.Process().create_time() - 0.05
    for item in argv if argv is not None else sys.argv[1:]:
        if item.startswith("--marker="):
            marker = item.removeprefix("--marker=")
            continue
        number, _, stamp = item.partition(":")
        known[int(number)] = float(stamp)

    def refresh() -> None:
        """Add what the known processes started; forget the ones that ended."""
        children: dict[int, list[tuple[int, float]]] = {}
        started: dict[int, float] = {}
        try:
            for p in psutil.process_iter(["ppid", "create_time"]):
                started[p.pid] = p.info["create_time"]
                children.setdefault(p.info["ppid"], []).append((p.pid, p.info["create_time"]))
        except (psutil.Error, OSError):  # the process table read mid-change: the next poll reads it again
            return
        for pid in [pid for pid, created in known.items() if started.get(pid) != created]:
            del known[pid]
        todo = list(known)
        while todo:
            for child, created in children.get(todo.pop(), []):
                if child not in known:
                    known[child] = created
                    todo.append(child)

    while True:
        if known:
            refresh()
        ready, _, _ = select.select([sys.stdin], [], [], poll_s if known else None)  # no roots: only the marker
        if ready and not os.read(sys.stdin.fileno(), 4096):
            break
    refresh()
    procs = []
    for pid, created in known.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created:
                procs.append(p)
        except psutil.Error:
            continue
    if marker is not None:
        procs += [p for p in holding_files_under(marker, since, parent) if p.pid not in known]
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    if marker is not None:  # and what a dying helper started meanwhile (a raylet's agent)
        alive += [p for p in holding_files_under(marker, since, parent) if p not in alive]
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            continue
    if marker is not None:
        import shutil

        psutil.wait_procs(alive, timeout=grace_s)
        shutil.rmtree(marker, ignore_errors=True)  # the logs of a cluster that no longer runs


class spawning_fork_server:
    """``with spawning_fork_server(): multiprocessing.forkserver.ensure_running()``: the
    server started inside finds its parent in the environment (and removes it there, so its
    workers do not take it for their own)."""

    def __enter__(self) -> None:
        main = threading.current_thread() is threading.main_thread()
        os.environ[_ENV] = f"{os.getpid()}:pdeathsig" if main else str(os.getpid())

    def __exit__(self, *exc: object) -> None:
        os.environ.pop(_ENV, None)


def _guard_from_environment() -> None:
    value = os.environ.pop(_ENV, "")
    pid, _, how = value.partition(":")
    # only the process spawned by that pid (the fork server); any other importer ignores it
    if pid.isdigit() and int(pid) == os.getppid():
        guard(int(pid), pdeathsig=how == "pdeathsig")


_guard_from_environment()
