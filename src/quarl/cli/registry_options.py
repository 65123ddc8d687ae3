"""Option values checked against quarl's registries and settings classes (precisions and
their options, ActorQ actor precisions and wire widths, evaluation settings): the CLI's, apart
from :mod:`quarl.core.validate`, which the registries themselves import and so must import none
of them."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from quarl.core import validate
from quarl.core.errors import QuarlError
from quarl.core.validate import items, positive_ints

if TYPE_CHECKING:
    from quarl.evaluation.cells import EvalSettings
    from quarl.quantization.config import QuantConfig
    from quarl.study.grid import Column


class QuantOptions(TypedDict):
    """The :class:`~quarl.quantization.config.QuantConfig` fields every cell of a command shares
    (``--int8-weights``, ``--block-size``), checked by :func:`quant_options`."""

    int8_weights: str
    block_size: int


def configs(text: str, base: QuantConfig | None = None) -> list[QuantConfig]:
    """The labels of --precisions, each parsed once onto ``base`` (the command's int options,
    :meth:`quarl.cli.settings.IntOptions.config`): the configs its cells run, in order, once
    each. A study column (``rec-int4``) is refused with the command that recovers it."""
    from quarl.quantization.config import QuantConfig
    from quarl.recovery import RECOVERED_PREFIX

    parsed = []
    for label in items(text, "--precisions"):
        if label.lower().startswith(RECOVERED_PREFIX):
            raise QuarlError(f"{label!r} is a study column: here run quarl recover POLICY --precision "
                             f"{label[len(RECOVERED_PREFIX):]}")
        parsed.append(QuantConfig.parse(label, base))  # raises a clear error for an unknown one
    return parsed


def columns(text: str, base: QuantConfig | None = None) -> list[Column]:
    """quarl study's --precisions: its columns, each label parsed once onto ``base``;
    ``rec-int4`` / ``rec-int8`` (the agent recovered at that precision) allowed."""
    from quarl.study.grid import Column

    return [Column.parse(label, base) for label in items(text, "--precisions")]


def quant_options(int8_weights: str, block_size: int) -> QuantOptions:
    """QuantConfig fields shared by every cell, validated (one line for a bad value)."""
    from quarl.quantization.config import QuantConfig

    QuantConfig(int8_weights=int8_weights, block_size=block_size)
    return {"int8_weights": int8_weights, "block_size": block_size}


def actor_precisions(text: str) -> list[str]:
    """actorq compare --precisions: actor precisions, one run each."""
    from quarl.actorq.actor_precisions import actor_precisions as registered

    labels = items(text, "--precisions")
    allowed = registered()
    bad = [p for p in labels if p not in allowed]
    if bad:
        raise QuarlError(f"unknown precision {bad[0]!r} in --precisions: allowed {', '.join(allowed)}")
    return labels


def wire_widths(text: str) -> list[int]:
    """actorq model --wire-bits: widths float actors pull weights at (empty: none)."""
    from quarl.actorq.config import WIRE_BITS

    widths = positive_ints(text, "--wire-bits") if text else []
    bad = [b for b in widths if b not in WIRE_BITS]
    if bad:
        raise QuarlError(f"--wire-bits {bad[0]} is not a width actors pull: allowed {', '.join(map(str, WIRE_BITS))}")
    return widths


def check_eval_values(episodes: int, seed_value: int, n_envs: int, max_steps: int | None) -> None:
    """The plain evaluation values, checked without importing anything heavy (a bad value
    answers at once)."""
    validate.eval_values(episodes, seed_value, n_envs)


def eval_settings(episodes: int, seed_value: int, n_envs: int, max_steps: int | None,
                  worker_count: int = 1) -> EvalSettings:
    """The evaluation settings of a command, each checked (:func:`check_eval_values` first,
    before anything heavy loads: a bad value answers at once)."""
    check_eval_values(episodes, seed_value, n_envs, max_steps)
    from quarl.evaluation.cells import EvalSettings

    return EvalSettings(episodes=episodes, seed=seed_value, n_envs=n_envs, max_steps=max_steps, workers=worker_count)
