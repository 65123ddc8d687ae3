"""The ``quarl`` command. It only parses arguments, calls the library and prints what it
returns; a user mistake (QuarlError) prints one line and exits with status 2.

One module per command group, each registering its commands on :data:`quarl.cli.app.app`
(``@command(app, "name")``); the imports below are the registration, in the order
``quarl --help`` lists the commands. What they share is in :mod:`~quarl.cli.common`, the
option groups (a dataclass each, its options declared once as typer ``Annotated`` types) in
:mod:`~quarl.cli.settings`, and the click classes they run in in :mod:`~quarl.cli.command`."""

from __future__ import annotations

import sys

# isort: off
from quarl.cli.app import app
from quarl.cli import ptq  # noqa: F401  (each import registers its module's commands, in this order)
from quarl.cli import sweep  # noqa: F401
from quarl.cli import train  # noqa: F401
from quarl.cli import export  # noqa: F401
from quarl.cli import recover  # noqa: F401
from quarl.cli import judge  # noqa: F401
from quarl.cli import play  # noqa: F401
from quarl.cli import bench  # noqa: F401
from quarl.cli import study  # noqa: F401
from quarl.cli import actorq  # noqa: F401
# isort: on
from quarl.cli.common import stop_on_signal

__all__ = ["app", "main"]


def main() -> None:
    """The console script: SIGTERM / SIGHUP stop a run as Ctrl-C does; SIGXFSZ is ignored (a
    file-size limit is a write error, said in one line)."""
    import signal

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop_on_signal)
    # past a file-size limit (ulimit -f) a write fails with EFBIG, which quarl says in one line and from which it keeps
    # what it finished, instead of the process (or ffmpeg writing a video) being killed mid-file; inherited by children
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        app()
    except BrokenPipeError:  # `quarl ... | head`
        sys.exit(0)
