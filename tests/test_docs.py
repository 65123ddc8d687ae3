"""The docs say only what the commands print.

Every output block (a fenced block without a language, or ``json``) and every table in
README.md and docs/*.md carries a marker on the line before it (blank lines between
are allowed) that says what makes it:

- ``<!-- made-by: tests/FILE.py::TEST -->``: TEST runs the command and compares its
  output with the block (here: exact text and cells, except the timing columns in
  ``TIMING_COLUMNS``, which must be numbers);
- ``<!-- made-by: results/PATH by `COMMAND` -->``: the table is the one COMMAND wrote to
  results/PATH (a Markdown table); it must equal that file's rows on the block's columns.
  results/ is not in git, so this is checked where the file is (skipped elsewhere);
- ``<!-- made-by: run of `COMMAND` (WHY) -->``: one recorded run that no test repeats
  (timings, runs of many minutes, the network); WHY says which;
- ``<!-- made-by: prose -->``: a table of words a person wrote (no measured numbers).

Every ``quarl ...`` command line the docs show (in bash blocks, after ``$`` in output
blocks, in inline code and in markers) must parse against the CLI: its command, options
and values; an option renamed in the code fails here. A fenced block with the language
``text`` is a diagram, not output.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
from conftest import ROOT, ZOO

DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md"))]
# pages another owner writes: their commands must parse, their tables carry no markers
MARKER_EXEMPT = {"contributing.md", "refusals.md"}
OUTPUT_LANGUAGES = {"", "json"}
MARKER = re.compile(r"^\s*<!-- made-by: (?P<target>.+?) -->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+)(?P<lang>[\w-]*)\s*$")
# columns whose numbers are times or rates on this machine: a test checks they are numbers
# typer vendors its own click: its exceptions, found from one typer exports
CLICK_ERRORS = {cls.__name__: cls for cls in typer.BadParameter.__mro__}
ClickException: type[Exception] = CLICK_ERRORS["ClickException"]
UsageError: type[Exception] = CLICK_ERRORS["UsageError"]
TIMING_COLUMNS = {"steps_per_s", "b1_us", "b1_x", "b256_us", "b256_x"}
BOX_ROW = re.compile(r"^\s*[┃│]")


# ---------------------------------------------------------------------------------------
# reading the docs


@dataclass(frozen=True)
class Block:
    """A fenced block or a Markdown table of one page, with the marker before it."""

    page: Path
    line: int  # 1-based line of the fence or the table's first row
    kind: str  # "fence" or "table"
    language: str
    text: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _marker_before(lines: list[str], index: int) -> str | None:
    for previous in reversed(lines[:index]):
        if previous.strip():
            found = MARKER.match(previous)
            return found.group("target") if found else None
    return None


def blocks_of(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if fence:
            indent, ticks = len(fence.group("indent")), fence.group("fence")
            end = index + 1
            while end < len(lines) and lines[end].strip() != ticks:
                end += 1
            body = "\n".join(line[indent:] for line in lines[index + 1:end])
            blocks.append(Block(page, index + 1, "fence", fence.group("lang"), body, _marker_before(lines, index)))
            index = end + 1
            continue
        if lines[index].lstrip().startswith("|") and index + 1 < len(lines) \
                and re.match(r"^\s*\|\s*:?-+", lines[index + 1]):
            end = index
            while end < len(lines) and lines[end].lstrip().startswith("|"):
                end += 1
            body = "\n".join(line.strip() for line in lines[index:end])
            blocks.append(Block(page, index + 1, "table", "", body, _marker_before(lines, index)))
            index = end
            continue
        index += 1
    return blocks


def all_blocks(pages: list[Path] = DOCS) -> list[Block]:
    return [block for page in pages for block in blocks_of(page)]


def marked(target_prefix: str) -> list[Block]:
    return [b for b in all_blocks() if b.marker is not None and b.marker.startswith(target_prefix)]


def block_made_by(test_name: str) -> list[Block]:
    """The blocks whose marker names this test (in page order)."""
    found = marked(f"tests/test_docs.py::{test_name}")
    assert found, f"no block in the docs says it is made by {test_name}"
    return found


def needs_marker(block: Block) -> bool:
    return block.kind == "table" or block.language in OUTPUT_LANGUAGES


# ---------------------------------------------------------------------------------------
# reading tables (rich boxes and Markdown) and command output


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"[┃│|]", line.strip())[1:-1]]


def markdown_table(text: str) -> Table:
    rows = [_cells(line) for line in text.strip().splitlines() if line.strip().startswith("|")]
    return Table("", rows[0], [row for row in rows[2:]])


def parse_output(text: str) -> list[str | Table]:
    """Lines and rich tables of a command's output, progress bars left out (a box title
    that wraps is one line; a header that wraps is joined per column)."""
    items: list[str | Table] = []
    lines = [line.rstrip() for line in text.splitlines()
             if not ("━" in line and not re.search(r"[┏┃┡│└]", line))]
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.lstrip().startswith("┏"):
            title: list[str] = []
            while items and isinstance(items[-1], str) and items[-1].startswith(" ") and items[-1].strip():
                title.insert(0, str(items.pop()).strip())
            index += 1
            header_lines: list[list[str]] = []
            while index < len(lines) and lines[index].lstrip().startswith("┃"):
                header_lines.append(_cells(lines[index]))
                index += 1
            header = [" ".join(part for part in parts if part) for parts in zip(*header_lines, strict=True)]
            rows: list[list[str]] = []
            while index < len(lines) and not lines[index].lstrip().startswith("└"):
                if BOX_ROW.match(lines[index]):
                    rows.append(_cells(lines[index]))
                index += 1
            items.append(Table(" ".join(title), header, rows))
            index += 1
            continue
        if BOX_ROW.match(line) and "|" not in line:  # a table shown without its box
            header = _cells(line)
            rows = []
            index += 1
            while index < len(lines) and BOX_ROW.match(lines[index]):
                rows.append(_cells(lines[index]))
                index += 1
            items.append(Table("", header, rows))
            continue
        items.append(line)
        index += 1
    return [item if isinstance(item, Table) else item.strip() for item in items
            if isinstance(item, Table) or item.strip()]


def _is_number(cell: str) -> bool:
    return re.fullmatch(r"-?[\d,]+(\.\d+)?|nan", cell) is not None


def compare_table(shown: Table, made: Table, where: str, chosen: bool = False) -> None:
    """``made`` as the doc shows it: cell by cell, timing columns only as numbers; ``chosen``
    (a CPU other than the docs' or another automatic choice, :func:`compare_chosen_output`):
    the numbers that follow from the int modes chosen also only as numbers."""
    assert _same_line(shown.title, made.title, chosen), \
        f"{where}: title {shown.title!r}, the command prints {made.title!r}"
    assert shown.header == made.header, f"{where}: columns {shown.header}, the command prints {made.header}"
    assert len(shown.rows) == len(made.rows), f"{where}: {len(shown.rows)} rows, the command prints {made.rows}"
    for shown_row, made_row in zip(shown.rows, made.rows, strict=True):
        loose = _chosen_columns(shown.header, made_row) if chosen else set()
        for column, shown_cell, made_cell in zip(shown.header, shown_row, made_row, strict=True):
            if column in TIMING_COLUMNS or (column in loose and _is_number(shown_cell)):
                assert _is_number(shown_cell) and _is_number(made_cell), f"{where}: {column} {shown_cell!r}"
            elif column in loose:  # a mode (checked by compare_chosen_output), a verdict, layers kept in fp32
                assert bool(shown_cell) == bool(made_cell), f"{where}: {column} {shown_cell!r}, printed {made_cell!r}"
            else:
                assert shown_cell == made_cell, \
                    f"{where}: row {shown_row[0]!r}, {column}: the doc says {shown_cell!r}, " \
                    f"the command prints {made_cell!r}"


def compare_output(block: Block, printed: str, chosen: bool = False) -> None:
    """The block equals the printed output: lines exactly, tables cell by cell (timing
    columns only as numbers). A line ``...`` in the block stands for any output.
    ``chosen``: see :func:`compare_chosen_output`."""
    shown, made = parse_output(block.text), parse_output(printed)
    position = 0
    skipping = False
    for item in shown:
        if item == "...":
            skipping = True
            continue
        if skipping:  # on to the next printed item of this kind (this line, or a table)
            while position < len(made) and not (
                    isinstance(item, Table) and isinstance(made[position], Table) or
                    isinstance(item, str) and isinstance(made[position], str) and
                    _same_line(item, str(made[position]), chosen)):
                position += 1
            skipping = False
        assert position < len(made), f"{block.where}: {item!r} is not printed; the command printed:\n{printed}"
        if isinstance(item, Table):
            assert isinstance(made[position], Table), f"{block.where}: a table, the command printed {made[position]!r}"
            compare_table(item, made[position], block.where, chosen)  # type: ignore[arg-type]
        else:
            assert isinstance(made[position], str) and _same_line(item, str(made[position]), chosen), \
                f"{block.where}: the doc says\n{item}\nthe command prints\n{made[position]}"
        position += 1
    assert skipping or position == len(made), f"{block.where}: the command printed more: {made[position:]}"


# ---------------------------------------------------------------------------------------
# what the CPU chooses: int modes and what follows from them

CHOSEN_COLUMNS = {"mode", "model_bytes", "mean", "std", "E%", "E lo", "E hi", "verdict", "range", "episodes",
                  "fp32_layers", "agree%", "KL", "sampled agree%", "return", "length"}
"""The columns of a row that follow from the int mode chosen for it (a row without a mode,
in a table with a mode column, keeps its own but for the episodes a verdict played)."""


def docs_cpu_here() -> bool:
    """Whether this CPU, as ``QUARL_CPU_KIND`` has quarl answer, is of the kind that made the
    docs' outputs (an AMD EPYC with AVX-512 VNNI): with VNNI (``auto`` int8 weights are
    symmetric) and a MatMulNBits that computes in int8 (the block modes run)."""
    from quarl.quant.backends.onnxruntime import has_vnni
    from quarl.quant.modes import int8_compute

    return has_vnni() and int8_compute(8) == int8_compute(4) == "int8"


def int_modes_in(text: str) -> list[str]:
    """The int mode labels ``text`` names, in order (``int8-block``; not ``lunar-int8``)."""
    from quarl.quant.modes import MODES

    labels = "|".join(re.escape(label) for label in sorted(MODES, key=len, reverse=True))
    return re.findall(rf"(?<![\w-])({labels})(?![\w-])", text)


def _masked(line: str) -> str:
    """``line`` with its int modes and its numbers as placeholders."""
    from quarl.quant.modes import MODES

    labels = "|".join(re.escape(label) for label in sorted(MODES, key=len, reverse=True))
    return re.sub(r"-?\d[\d,]*(\.\d+)?(e-?\d+)?", "N", re.sub(rf"(?<![\w-])({labels})(?![\w-])", "MODE", line))


def _same_line(shown: str, made: str, chosen: bool) -> bool:
    """A line as the doc shows it; ``chosen``: one that names an int mode, but for the mode
    and its numbers."""
    if chosen and int_modes_in(shown):
        return _masked(shown) == _masked(made)
    return shown == made


def _chosen_columns(header: list[str], row: list[str]) -> set[str]:
    """The columns of ``row`` that follow from the int modes chosen (see :data:`CHOSEN_COLUMNS`)."""
    if "mode" not in header or row[header.index("mode")]:
        return CHOSEN_COLUMNS
    return {"episodes", "mean", "std"} & set(header) if "verdict" in header else set()


def compare_chosen_output(block: Block, printed: str) -> bool:
    """:func:`compare_output` for output that shows int modes the automatic choice picked (by
    latency, among the modes this CPU runs exactly; the docs say so under the block) and what
    follows from them: returns, sizes, agreement. Where this CPU is of the docs' kind
    (:func:`docs_cpu_here`) and picked the docs' modes, exactly. Elsewhere, for this CPU: the
    modes printed are of the docs' widths and ones this CPU runs; everything that does not
    follow from them as the docs show it; what does (the numbers of a line or row that names a
    mode, :data:`CHOSEN_COLUMNS`, a table of returns under a mode) as numbers. Returns True
    there: the caller checks what follows from the modes its own way."""
    from quarl.quant.modes import MODES

    shown, made = int_modes_in(block.text), int_modes_in(printed)
    # a block that leaves lines out ("...") shows the modes of the lines it keeps: compare the modes as sets there
    elided = any(line.strip() == "..." for line in block.text.splitlines())
    same = shown == made or elided and set(shown) == set(made)
    if not shown or docs_cpu_here() and same:
        compare_output(block, printed)
        return False
    widths = [label.split("-")[0] for label in shown]
    made_widths = [label.split("-")[0] for label in made]
    assert (set(made_widths) == set(widths)) if elided else made_widths == widths, \
        f"{block.where}: modes {made}, the doc's {shown}"
    for label in made:
        assert MODES[label].cpu_unsupported() is None, f"{block.where}: {label} chosen where this CPU cannot run it"
    compare_output(block, printed, chosen=True)
    return True


# ---------------------------------------------------------------------------------------
# command lines


def _logical_lines(text: str) -> Iterator[str]:
    pending = ""
    for line in text.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield pending + line
        pending = ""


def quarl_arguments(line: str) -> list[list[str]]:
    """The argument lists of the ``quarl`` calls in one shell line (loop variables become
    1, which every option that takes a variable here accepts)."""
    line = re.sub(r"\$\w+", "1", line)
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:
        return []
    calls: list[list[str]] = []
    for position, token in enumerate(tokens):
        if token == "quarl" or token.endswith("/quarl"):
            arguments: list[str] = []
            for argument in tokens[position + 1:]:
                if argument in {";", "&&", "||", "|", "done", "do", ">", "2>&1"} or argument.endswith(";"):
                    if argument.endswith(";") and argument != ";":
                        arguments.append(argument[:-1])
                    break
                arguments.append(argument)
            calls.append(arguments)
    return calls


INLINE_CODE = re.compile(r"`((?:\.venv/bin/)?quarl [^`]+)`")


def doc_command_lines() -> list[tuple[str, list[str]]]:
    """(where, arguments) of every quarl command the docs show."""
    found: list[tuple[str, list[str]]] = []
    for page in DOCS:
        text = page.read_text()
        for block in blocks_of(page):
            if block.kind != "fence":
                continue
            if block.language in {"bash", "sh"}:
                lines = list(_logical_lines(block.text))
            elif block.language in OUTPUT_LANGUAGES:
                lines = [line[2:] for line in block.text.splitlines() if line.startswith("$ ")]
            else:
                continue
            found += [(block.where, arguments) for line in lines for arguments in quarl_arguments(line)]
        prose = re.sub(r"```.*?```", "", text, flags=re.S).replace("\n", " ")
        for span in INLINE_CODE.findall(prose):
            # synopses with placeholders ([--opt], A|B, ...) are not command lines
            if not re.search(r"[\[\]|]|\.\.\.|\.\.(?!/)", span):
                # a command named in prose may leave out its arguments: --help parses the rest; an
                # option named last without its value (`quarl recover --finetune-steps`) is
                # checked by name (parse_command's OPTION_NAMED marker)
                for arguments in quarl_arguments(span):
                    if arguments and arguments[-1].startswith("--") and "=" not in arguments[-1] \
                            and arguments[-1] not in ("--help", "--version"):
                        arguments = [*arguments[:-1], OPTION_NAMED + arguments[-1]]
                    found.append((f"{page.relative_to(ROOT)} `{span}`", [*arguments, "--help"]))
        for target in re.findall(r"<!-- made-by: .*?`([^`]+)`", text):
            found += [(f"{page.relative_to(ROOT)} marker", [*arguments, "--help"])
                      for arguments in quarl_arguments(target)]
    return found


OPTION_NAMED = "option-named:"
"""Marks an option a doc names without a value: it must exist on the command."""


@functools.cache
def _cli_command() -> Any:
    """The click command of quarl's app (built once: building it took half of the parse check)."""
    from quarl.cli import app

    return typer.main.get_command(app)


def parse_command(arguments: list[str]) -> None:
    """Parse ``quarl ARGUMENTS`` as the CLI would, without running it (an argument
    ``OPTION_NAMED--opt`` asks only that the command has ``--opt``). ``--help`` ends the
    parse as it does in the CLI, without its panels drawn (drawing them was the other half)."""
    from unittest import mock

    import typer.rich_utils

    named = [a[len(OPTION_NAMED):] for a in arguments if a.startswith(OPTION_NAMED)]
    arguments = [a for a in arguments if not a.startswith(OPTION_NAMED)]
    command: Any = _cli_command()
    try:
        with contextlib.redirect_stdout(io.StringIO()), \
                mock.patch.object(typer.rich_utils, "rich_format_help", lambda **kwargs: None):
            context = command.make_context("quarl", list(arguments))
            while hasattr(command, "resolve_command"):  # a group: on to its subcommand
                rest = [*context._protected_args, *context.args]
                name, sub, rest = command.resolve_command(context, rest)
                assert sub is not None and name is not None
                command = sub  # before its own parse: --help ends that one with Exit
                context = sub.make_context(name, rest, parent=context)
    except typer.Exit:
        pass
    for option in named:
        known = {o for param in command.params for o in (*param.opts, *param.secondary_opts)}
        if option not in known:
            raise UsageError(f"No such option: {option}")


# ---------------------------------------------------------------------------------------
# running the commands the docs show


@pytest.fixture(scope="module")
def doc_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder to run the docs' commands in (their default outputs land there), the
    RL Zoo agents where the docs say ../shared/zoo, and one int-mode cache for the
    module, as a user's commands share one (export runs the mode ptq chose)."""
    if not ZOO.exists():
        pytest.skip(f"the RL Zoo agents the docs use are not under {ZOO} (../shared is absent)")
    folder = tmp_path_factory.mktemp("docs-run")
    (folder / "shared").mkdir()
    (folder / "shared" / "zoo").symlink_to(ZOO)
    cwd = folder / "checkout"
    cwd.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("QUARL_CACHE", str(folder / "int-modes"))
        patch.chdir(cwd)
        yield cwd


def run_doc_command(line: str, stderr: bool = False) -> str:
    """Run one command line of a doc's bash block in this process: what it prints on
    stdout (stderr holds progress bars and log notes; ``stderr=True`` adds it). A line
    saying that earlier cells were reused depends on what ran before, not on the docs."""
    from typer.testing import CliRunner

    from quarl.cli import app

    env = {"COLUMNS": "200", "QUARL_DECIDE_EPISODES": ""}  # the docs show the defaults a user gets: verdicts decide
    for assignment in re.findall(r"^(\w+)=(\S+) ", line):
        env[assignment[0]] = assignment[1]
    (arguments,) = quarl_arguments(line)
    result = CliRunner(env=env).invoke(app, arguments)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    printed = result.stdout + (result.stderr if stderr else "")
    return "".join(line for line in printed.splitlines(keepends=True) if not line.startswith("reused "))


def bash_lines(block: Block) -> list[str]:
    return [line for line in _logical_lines(block.text) if quarl_arguments(line)]


def command_before(block: Block) -> list[str]:
    """The command lines of the bash block just before an output block."""
    previous = [b for b in blocks_of(block.page) if b.kind == "fence" and b.line < block.line]
    assert previous and previous[-1].language == "bash", f"{block.where}: no bash block before it"
    return bash_lines(previous[-1])


def run_python_block(block: Block, names: dict[str, Any] | None = None) -> str:
    """Run the python block before an output block in the checkout, as a reader would
    (``names``: the namespace it runs in, holding its variables afterwards)."""
    previous = [b for b in blocks_of(block.page) if b.kind == "fence" and b.line < block.line][-1]
    assert previous.language == "python", f"{block.where}: no python block before it"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(previous.text, previous.where, "exec"), {"__name__": "__doc__"} if names is None else names)
    return printed.getvalue()


# ---------------------------------------------------------------------------------------
# (c) markers


def test_every_output_block_and_table_has_a_marker() -> None:
    missing = [b.where for b in all_blocks() if b.page.name not in MARKER_EXEMPT and needs_marker(b)
               and b.marker is None]
    assert not missing, "output blocks / tables without <!-- made-by: ... -->: " + ", ".join(missing)


def _test_names() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        tree = ast.parse(path.read_text())
        names |= {f"tests/{path.name}::{node.name}" for node in ast.walk(tree)
                  if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}
    return names


def test_every_marker_points_at_something_that_exists() -> None:
    tests = _test_names()
    wrong: list[str] = []
    for block in all_blocks():
        target = block.marker
        if target is None:
            continue
        if target.startswith("tests/"):
            if target not in tests:
                wrong.append(f"{block.where}: no test {target}")
        elif target.startswith("results/"):
            found = re.fullmatch(r"results/\S+\.md(, results/\S+\.md)* by `[^`]+`", target)
            if not found:
                wrong.append(f"{block.where}: write 'results/PATH.md[, results/PATH.md] by `COMMAND`', not {target!r}")
        elif target.startswith("run of "):
            script = re.fullmatch(r"run of `([^`]+)` \(.+\)", target)
            if not script:
                wrong.append(f"{block.where}: write 'run of `COMMAND` (WHY no test repeats it)', not {target!r}")
            else:
                for word in shlex.split(script.group(1)):
                    if word.startswith("benchmarks/") and not (ROOT / word).exists():
                        wrong.append(f"{block.where}: {word} does not exist")
        elif target == "prose":
            if block.kind != "table" or re.search(r"\d\.\d", block.text):
                wrong.append(f"{block.where}: 'prose' is for tables without measured numbers")
        else:
            wrong.append(f"{block.where}: unknown marker {target!r}")
    assert not wrong, "\n".join(wrong)


def test_the_marker_check_catches_a_missing_or_wrong_marker(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("Text\n\n```\nwrote x\n```\n\n<!-- made-by: prose -->\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
                    "<!-- made-by: tests/test_docs.py::test_x -->\n```bash\nquarl ptq X\n```\n")
    blocks = blocks_of(page)
    assert [(b.kind, b.language, b.marker) for b in blocks] == [
        ("fence", "", None), ("table", "", "prose"), ("fence", "bash", "tests/test_docs.py::test_x")]
    assert [needs_marker(b) for b in blocks] == [True, True, False]


# ---------------------------------------------------------------------------------------
# (d) every command line parses


def test_every_quarl_command_in_the_docs_parses() -> None:
    lines = doc_command_lines()
    assert len(lines) > 40, f"only {len(lines)} command lines found: the reader of the docs is broken"
    failures: list[str] = []
    for where, arguments in lines:
        try:
            parse_command(arguments)
        except ClickException as error:
            failures.append(f"{where}: quarl {shlex.join(arguments)}: {error.format_message()}")  # type: ignore[attr-defined]
    assert not failures, "\n".join(failures)


def test_a_renamed_option_fails_the_parse_check() -> None:
    parse_command(["ptq", "POLICY", "--precisions", "fp32,int8", "--episodes", "5"])
    with pytest.raises(UsageError, match="No such option: --precision-list"):
        parse_command(["ptq", "POLICY", "--precision-list", "fp32,int8"])
    with pytest.raises(typer.BadParameter, match="valid integer"):
        parse_command(["ptq", "POLICY", "--episodes", "five"])
    parse_command(["recover", OPTION_NAMED + "--finetune-steps", "--help"])  # named in prose, without its value
    with pytest.raises(UsageError, match="No such option: --finetune-stepz"):
        parse_command(["recover", OPTION_NAMED + "--finetune-stepz", "--help"])
    with pytest.raises(UsageError, match="runn"):
        parse_command(["actorq", "runn", "CartPole-v1"])
    with pytest.raises(UsageError, match="unexpected extra argument"):
        parse_command(["ptq", "POLICY", "EXTRA"])
    assert quarl_arguments("COLUMNS=160 .venv/bin/quarl bench X --budget 0.5   # a comment") == [
        ["bench", "X", "--budget", "0.5"]]
    assert quarl_arguments("for n in 1 2; do .venv/bin/quarl actorq run CartPole-v1 --actors $n; done") == [
        ["actorq", "run", "CartPole-v1", "--actors", "1"]]


# ---------------------------------------------------------------------------------------
# (b) tables copied from results files


def _results_blocks() -> list[Block]:
    return marked("results/")


@pytest.mark.parametrize("block", _results_blocks(), ids=lambda b: b.where)
def test_results_table_equals_the_file_the_command_wrote(block: Block) -> None:
    assert block.marker is not None
    paths = [ROOT / name for name in block.marker.split(" by ")[0].split(", ")]
    absent = [str(path.relative_to(ROOT)) for path in paths if not path.exists()]
    if absent:
        pytest.skip(f"{', '.join(absent)} not here (git keeps only the tables made on this project's machines so far): "
                    "the command writes it")
    if block.kind == "table":
        shown = [markdown_table(block.text)]
    else:
        shown = [item for item in parse_output(block.text) if isinstance(item, Table)]
    assert len(shown) == len(paths), f"{block.where}: {len(shown)} tables for {len(paths)} files"
    for table, path in zip(shown, paths, strict=True):
        written = markdown_table(path.read_text())
        missing = [column for column in table.header if column not in written.header]
        assert not missing, f"{block.where}: columns {missing} are not in {path.relative_to(ROOT)}"
        projected = [[row[written.header.index(column)] for column in table.header] for row in written.rows]
        remaining = iter(projected)
        for row in table.rows:  # rows in the file's order; a doc may leave rows out (and says so)
            assert any(row == candidate for candidate in remaining), \
                f"{block.where}: row {row} is not in {path.relative_to(ROOT)} (in this order)"


def test_the_table_comparison_fails_on_a_changed_number(tmp_path: Path) -> None:
    shown = parse_output("┏━━━┳━━━┓\n┃ a ┃ steps_per_s ┃\n┡━━━╇━━━┩\n│ 1.00 │ 5.0 │\n└───┴───┘\n")
    made = parse_output(" title\n┏━━━┳━━━┓\n┃ a ┃ steps_per_s ┃\n┡━━━╇━━━┩\n│ 1.00 │ 9.0 │\n└───┴───┘\n")
    assert isinstance(shown[0], Table) and isinstance(made[0], Table)
    made[0].title = ""
    compare_table(shown[0], made[0], "here")  # a timing column may differ
    made[0].rows[0][0] = "1.01"
    with pytest.raises(AssertionError, match="the doc says '1.00', the command prints '1.01'"):
        compare_table(shown[0], made[0], "here")


# ---------------------------------------------------------------------------------------
# (a) the cheap commands, run as the docs show them


def _only(test_name: str) -> Block:
    (block,) = block_made_by(test_name)
    return block


@pytest.mark.slow
def test_ptq_lunarlander(doc_run: Path) -> None:
    """README's precision table (fp32, int8, int4), played until its verdicts decide (40 s:
    160 episodes a precision and two int mode choices)."""
    for block in block_made_by("test_ptq_lunarlander"):
        (line,) = command_before(block)
        compare_chosen_output(block, run_doc_command(line))


@pytest.mark.slow
def test_ptq_lunarlander_every_precision(doc_run: Path) -> None:
    """ptq.md's precision table: five precisions played until their verdicts decide (40 s)."""
    for block in block_made_by("test_ptq_lunarlander_every_precision"):
        (line,) = command_before(block)
        compare_chosen_output(block, run_doc_command(line))


def test_sweep_and_analyze_dqn_cartpole(doc_run: Path) -> None:
    for block in block_made_by("test_sweep_and_analyze_dqn_cartpole"):
        (line,) = command_before(block)
        compare_output(block, run_doc_command(line))


@pytest.mark.slow
def test_export_ptq_and_play_lunarlander(doc_run: Path) -> None:
    """README's quick start (export, ptq of the export, play) and deploy.md's export and
    play blocks: the exported file plays ptq's int8 returns."""
    for block in block_made_by("test_export_ptq_and_play_lunarlander"):
        printed = "".join(run_doc_command(line) for line in command_before(block))
        compare_chosen_output(block, printed)


def test_portable_export_its_sidecar_and_bench(doc_run: Path) -> None:
    """deploy.md's --portable export, its sidecar and bench, for the int4 mode this CPU picks:
    the docs' (``int4-block``, activations rounded to int8, which a runtime in fp32 skips) where
    it is of the docs' kind; elsewhere its own, whose size and mode the file and sidecar
    hold, and whose check against fp32 arithmetic is float rounding where its activations
    stay fp32 (``int4-weight-only``). The note export prints where ONNX Runtime runs the
    portable file otherwise than the contrib kernel is printed exactly there."""
    from quarl.cli.export import portable_note
    from quarl.quant.modes import MODES, int8_compute

    export, sidecar_block, bench = block_made_by("test_portable_export_its_sidecar_and_bench")
    folder = doc_run / "results/quick/lunar-int4-portable"
    (line,) = command_before(export)
    printed = run_doc_command(line)
    sidecar = json.loads((folder / "policy.json").read_text())
    # a CPU whose ONNX Runtime runs the portable file otherwise than the contrib kernel gets a note saying so
    note = portable_note(sidecar["portable"])
    assert [line for line in printed.splitlines() if line.startswith("note:")] == ([note] if note else [])
    by_property = compare_chosen_output(export, printed.replace(f"{note}\n", "") if note else printed)
    mode = sidecar["quant"]["mode"]
    assert f"({(folder / 'policy.onnx').stat().st_size:,} bytes, mode {mode})" in printed
    assert sidecar["onnx_bytes"] == (folder / "policy.onnx").stat().st_size

    kernel = MODES[mode]
    rounds_activations = kernel.student is not None and kernel.student.activations == "int8-block" \
        and int8_compute(kernel.bits) == "int8"
    shown = json.loads("{" + sidecar_block.text.strip().rstrip(",") + "}")
    for key, value in shown.items():
        made = sidecar[key]
        if key != "portable":
            assert made == value, f"{sidecar_block.where}: {key}: the doc says {value}, the sidecar has {made}"
        elif rounds_activations:  # the docs' kernel: measured agreement, the doc rounds it
            for side, numbers in value.items():
                for name, number in numbers.items():
                    assert made[side][name] == pytest.approx(number, abs=0.0005), (side, name)
        else:  # fp32 activations in the contrib kernel and in fp32 arithmetic: float rounding apart (ONNX
            # Runtime fuses DequantizeLinear + MatMul into a MatMulNBits of its own accuracy level: the note above)
            assert set(made) == set(value)
            plain = made["fp32_arithmetic"]
            assert plain["action_agreement"] == 1.0 and plain["max_abs_diff"] <= 1e-4, plain

    (line,) = command_before(bench)
    printed = run_doc_command(line)
    if compare_chosen_output(bench, printed) or by_property:
        (table,) = [item for item in parse_output(printed) if isinstance(item, Table)]
        (row,) = table.rows
        assert (row[table.header.index("mode")], int(row[table.header.index("model_bytes")])) == \
            (mode, sidecar["onnx_bytes"])


def test_bench_dqn_cartpole(doc_run: Path) -> None:
    """The bench table's rows, engines, modes and sizes (its times are this machine's:
    timed briefly here, checked only as numbers). Where this CPU picks other int modes than
    the docs', their sizes as 8- and 4-bit weights make them: int4 < int8 < half of fp32's."""
    block = _only("test_bench_dqn_cartpole")
    (line,) = command_before(block)
    printed = run_doc_command(line + " --budget 0.02")
    if compare_chosen_output(block, printed):
        (table,) = [item for item in parse_output(printed) if isinstance(item, Table)]
        size = {row[0]: int(row[table.header.index("model_bytes")]) for row in table.rows}
        assert size["int4"] < size["int8"] < size["fp32-ort"] / 2, size


def test_one_line_errors(doc_run: Path) -> None:
    for block in block_made_by("test_one_line_errors"):
        (command,) = [line[2:] for line in block.text.splitlines() if line.startswith("$ ")]
        printed = run_doc_command(command, stderr=True)
        expected = "\n".join(line for line in block.text.splitlines() if not line.startswith("$ "))
        assert printed.strip() == expected.strip(), f"{block.where}: the command prints {printed!r}"


def test_python_api_blocks(doc_run: Path) -> None:
    """README's and quickstart.md's Python blocks print what the docs show. Where this CPU
    picks another int8 mode than the docs' (quickstart.md), the return printed for it is that
    mode's, asked for by name."""
    import quarl

    for block in block_made_by("test_python_api_blocks"):
        names: dict[str, Any] = {"__name__": "__doc__"}
        printed = run_python_block(block, names)
        if compare_chosen_output(block, printed):
            agent, chosen = names["agent"], names["int8"].meta["quant"]
            shown_fp32 = [line for line in block.text.splitlines() if not int_modes_in(line)]
            assert shown_fp32 == [line for line in printed.splitlines() if not int_modes_in(line)]  # not chosen
            by_name = quarl.quantize(agent.policy, chosen["mode"], agent.env_spec)
            if by_name.meta["quant"]["fp32_layers"] == chosen["fp32_layers"]:  # the same model: the same return
                mean = quarl.evaluate(by_name, agent.env_spec, episodes=20).mean
                assert f"{chosen['mode']} {mean}" in printed.splitlines(), (printed, mean)


@pytest.mark.slow
def test_train_qat_example(tmp_path: Path) -> None:
    """train.md's QAT run: 40k steps (about a minute here)."""
    block = _only("test_train_qat_example")
    (line,) = command_before(block)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        compare_output(block, run_doc_command(line))

