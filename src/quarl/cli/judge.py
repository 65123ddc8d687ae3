"""``quarl judge``: the verdict for any two policies, from their paired returns."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from quarl.cli.app import app
from quarl.cli.command import command
from quarl.cli.common import say, setup, user_errors
from quarl.cli.settings import INSURE, Insure, ReturnRange, judging_of

Returns = Annotated[Path, typer.Argument(
    help="CSV of paired returns: header seed,reference,candidate, one row per paired episode in the order played")]
JudgedEnv = Annotated[str | None, typer.Option(
    "--env", help="the env the episodes played, for its own range of returns (CartPole-v1, Acrobot-v1, "
                  "Pendulum-v1...)")]
DebugVerbose = Annotated[bool, typer.Option("--verbose", "-v", help="debug logging")]


@command(app, "judge")
@user_errors
def judge(
    returns: Returns,
    env: JudgedEnv = None,
    insure: Insure = INSURE,
    return_range: ReturnRange = None,
    verbose: DebugVerbose = False,
) -> None:
    """Does the candidate keep the reference's return? The verdict ptq, study and recover
    give (E, its 95 % interval, keeps / loses / undecided, the range it assumed), for any
    two policies: a pruned, distilled or retrained one, or another tool's.

    Example: quarl judge returns.csv --env CartPole-v1
    """
    setup(verbose)
    from quarl.evaluation.pairs import describe, read_pairs
    from quarl.evaluation.pairs import judge as judge_pairs

    judging = judging_of(insure, return_range)
    pairs = read_pairs(returns)
    verdict = judge_pairs(pairs.reference, pairs.candidate, env, judging.insure, judging.return_range)
    for line in describe(verdict, pairs.reference, pairs.candidate):
        say(line)
