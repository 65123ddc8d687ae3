"""What a command checks before torch, ONNX Runtime, gymnasium or Stable-Baselines3 load, so
that a typo answers in well under a second instead of after them (4 to 9 s on a busy 2-core
machine): its precisions against the labels the registries held when a command last loaded
them (kept beside the help lists, :mod:`quarl.cli.help_lists`), an env id, a checkpoint that is
a file no format reads, an ``--out`` that is or holds an input. Each refuses in the very line
the full check would say later; where it cannot tell (no cached labels yet, a
``--gym-packages`` module that may register entries, registries already loaded), it leaves the
value to the full check. ``benchmarks/bench_cli_latency.py`` measures the refusals."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from quarl.core import validate

PRECISION_LISTS = ("precisions", "precision_labels", "precision_allowed")
"""The help lists made from the precision registry (:data:`quarl.cli.help_lists.LISTS`)."""


def _gym_packages() -> tuple[str, ...]:
    """The ``--gym-packages`` modules imported (none where :mod:`quarl.envs` is not yet)."""
    envs = sys.modules.get("quarl.envs")
    return envs.gym_packages() if envs is not None else ()


def precisions(text: str | None) -> None:
    """Refuse an unknown label of ``text`` (a --precisions / --precision value) with the
    labels cached when a command last loaded the registries; ``rec-`` study columns and
    everything where nothing is cached are left to :func:`quarl.registry_options.precisions`."""
    if text is None or "quarl.quant.precisions" in sys.modules or _gym_packages():
        return  # the registry is here (as fast to ask), or a module may have added to it
    from quarl.cli import help_lists

    cached = help_lists.read_cache()
    labels, allowed = cached.get("precision_labels"), cached.get("precision_allowed")
    if not labels or not allowed:
        return
    known = set(labels.split(","))
    for label in validate.items(text, "--precisions"):
        lower = label.lower()
        if lower not in known and not lower.startswith("rec-"):
            raise validate.unknown_precision(label, allowed)


def remember_precisions() -> None:
    """Where this command loaded the precision registry (and no ``--gym-packages`` module could
    have added to it), keep its labels with the help lists for :func:`precisions`."""
    if "quarl.quant.modes" not in sys.modules or "quarl.quant.precisions" not in sys.modules or _gym_packages():
        return
    from quarl.cli import help_lists

    if help_lists.cache_file() is None:
        return
    stored = help_lists.read_cache()
    if all(name in stored for name in PRECISION_LISTS):
        return
    lists = dict(stored)
    for name in PRECISION_LISTS:
        lists.setdefault(name, help_lists.LISTS[name]())
    help_lists.write_cache(lists)


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
