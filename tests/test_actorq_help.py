"""``quarl actorq run / compare --help`` at 80 columns: every option's name whole (rich cuts a
name column squeezed by a ``--no-x`` column beside it to ``--samples-per-insert-…``)."""

from __future__ import annotations

from dataclasses import fields

import pytest
from typer.testing import CliRunner

from quarl.actorq.algorithms import ALGORITHMS, option_owners
from quarl.cli import app


@pytest.mark.parametrize("command", ["run", "compare"])
@pytest.mark.parametrize("columns", ["80", "200"])
def test_every_algorithm_option_is_named_whole_in_the_help(command: str, columns: str) -> None:
    r = CliRunner(env={"COLUMNS": columns}).invoke(app, ["actorq", command, "--help"])
    assert r.exit_code == 0, r.output
    assert "…" not in r.output, r.output
    names = {line.replace("│", " ").split()[0] for line in r.output.splitlines()
             if line.replace("│", " ").strip().startswith("--")}
    for name in option_owners():
        flag = "--" + name.replace("_", "-")
        assert flag in names, (flag, sorted(names))
    assert "--samples-per-insert-tolerance" in names and "--no-correction" in r.output


def test_the_switches_are_beside_the_other_options_of_their_algorithm() -> None:
    """On / off options have a panel of their own, after the algorithm's other options; each
    option is in exactly one of the two."""
    r = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["actorq", "run", "--help"])
    text = r.output
    options = text.index("Options of one algorithm (--algo)")
    switches = text.index("Switches of one algorithm (--algo)")
    assert options < switches
    bools = {f.name for a in ALGORITHMS.values() for f in fields(a.options) if f.type in (bool, "bool")}
    assert bools == {"correction"}
    assert text.index("--correction ", options) > switches and "--no-correction" in text[switches:]
    assert text.index("--samples-per-insert-tolerance") < switches
