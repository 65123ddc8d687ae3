"""``quarl judge``: the verdict for any two policies, from their paired returns."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from quarl.cli.common import say, setup, user_errors


@user_errors
def judge(
    returns: Path = typer.Argument(..., help="CSV of paired returns: header seed,reference,candidate, one row per "
                                             "paired episode in the order played"),
    env: Optional[str] = typer.Option(None, "--env", help="the env the episodes played, for its own range of returns "
                                                          "(CartPole-v1, Acrobot-v1, Pendulum-v1...)"),
    insure: float = typer.Option(1.0, "--insure", metavar="K", help="where the env defines no range of returns, "
                                 "insure against an unseen failure costing up to K mean returns beyond the worst "
                                 "paired loss seen"),
    return_range: Optional[str] = typer.Option(None, "--return-range", metavar="LO:HI", help="every return lies in "
                                               "LO:HI: the verdict assumes exactly that range"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="debug logging"),
) -> None:
    """Does the candidate keep the reference's return? The verdict ptq, study and recover
    give (E, its 95 % interval, keeps / loses / undecided, the range it assumed), for any
    two policies: a pruned, distilled or retrained one, or another tool's.

    Example: quarl judge returns.csv --env CartPole-v1
    """
    setup(verbose)
    from quarl.cli.ptq import judging_of
    from quarl.evaluation.pairs import describe, read_pairs
    from quarl.evaluation.pairs import judge as judge_pairs

    judging = judging_of(insure, return_range)
    pairs = read_pairs(returns)
    verdict = judge_pairs(pairs.reference, pairs.candidate, env, judging.insure, judging.return_range)
    for line in describe(verdict, pairs.reference, pairs.candidate):
        say(line)
