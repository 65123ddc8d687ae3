"""What every command shares: the consoles, logging setup, one-line errors and exit codes,
the signals that stop a run, progress bars."""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import logging
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from quarl.core.errors import QuarlError, StoppedRun

console = Console(stderr=True)
# files and pipes get whole tables; no markup: what it prints holds users' paths and labels ("[/]" is text)
out_console = Console(width=None if sys.stdout.isatty() else 200, markup=False)
log = logging.getLogger("quarl")


def print_error(text: str) -> None:
    """One line on stderr, as every error quarl reports."""
    console.print(f"[red]error:[/red] {escape(text)}", highlight=False, soft_wrap=True)


def say(text: str) -> None:
    """A result line on stdout (paths and labels printed as they are)."""
    out_console.print(text, soft_wrap=True, highlight=False)


def environment_defaults() -> None:
    """Set before torch, BLAS or MuJoCo load: one thread per process (evaluation runs
    processes side by side), MuJoCo rendering without a display."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MUJOCO_GL", "egl")


def after_import(name: str, callback: Callable[[], None]) -> None:
    """Run ``callback`` once module ``name`` is imported (now, if it already is): torch's
    thread count is set when torch loads, so a command that refuses its input before
    needing torch answers without loading it (a second and more)."""
    if name in sys.modules:
        callback()
        return

    class Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            loader = getattr(spec, "loader", None)
            if loader is None or not hasattr(loader, "exec_module"):
                return spec
            run = loader.exec_module

            def exec_module(module: Any) -> None:
                run(module)
                callback()

            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Hook())


def _one_torch_thread() -> None:
    import torch

    torch.set_num_threads(1)


def setup(verbose: bool = False) -> None:
    environment_defaults()
    after_import("torch", _one_torch_thread)
    from quarl.core.logs import AgentFilter

    handler = RichHandler(console=console, show_path=False, show_time=False, markup=False)
    handler.addFilter(AgentFilter())  # demo / study: each line names the agent it is about
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[handler],
        force=True,
    )
    logging.getLogger("quarl").setLevel(logging.INFO if verbose else logging.WARNING)
    if not verbose:  # when gymnasium / MuJoCo load: a command refusing its input answers without them
        from quarl.core import quiet

        after_import("gymnasium", quiet.filter_warnings)
        after_import("mujoco", quiet.route_mujoco)


RESUMES_WITH_FLAG = ("train_cmd", "actorq_run")
"""Commands that continue only with ``--resume`` (the others reuse what they find)."""

stopped_by: list[int] = []
"""The signal that stopped the run (SIGTERM, SIGHUP), for the exit code 128 + N."""


def resume_command(fn: Callable[..., Any], argv: Sequence[str] | None = None) -> str:
    """The command line that continues an interrupted run: the same one, with ``--resume``
    where the command needs it."""
    words = ["quarl", *(sys.argv[1:] if argv is None else argv)]
    if fn.__name__ in RESUMES_WITH_FLAG and "--resume" not in words:
        words.append("--resume")
    return " ".join(shlex.quote(a) for a in words)


def stop_on_signal(signum: int, frame: Any) -> None:
    """SIGTERM / SIGHUP take Ctrl-C's path: every long command writes what it finished
    (checkpoints, stored cells) and says how to continue, workers and Ray shut down."""
    stopped_by.append(signum)
    raise KeyboardInterrupt


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn QuarlError (and a Ctrl-C) into one line on stderr and a non-zero exit."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except QuarlError as exc:
            # a run stopped with its checkpoints kept (training met a NaN): the whole command that continues it
            print_error(str(exc) + (f" (to continue: {resume_command(fn)})" if isinstance(exc, StoppedRun) else ""))
            raise typer.Exit(2) from None
        except (FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError) as exc:
            # a path the user gave (--out naming a file, a folder we may not write)
            console.print(f"[red]error:[/red] {escape(str(exc.filename))}: {escape(str(exc.strerror))}",
                          highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except OSError as exc:
            from quarl.core.atomic import DISK_ERRNOS, write_error

            if exc.errno not in DISK_ERRNOS:
                raise
            # a full disk met by a writer not yet made atomic: still one line naming the file
            print_error(str(write_error(Path(exc.filename or "a file"), exc)))
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            console.print(f"interrupted: what finished is kept; to continue, run: {escape(resume_command(fn))}",
                          highlight=False, soft_wrap=True)
            raise typer.Exit(128 + stopped_by[-1] if stopped_by else 130) from None

    return wrapper


def progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def say_reused(records: Sequence[Mapping[str, Any]], where: Path) -> None:
    reused = sum(1 for r in records if r.get("reused"))
    if reused:
        out_console.print(f"reused {reused} finished cell{'s' * (reused != 1)} from {where} (same policy content, "
                          "config and settings)")


def float_checkpoint(checkpoint: Path, why: str) -> Path:
    """``checkpoint`` unless it is an exported model, which a command that needs the float
    policy cannot use (``why`` says what it does with the float weights)."""
    from quarl.policies.onnx_artifact import is_artifact

    if is_artifact(checkpoint):
        raise QuarlError(f"{checkpoint} is an exported model: {why}; give the SB3 .zip or RL Zoo folder it was "
                         "exported from (ptq, play and bench take the export as it is)")
    return checkpoint
