"""Where fp32's mean return is near 0, E (a ratio to it) means nothing: its interval is
unbounded both ways. The tables then show E as ``n/a (fp32 mean ~ 0)`` and a decided verdict
with its bound in returns, never ``-inf | inf`` beside *keeps*; every other row is printed
exactly as before."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
from rich.console import Console

from quarl.evaluation.pairs import describe
from quarl.evaluation.reports import markdown_lines, paper_table, print_table, ptq_rows, write_rows
from quarl.verdict import judge
from quarl.verdict.betting import loss_bound

# a LunarLander-like fp32 policy that averages 0.4 (20 and -19.2 in turn) and a quantized one 3 more on every seed
NEAR_ZERO = np.tile([20.0, -19.2], 15)
GAINS_3 = NEAR_ZERO + 3.0


def _records(fp32: np.ndarray, quant: np.ndarray, env_id: str = "LunarLander-v3") -> list[dict]:
    return [{"precision": p, "mean": float(r.mean()), "std": float(r.std()), "returns": [float(x) for x in r],
             "episodes": len(r), "env_id": env_id, "seed": 0} for p, r in (("fp32", fp32), ("int8", quant))]


def _row(fp32: np.ndarray, quant: np.ndarray) -> str:
    rows = ptq_rows(_records(fp32, quant), identity=False)
    return markdown_lines(rows, list(rows[0]))[-1]


def _terminal(fp32: np.ndarray, quant: np.ndarray) -> str:
    out = io.StringIO()
    print_table(ptq_rows(_records(fp32, quant), identity=False), "t", Console(file=out, width=200, color_system=None))
    return out.getvalue()


def test_a_keep_over_an_fp32_mean_near_0_names_its_bound_in_returns() -> None:
    v = judge(NEAR_ZERO, GAINS_3, env_id="LunarLander-v3")
    assert v.verdict == "keeps" and not v.relative
    assert v.e == pytest.approx(-750.0) and math.isinf(v.low) and math.isinf(v.high)  # what the table printed before
    # the loss bound: the quantized policy gains 3 a seed; 95 % one-sided, it loses at most -0.28 (gains >= 0.28),
    # within the tolerance in returns (5 % of 0.4 = 0.02)
    assert -3.0 < v.loss < 0.05 * 0.4 and v.label() == "keeps (loss <= -0.28 returns)"
    # before: | int8 | 3.40 | 19.60 | -750.00 | -inf | inf | keeps | insure 1: -29.13:46 | 30 | nan |
    row = _row(NEAR_ZERO, GAINS_3)
    assert row == ("| int8 | 3.40 | 19.60 | n/a (fp32 mean ~ 0) |  |  | keeps (loss <= -0.28 returns) "
                   "| insure 1: -29.13:46 | 30 | nan |")
    assert "inf" not in row
    terminal = _terminal(NEAR_ZERO, GAINS_3)
    assert "inf" not in terminal and "n/a (fp32 mean ~ 0)" in terminal and "keeps (loss <= -0.28 returns)" in terminal
    wide = paper_table({"p": _records(NEAR_ZERO, GAINS_3)}, ["fp32", "int8"])[0]
    assert wide["E_int8%"] == "n/a (fp32 mean ~ 0)" and wide["E_int8 lo"] == wide["E_int8 hi"] == ""
    assert wide["int8 verdict"] == "keeps (loss <= -0.28 returns)"


def test_the_files_say_it_too_and_json_keeps_its_fields_with_null_for_no_e(tmp_path) -> None:
    rows = ptq_rows(_records(NEAR_ZERO, GAINS_3))
    write_rows(rows, tmp_path, "ptq")
    plain = json.loads((tmp_path / "ptq.json").read_text())
    assert list(plain[1]) == list(rows[1])  # every field, in order
    assert plain[1]["E%"] is None and plain[1]["E lo"] is None and plain[1]["E hi"] is None
    assert plain[1]["verdict"] == "keeps (loss <= -0.28 returns)"
    csv_text = (tmp_path / "ptq.csv").read_text()
    md_text = (tmp_path / "ptq.md").read_text()
    for text in (csv_text, md_text):
        assert "n/a (fp32 mean ~ 0)" in text and "keeps (loss <= -0.28 returns)" in text and "inf" not in text


def test_quarl_judge_says_why_there_is_no_e_and_what_the_keep_rests_on() -> None:
    v = judge(NEAR_ZERO, GAINS_3, env_id="LunarLander-v3")
    lines = describe(v, NEAR_ZERO, GAINS_3)
    assert not any("inf" in line for line in lines)
    assert lines[1].startswith("E n/a: the reference's mean return cannot be told from 0")
    assert lines[2] == ("verdict: keeps (mean loss < -0.28 returns with 95 % confidence, one-sided; tolerance 5 % of "
                        "|0.40| = 0.02 returns)")


def test_a_loss_over_an_fp32_mean_near_0_names_its_lower_bound_in_returns() -> None:
    v = judge(NEAR_ZERO, NEAR_ZERO - 3.0, env_id="LunarLander-v3")
    assert v.verdict == "loses" and not v.relative and 0.05 * 0.4 < v.loss < 3.0
    assert v.label() == f"loses (loss >= {v.loss:.2f} returns)"
    assert "inf" not in _row(NEAR_ZERO, NEAR_ZERO - 3.0)


# rows of ordinary verdicts, as the table printed them before E could be n/a: byte for byte the same
KEEPS_BEFORE = "| int8 | 249.00 | 7.35 | 0.40 | -3.07 | 3.90 | keeps | insure 1: -10:510 | 120 | nan |"
LOSES_BEFORE = "| int8 | 200.00 | 8.16 | 20.00 | 4.18 | 39.43 | loses | insure 1: -60:510 | 30 | nan |"
KEEPS_TERMINAL_BEFORE = ("│ int8      │ 249.00 │ 7.35 │ 0.40 │ -3.07 │ 3.90 │   keeps │ insure 1: -10:510 │"
                         "      120 │         nan │")


def test_an_ordinary_row_is_printed_exactly_as_before() -> None:
    fp32 = np.tile([240.0, 260.0, 250.0], 40)
    quant = fp32 - np.tile([0.0, 2.0, 1.0], 40)
    assert judge(fp32, quant).relative
    assert _row(fp32, quant) == KEEPS_BEFORE
    assert KEEPS_TERMINAL_BEFORE in _terminal(fp32, quant).splitlines()
    assert _row(np.tile([240.0, 260.0, 250.0], 10), np.tile([200.0, 210.0, 190.0], 10)) == LOSES_BEFORE


def test_no_decided_verdict_is_printed_beside_an_interval_unbounded_both_ways() -> None:
    """Samples whose fp32 mean sits near 0 (and some that do not): a decided row never shows
    ``-inf`` and ``inf`` together; where E is n/a, the row names the bound in returns, which
    agrees with the decision (below 5 % of |fp32 mean| for keeps, above it for loses)."""
    rng = np.random.default_rng(5)
    decided_na = 0
    for _ in range(40):
        n = int(rng.choice([30, 60]))
        fp32 = np.round(rng.normal(rng.choice([0.4, -1.0, 10.0]), rng.choice([1.0, 10.0, 60.0]), n), 1)
        quant = np.round(fp32 + rng.normal(rng.choice([-5.0, 0.0, 5.0]), rng.choice([0.1, 2.0]), n), 1)
        v = judge(fp32, quant)
        row = _row(fp32, quant)
        if not v.decided:
            continue
        assert "| -inf | inf |" not in row, row
        if not v.relative:
            decided_na += 1
            tolerance = 0.05 * abs(float(fp32.mean()))
            assert "inf" not in row and "n/a (fp32 mean ~ 0)" in row and "returns)" in row, row
            assert (v.loss < tolerance) if v.verdict == "keeps" else (v.loss > tolerance), (v, tolerance)
    assert decided_na >= 5  # the case is exercised


def test_the_loss_bound_covers_the_true_mean_loss() -> None:
    """The one-sided bound in returns holds at its stated rate (here 95 %, rows of 50 paired
    episodes whose losses are uniform on [-3, 5]: a true mean loss of 1)."""
    rng = np.random.default_rng(0)
    fp32 = rng.uniform(0, 10, (400, 50))
    quant = fp32 - rng.uniform(-3, 5, (400, 50))
    bounds = (-10.0, 20.0, -3.0, 5.0, -10.0, 20.0)
    upper = loss_bound(fp32, quant, bounds, 0.05, upper=True)
    lower = loss_bound(fp32, quant, bounds, 0.05, upper=False)
    assert np.all(lower <= upper) and np.all(upper <= 5.0) and np.all(lower >= -3.0)
    assert np.mean(upper >= 1.0) >= 0.95 and np.mean(lower <= 1.0) >= 0.95
    assert np.median(upper - lower) < 3  # and says something: narrower than the range of 8


def test_the_docs_near_zero_table() -> None:
    """docs/ptq.md's table of the near-0 case is what ptq's rows of these returns say."""
    from conftest import ROOT

    page = (ROOT / "docs" / "ptq.md").read_text()
    shown = page.split("<!-- made-by: tests/test_verdict_near_zero.py::test_the_docs_near_zero_table -->\n\n", 1)[1]
    shown = shown.split("\n\n", 1)[0]
    rows = ptq_rows(_records(NEAR_ZERO, GAINS_3), identity=False)
    columns = [c for c in rows[0] if c != "steps_per_s"]  # no speed measured here
    assert shown == "\n".join(markdown_lines(rows, columns))
