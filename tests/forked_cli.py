"""``python -m quarl.cli ARGS`` as a process of its own, without a new interpreter importing
torch, SB3 and ONNX Runtime each time (2 s of CPU a command): a server imports them once, and
each command runs in a process forked from it, in its own folder and environment, with its own
stdin (empty), stdout and stderr, exit status and ``sys.path[0]`` (the folder, as ``-m`` puts it).
What a command imports beyond those (a ``--gym-packages`` module, a package in its folder) it
imports afresh. For tests about what a command does as a process; those about a new interpreter
itself (the console script's entry point, what importing quarl loads) start one.
:func:`run_code` runs ``python -c SCRIPT ARGS`` so, for a script about what quarl does in a
process (under a file-size limit, killed between two writes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SERVER = r"""
import json, os, sys, traceback

import quarl.cli
import quarl.api, quarl.checkpoints, stable_baselines3, onnxruntime  # what a command loads first

for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            sys.path[0] = os.getcwd()  # python -m puts the folder it starts in first
            for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY),
                                    (2, request["stderr"], os.O_WRONLY)):
                os.dup2(os.open(path, flags), fd)
            sys.stdin = open(0, closefd=False)
            script = request.get("code")
            sys.argv = [quarl.cli.__file__ if script is None else "-c", *request["args"]]
            try:
                if script is None:
                    quarl.cli.main()
                else:  # python -c SCRIPT ARGS
                    exec(compile(script, "<string>", "exec"), {"__name__": "__main__"})
                code = 0
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
                if isinstance(stop.code, str):
                    print(stop.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(json.dumps(os.waitstatus_to_exitcode(status)), flush=True)
"""

_server: subprocess.Popen | None = None


def run(cwd: Path | str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m quarl.cli ARGS`` run in ``cwd`` with ``env`` (default: this process's), as
    :func:`subprocess.run` with ``capture_output=True, text=True`` returns it."""
    return _forked(cwd, None, args, env)


def run_code(cwd: Path | str, script: str, *args: str,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -c SCRIPT ARGS`` run as :func:`run` runs a command (a process of its own, its
    exit status negative where a signal ended it, as :func:`subprocess.run` says it), for a
    script about what quarl does in a process (under ``ulimit -f``, killed mid-write)."""
    return _forked(cwd, script, args, env)


def _forked(cwd: Path | str, script: str | None, args: tuple[str, ...],
            env: dict[str, str] | None) -> subprocess.CompletedProcess:
    global _server
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True, env={**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"})
    assert _server.stdin is not None and _server.stdout is not None
    with tempfile.TemporaryDirectory() as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        out.touch()
        err.touch()
        request = {"cwd": str(cwd), "env": dict(os.environ if env is None else env), "args": list(args),
                   "stdout": str(out), "stderr": str(err), "code": script}
        _server.stdin.write(json.dumps(request) + "\n")
        _server.stdin.flush()
        answer = _server.stdout.readline()
        assert answer, f"the quarl fork server ended ({_server.wait()})"
        command = [sys.executable, "-m", "quarl.cli"] if script is None else [sys.executable, "-c", script]
        return subprocess.CompletedProcess([*command, *args], json.loads(answer), out.read_text(), err.read_text())
