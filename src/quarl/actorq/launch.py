"""From a command's options to an ActorQ run: the :class:`~quarl.actorq.config.ActorQConfig`
built from the options by name (no field copied by hand; the algorithm's own options taken
from its registry entry), its default output folder, the checks a run or a comparison makes
before anything starts, and the scaling model's cluster."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_origin, get_type_hints

from quarl import outputs
from quarl.core import validate
from quarl.core.errors import QuarlError

if TYPE_CHECKING:  # the config module loads torch; the CLI imports this one at start
    from quarl.actorq.acting import EnvInfo
    from quarl.actorq.algorithms import AlgorithmOptions
    from quarl.actorq.config import ActorQConfig
    from quarl.actorq.model import Cluster

RENAMED: dict[str, str] = {"eval_seconds": "eval_every_s", "eval_freq": "eval_every_steps"}
"""Options whose config field has another name (the option is named as ``train``'s is)."""
NOT_CONFIG = frozenset({"verbose", "out", "policy_layers"})
"""Options that are no config field as they are: the output folder is resolved first
(:func:`run_folder`), the layer widths a comma list."""


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def algorithm_options(options: Mapping[str, Any]) -> AlgorithmOptions:
    """The options of ``options["algo"]``'s entry from those given (None: not given, the
    field's default); an option of another algorithm given is refused in one line, a comma
    list of widths given as text is parsed."""
    from quarl.actorq.algorithms import get_algorithm, option_owners

    algo = options["algo"]
    entry = get_algorithm(algo).options
    own = {f.name for f in fields(entry)}
    owners = option_owners()
    values: dict[str, Any] = {}
    for name, value in options.items():
        if name not in owners or value is None:
            continue
        if name not in own:
            said = f"{flag(name)}/--no-{flag(name)[2:]}" if isinstance(value, bool) else flag(name)
            raise QuarlError(f"{said} is an option of --algo {', '.join(owners[name])}, not of {algo}")
        values[name] = value
    hints = get_type_hints(entry)
    for name, value in values.items():  # a comma list of widths given as text (the CLI gives it parsed)
        if isinstance(value, str) and get_origin(hints[name]) is tuple:
            values[name] = validate.layer_widths(value, flag(name))
    return entry(**values)


def run_folder(env_id: str, options: Mapping[str, Any], compare: bool) -> Path:
    """``--out`` (checked and created) or the default folder of this run or comparison."""
    given = validate.out_folder(options["out"])
    if given is not None:
        return given
    name = algorithm_options(options).run_name(options["algo"])  # e.g. impala-no-correction
    return outputs.actorq_folder(name, env_id, None if compare else options["actor_precision"])


def config_from_options(env_id: str, options: Mapping[str, Any], out: Path) -> ActorQConfig:
    """The config of ``actorq run`` / ``compare``: every shared option that names a config
    field (or one of :data:`RENAMED`) goes to it, the algorithm's own to its entry's options
    (:func:`algorithm_options`); an option that names none is a programming error (a new
    option must say where it goes), never silently dropped."""
    from quarl.actorq.algorithms import option_owners
    from quarl.actorq.config import ActorQConfig, shared_fields

    names = shared_fields()
    owners = option_owners()
    values: dict[str, Any] = {}
    for option, value in options.items():
        if option in NOT_CONFIG or option in owners:
            continue
        field = RENAMED.get(option, option)
        if field not in names:
            raise TypeError(f"option {option!r} names no ActorQConfig field: add it to RENAMED or NOT_CONFIG")
        values[field] = value
    return ActorQConfig(env_id, options=algorithm_options(options), out=out,
                        policy_layers=validate.layer_widths(options["policy_layers"]),
                        **{k: v for k, v in values.items() if k != "env_id"})


def check_run(config: ActorQConfig, compare: bool) -> EnvInfo:
    """The env against the algorithm (one line before anything starts); a comparison also
    needs a target reward (given, or the env's threshold) to measure the time to it."""
    from quarl.actorq.acting import env_info

    info = env_info(config)
    if compare and config.target_reward is None and info.reward_threshold is None:
        raise QuarlError(f"{config.env_id} has no reward threshold: pass --target-reward for the time-to-reward "
                         "comparison")
    return info


def model_cluster(nodes: int, cores_per_node: int | None, learner_speedup: float,
                  bandwidth_gbps: float | None) -> Cluster:
    """The cluster ``actorq model`` predicts for (its actor count set per prediction):
    ``cores_per_node`` None is this machine's, ``bandwidth_gbps`` None the same machine."""
    from quarl.actorq.model import Cluster

    validate.bandwidth_gbps(bandwidth_gbps)
    validate.count(cores_per_node, 1, "--cores-per-node", unset="this machine's")
    return Cluster(actors=1, nodes=nodes, cores_per_node=cores_per_node or os.cpu_count() or 1,
                   learner_speedup=learner_speedup,
                   bandwidth_bytes_per_s=bandwidth_gbps * 1e9 / 8 if bandwidth_gbps else float("inf"))


def prepare(env_id: str, options: Mapping[str, Any], compare: bool) -> tuple[ActorQConfig, Path]:
    """Everything ``actorq run`` / ``compare`` check before they start, in order: the env id,
    the output folder, the config, the env against the algorithm; returns the config and
    the folder."""
    from quarl.envs import check_env_id

    check_env_id(env_id)
    out = run_folder(env_id, options, compare)
    config = config_from_options(env_id, options, out)
    check_run(config, compare)
    return config, out
