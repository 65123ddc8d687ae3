"""The ``quarl`` command. It only parses arguments, calls the library and prints what it
returns; a user mistake (QuarlError) prints one line and exits with status 2.

One module per command group: :mod:`~quarl.cli.ptq`, :mod:`~quarl.cli.sweep` (sweep,
analyze), :mod:`~quarl.cli.train` (train, qat), :mod:`~quarl.cli.actorq`,
:mod:`~quarl.cli.export` (export, bench), :mod:`~quarl.cli.recover`, :mod:`~quarl.cli.judge`, :mod:`~quarl.cli.play`,
:mod:`~quarl.cli.study` (demo, study); what they share is in :mod:`~quarl.cli.common`,
:mod:`~quarl.cli.options` (single options), :mod:`~quarl.cli.groups` (option groups, each declared
once and attached with ``with_options``) and :mod:`~quarl.cli.group`; ActorQ's per-algorithm
options are made in :mod:`~quarl.cli.actorq_options`."""

from __future__ import annotations

import sys

import typer

from quarl.cli import actorq, export, judge, play, ptq, recover, study, sweep, train
from quarl.cli.common import out_console, stop_on_signal
from quarl.cli.group import QuarlGroup

app = typer.Typer(
    cls=QuarlGroup,
    add_completion=False,
    no_args_is_help=True,
    help="quarl: quantize trained RL policies and measure what it costs in reward. Every command also takes "
         "--gym-packages MODULE (rl_zoo3's option): MODULE is imported first, so the custom envs it registers are "
         "known (evaluation workers import it too; the current folder is searched as rl_zoo3 does). An RL Zoo "
         "folder's args.yml gym_packages are imported only when named so, or with --trust-gym-packages.",
)


def _version(value: bool) -> None:
    if value:
        import quarl

        out_console.print(f"quarl {quarl.__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print quarl's version and exit")) -> None:
    """quarl: quantize trained RL policies and measure what it costs in reward."""


# in the order of `quarl --help`
app.command()(ptq.ptq)
app.command()(sweep.sweep)
app.command()(sweep.analyze)
app.command("train")(train.train_cmd)
app.command()(train.qat)
app.add_typer(actorq.actorq_app, name="actorq")
app.command()(export.export)
app.command()(recover.recover)
app.command()(judge.judge)
app.command()(play.play)
app.command()(export.bench)
app.command()(study.demo)
app.command()(study.study)


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
