"""What a command checks before torch, ONNX Runtime, gymnasium or Stable-Baselines3 load, so
that a typo answers in well under a second instead of after them (4 to 9 s on a busy 2-core
machine): its precisions against the labels of the help lists (:mod:`quarl.cli.help_lists`),
an env id, a checkpoint that is a file no format reads, an ``--out`` that is or holds an
input. Each refuses in the very line the full check would say later; where the registries are
already loaded or a ``--gym-packages`` module may register entries, it leaves the value to the
full check. ``benchmarks/bench_cli_latency.py`` measures the refusals."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from quarl.core import validate


def precisions(text: str | None) -> None:
    """Refuse an unknown label of ``text`` (a --precisions / --precision value) with the
    labels the help lists hold (:func:`quarl.cli.help_lists.get`: the built-in ones, unless
    the registry is here or a ``--gym-packages`` module may have added to it); ``rec-`` study
    columns are left to :func:`quarl.cli.registry_options.configs`."""
    from quarl.cli import help_lists

    if text is None or help_lists.live("precision_labels"):
        return  # the registry is here (as fast to ask), or a module may have added to it
    known = set(help_lists.get("precision_labels").split(","))
    for label in validate.items(text, "--precisions"):
        lower = label.lower()
        if lower not in known and not lower.startswith("rec-"):
            raise validate.unknown_precision(label, help_lists.get("precision_allowed"))


def env_id(env: str | None) -> None:
    """``--env``: a gymnasium id (or one an env family makes known), before the policy loads."""
    if env is not None:
        from quarl.envs import check_env_id

        check_env_id(env)


def out_folder(out: Path | None, inputs: Iterable[Path | str | None], option: str = "--out") -> None:
    """``--out``: not empty, not a file, and neither is, holds nor is inside an input; made
    later, by the command, once the rest is checked."""
    from quarl.outputs import apart_from_inputs

    if out is not None:
        validate.out_folder(apart_from_inputs(out, list(inputs), option), option, create=False)
