"""The ``quarl`` typer app every command module registers its commands on
(``@command(app, "name")``, :func:`quarl.cli.command.command`); :mod:`quarl.cli` imports the
modules in the order ``quarl --help`` lists them."""

from __future__ import annotations

from typing import Annotated

import typer

from quarl.cli.command import QuarlGroup
from quarl.cli.common import out_console
from quarl.cli.settings import GYM_PACKAGES_HELP, gym_packages_callback, trust_gym_packages_callback

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
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="print quarl's version and exit")] = False,
    gym_packages: Annotated[list[str] | None, typer.Option(
        "--gym-packages", metavar="MODULE", is_eager=True, hidden=True, callback=gym_packages_callback,
        help=GYM_PACKAGES_HELP)] = None,
    trust_gym_packages: Annotated[bool, typer.Option(
        "--trust-gym-packages", is_eager=True, hidden=True, callback=trust_gym_packages_callback)] = False,
) -> None:
    """quarl: quantize trained RL policies and measure what it costs in reward."""
