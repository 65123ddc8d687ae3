"""The ActorQ scaling model: from the component costs that runs measured, predict which
part bounds progress, the env steps per second and the time-to-reward speedup of int8 (or
any) actors over fp32 ones for N actors on M nodes, a learner g times faster (a GPU) and a
network of a given bandwidth.

The throughput X (env steps / s) is the smallest of four limits::

    actors    N / a                      a: an actor's wall seconds per env step when not
                                            held back (its work, Ray's dispatch), plus the
                                            network time of one pull every U steps
    learner   E / l                      E = batch / samples_per_insert env steps per
                                            learner step (impala: its whole unrolls); l: seconds per learner step / g
    cores     (K - e - M o) / (c + d + l/E + b/(E P))  the K cores the actors (c: their CPU
                                            seconds per step) share with the coordinator
                                            (d: its CPU per step beyond learner steps), a
                                            CPU learner, the
                                            broadcaster (b: seconds to build one weight
                                            version, P: learner steps per version), the
                                            evaluator (e: the cores it keeps busy) and
                                            the rest of each of the M machines (o: cores
                                            busy beyond all the parts above: Ray's
                                            daemons, the OS; pooled over the runs)
    network   W U / B                    every actor pulls B bytes at most every U steps

The time to reward is S / X for the S env steps a run needed: at one replay ratio the
learner sees the same data whatever the actors compute in, so S does not depend on the
actors' precision and the speedup of precision p is X_p / X_fp32.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from quarl.actorq.summary import ActorQSummary
from quarl.core.errors import QuarlError
from quarl.core.table import Row

if TYPE_CHECKING:
    from quarl.actorq.config import ConfigValue

PAPER_SPEEDUPS = {
    "Cartpole Balance": 3.12, "Walker Stand": 1.63, "Hopper Stand": 1.57, "Reacher Hard": 1.82,
    "Cheetah Run": 2.82, "Finger Spin": 3.06, "Humanoid Stand": 1.51, "Humanoid Walk": 2.89,
    "Cartpole (Gym)": 3.70, "Mountain Car (Gym)": 2.22, "Acrobot (Gym)": 5.41,
}
"""Time-to-reward speedups of int8 over fp32 actors in the paper (GPU learner, many actors)."""


@dataclass(frozen=True)
class Costs:
    """What one actor precision costs, averaged over the runs that measured it."""

    precision: str
    actor_s_per_step: float
    """An actor's wall seconds per env step when the rate limiter does not hold it back."""
    actor_cpu_s_per_step: float
    """Of which computing (inference, env, pulls, decode, loop)."""
    evaluator_cores: float
    background_cores: float
    """Cores each machine keeps busy beyond every part the run timed (0 when not recorded)."""
    coordinator_s_per_step: float
    """The driver's CPU per env step beyond learner steps (receiving chunks, replay)."""
    learner_s_per_step: float
    build_s_per_version: float
    """Broadcaster seconds to serialize (or quantize) one weight version."""
    broadcast_bytes: float
    env_steps_per_learner_step: float
    push_period: int
    update_period: int
    env_steps_to_target: float | None
    """Env steps the runs needed to reach the target (None: none reached it)."""
    measured: tuple[tuple[int, int, float], ...] = ()
    """(actors, machine cores, measured env steps / s) of each run."""


@dataclass(frozen=True)
class Cluster:
    actors: int
    nodes: int = 1
    cores_per_node: int = 2
    learner_speedup: float = 1.0
    """How much faster the learner steps than in the measured runs (a GPU: 10-50x)."""
    bandwidth_bytes_per_s: float = math.inf
    """Broadcaster to actors; inf: the same machine (its cost is in the measured pulls)."""

    def __post_init__(self) -> None:
        if self.actors < 1 or self.nodes < 1 or self.cores_per_node < 1:
            raise QuarlError(f"actors {self.actors}, nodes {self.nodes} and cores per node {self.cores_per_node} "
                             "must each be at least 1")
        if not 0 < self.learner_speedup < 1e6:  # inf: a learner step of no time divided by
            raise QuarlError(f"--learner-speedup {self.learner_speedup} must be a finite number above 0 (below 1e6)")
        if not self.bandwidth_bytes_per_s > 0:
            raise QuarlError("the bandwidth must be > 0")

    @property
    def learner_on_cpu(self) -> bool:
        return self.learner_speedup <= 1.0


@dataclass(frozen=True)
class Prediction:
    env_steps_per_s: float
    regime: str
    """Which limit binds: actors, learner, cores or network."""
    limits: dict[str, float]
    time_to_reward_s: float | None


def predict(costs: Costs, cluster: Cluster) -> Prediction:
    e = costs.env_steps_per_learner_step
    learner = costs.learner_s_per_step / cluster.learner_speedup
    transfer = costs.broadcast_bytes / cluster.bandwidth_bytes_per_s / costs.update_period
    actor = costs.actor_s_per_step + transfer
    per_step_cpu = (costs.actor_cpu_s_per_step + costs.coordinator_s_per_step
                    + costs.build_s_per_version / (e * costs.push_period))
    if cluster.learner_on_cpu:
        per_step_cpu += learner / e
    limits = {
        "actors": cluster.actors / actor,
        "learner": e / learner,
        "cores": max(cluster.nodes * (cluster.cores_per_node - costs.background_cores) - costs.evaluator_cores, 0.0)
        / per_step_cpu,
        "network": cluster.bandwidth_bytes_per_s * costs.update_period / max(costs.broadcast_bytes, 1.0),
    }
    regime = min(limits, key=lambda name: limits[name])
    x = limits[regime]
    ttr = costs.env_steps_to_target / x if costs.env_steps_to_target else None
    return Prediction(x, regime, limits, ttr)


MODEL_FIELDS: dict[str, tuple[float, float, bool]] = {
    "actors": (1, 4096, True), "batch_size": (1, 10**9, True), "push_period": (1, 10**12, True),
    "update_period": (1, 10**12, True), "unroll_length": (1, 10**9, True), "samples_per_insert": (0, 10**9, False)}
"""What the model reads of a run's config, each a number in (low, high] for
``samples_per_insert`` (a rate: 0 divides by zero), else in [low, high], whole where marked."""


def _number(config: Mapping[str, ConfigValue], name: str, where: str = "a run's config") -> float:
    """A run's config value ``name`` as a checked number (KeyError where the config lacks
    it): a finite number (or a number's text, as an older quarl wrote some) within
    :data:`MODEL_FIELDS`' range, else one line naming ``where``, the field and what is
    allowed ('abc' was a ValueError traceback, 0 a ZeroDivisionError, '1e400' actors an
    OverflowError, NaN or -5 a model of nothing, printed with exit 0)."""
    value = config[name]
    low, high, whole = MODEL_FIELDS.get(name, (-math.inf, math.inf, False))
    allowed = (f"a whole number in {low:,.0f}..{high:,.0f}" if whole else
               f"a number above {low:,.0f}, at most {high:,.0f}" if name == "samples_per_insert" else "a finite number")
    number = math.nan
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            number = float(value)
        except (ValueError, OverflowError):  # 'abc', 10**400
            pass
    if not (math.isfinite(number) and low <= number <= high and (number > low or name != "samples_per_insert")
            and (not whole or number.is_integer())):
        raise QuarlError(f"{where}: config field {name}: {value!r:.60} is not {allowed}: refused")
    return number


def _actors(s: ActorQSummary) -> int:
    """The run's actor count (KeyError where its config lacks it)."""
    return int(_number(s.config, "actors"))


def _cores(s: ActorQSummary) -> int:
    """The cores of the run's machine (KeyError where its summary lacks them)."""
    cores = s.machine["cores"]
    if cores is None:
        raise QuarlError("a run's machine did not know its core count (os.cpu_count() was None): rerun it elsewhere")
    return cores


def _env_steps_per_learner_step(config: Mapping[str, ConfigValue]) -> float:
    """Replay algorithms (dqn, d4pg): a batch over the replay ratio; unroll algorithms
    (impala): every step is learned from once, in whole unrolls."""
    from quarl.actorq.algorithms import find_algorithm

    algorithm = find_algorithm(str(config.get("algo")))
    if algorithm is not None and algorithm.unrolls:
        length = int(_number(config, "unroll_length"))
        return float(max(1, int(_number(config, "batch_size")) // length) * length)
    return _number(config, "batch_size") / _number(config, "samples_per_insert")


def costs_from_summaries(precision: str, summaries: Sequence[ActorQSummary], background: float | None = None) -> Costs:
    """``precision``'s costs, averaged over its runs; ``background``: the machine's
    background cores when known from more runs than these (see :func:`machine_background`)."""
    if not summaries:
        raise QuarlError(f"no runs for actor precision {precision!r}")
    try:
        def mean(values: Iterable[float]) -> float:
            return float(np.mean(list(values)))

        def known(values: Iterable[float | None], what: str) -> float:
            """The mean of the runs that measured it: a fleet error stores a value as
            missing, and a missing value never counts as zero."""
            got = [v for v in values if v is not None]
            if not got:
                raise QuarlError(f"no {precision} run measured {what} (a fleet error stored it as missing): rerun one")
            return float(np.mean(got))

        reached = [s.env_steps_at_target for s in summaries if s.env_steps_at_target]
        config = summaries[0].config
        return Costs(
            precision=precision,
            actor_s_per_step=mean(s.actor_wall_ms_per_step / 1000 for s in summaries),
            actor_cpu_s_per_step=mean(s.actor_busy_ms_per_step / 1000 for s in summaries),
            evaluator_cores=known((None if s.evaluator_busy_s is None else s.evaluator_busy_s / max(s.elapsed_s, 1e-9)
                                   for s in summaries), "the evaluator's busy time"),
            background_cores=known((background_cores(s) for s in summaries), "the machine's background")
            if background is None else background,
            coordinator_s_per_step=mean(s.coordinator_ms_per_step / 1000 for s in summaries),
            learner_s_per_step=mean(s.learner_ms_per_step / 1000 for s in summaries),
            build_s_per_version=known((s.broadcast.get("build_s") for s in summaries), "the broadcast's build time"),
            broadcast_bytes=known((s.broadcast.get("bytes") for s in summaries), "the broadcast's bytes"),
            env_steps_per_learner_step=_env_steps_per_learner_step(config),
            push_period=int(_number(config, "push_period")),
            update_period=int(_number(config, "update_period")),
            env_steps_to_target=mean(reached) if reached else None,
            measured=tuple((_actors(s), _cores(s), float(s.env_steps_per_s))
                           for s in summaries),
        )
    except KeyError as exc:
        raise QuarlError(f"a {precision} run's summary.json lacks {exc}: it was written by an older quarl; "
                         "rerun it") from None


def background_cores(s: ActorQSummary) -> float | None:
    """Cores the run's machine was busy beyond the parts it timed: the actors' chunks, the
    learner, the evaluator, the coordinator and the broadcaster's builds (0 for a run from
    before the machine's load was recorded; None where a part's time is missing)."""
    if s.machine_busy_cores is None:
        return 0.0
    if s.evaluator_busy_s is None or "build_s" not in s.broadcast:
        return None
    timed_s = (s.actor_busy_ms_per_step * s.env_steps / 1000 + s.learner_busy_s + s.evaluator_busy_s
               + s.coordinator_ms_per_step * s.env_steps / 1000 + s.broadcast.get("build_s", 0.0) * s.weight_versions)
    return max(0.0, s.machine_busy_cores - timed_s / max(s.elapsed_s, 1e-9))


def machine_background(runs: dict[str, list[ActorQSummary]]) -> float:
    """The background load of the machine, pooled over every run of every precision: it
    belongs to the machine (Ray's daemons, the OS), not to the actors' precision, and one
    run's estimate is noisy (two 90 s runs here gave 0.06 and 0.23 cores)."""
    known = [b for summaries in runs.values() for s in summaries if (b := background_cores(s)) is not None]
    if not known:
        raise QuarlError("no run measured the machine's background load (a fleet error stored a part as missing): "
                         "rerun one")
    return float(np.mean(known))


def load_runs(folders: Sequence[Path]) -> dict[str, list[ActorQSummary]]:
    """Summaries by actor precision, from run folders or compare folders (any depth)."""
    found: dict[str, list[ActorQSummary]] = {}
    for folder in folders:
        if not Path(folder).exists():
            raise QuarlError(f"{folder} does not exist")
        paths = [Path(folder)] if Path(folder).is_file() else sorted(Path(folder).rglob("summary.json"))
        if not paths:
            raise QuarlError(f"{folder} holds no ActorQ summary.json")
        for path in paths:
            summary = ActorQSummary.read(path)
            for name in MODEL_FIELDS.keys() & summary.config.keys():  # checked here, where the file is known
                _number(summary.config, name, str(path))
            found.setdefault(summary.actor_precision, []).append(summary)
    return found


def validation_rows(
    train: dict[str, list[ActorQSummary]], test: dict[str, list[ActorQSummary]] | None = None
) -> list[Row]:
    """Each measured run against the model: costs from ``train`` runs predict the
    throughput of each ``test`` run (its actor count, its machine's cores)."""
    rows: list[Row] = []
    for precision, runs in (test or train).items():
        if precision not in train:
            continue
        costs = costs_from_summaries(precision, train[precision], machine_background(train))
        for s in runs:
            actors, cores = _actors(s), _cores(s)
            p = predict(costs, Cluster(actors=actors, cores_per_node=cores))
            measured = float(s.env_steps_per_s)
            rows.append({"actor_precision": precision, "actors": actors, "cores": cores, "regime": p.regime,
                         "predicted_steps_per_s": round(p.env_steps_per_s, 1),
                         "measured_steps_per_s": round(measured, 1),
                         "error_pct": round(100 * (p.env_steps_per_s - measured) / measured, 1)})
    return rows


def scaling_rows(costs: dict[str, Costs], actors: Sequence[int], cluster: Cluster, baseline: str = "fp32") -> list[Row]:
    if baseline not in costs:
        raise QuarlError(f"the runs have no {baseline} actors to compare against (have {', '.join(costs)})")
    rows: list[Row] = []
    for n in actors:
        c = Cluster(n, cluster.nodes, cluster.cores_per_node, cluster.learner_speedup, cluster.bandwidth_bytes_per_s)
        base = predict(costs[baseline], c)
        for precision, cost in costs.items():
            p = predict(cost, c)
            rows.append({"actors": n, "actor_precision": precision, "regime": p.regime,
                         "env_steps_per_s": round(p.env_steps_per_s, 1),
                         "time_to_reward_s": round(p.time_to_reward_s, 1) if p.time_to_reward_s else math.nan,
                         "speedup": round(p.env_steps_per_s / base.env_steps_per_s, 2)})
    return rows


def wire_variants(costs: Costs, bits: Sequence[int]) -> dict[str, Costs]:
    """A float precision's costs with the weights sent at other widths (bytes scale with
    the width; the measured decode time is kept)."""
    out = {}
    for b in bits:
        out[f"{costs.precision}@{b}"] = Costs(**{**costs.__dict__, "precision": f"{costs.precision}@{b}",
                                                 "broadcast_bytes": costs.broadcast_bytes * b / 32})
    return out


def plot_scaling(rows: list[dict], path: Path, title: str, validation: list[dict] | None = None) -> Path:
    """Predicted speedup over fp32 actors against the number of actors, one line per
    precision (and wire width), with the paper's int8 speedups beside them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from quarl.evaluation.reports import save_figure

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for precision in dict.fromkeys(r["actor_precision"] for r in rows):
        pts = [(r["actors"], r["speedup"]) for r in rows if r["actor_precision"] == precision]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=f"{precision} (model)")
    if validation:
        for v in validation:
            ax.scatter([v["actors"]], [v["measured_speedup"]], marker="x", color="k", zorder=5)
        ax.scatter([], [], marker="x", color="k", label="measured here")
    xmax = max(r["actors"] for r in rows)
    paper = list(PAPER_SPEEDUPS.values())
    ax.scatter([xmax * 1.6] * len(paper), paper, marker="_", s=200, color="tab:red", label="paper, int8 (GPU learner)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("actors")
    ax.set_ylabel("time-to-reward speedup over fp32 actors")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


@dataclass(frozen=True)
class ModelReport:
    """What :func:`model_report` wrote and the terminal shows."""

    rows: list[Row]
    """The scaling table: one row per actor count and precision."""
    validation: list[Row]
    """Each measured run against the model."""
    files: list[Path]
    where: str
    """The cluster predicted for, in words."""


def model_report(runs: dict[str, list[ActorQSummary]], actors: Sequence[int], cluster: Cluster, out: Path,
                 validate: dict[str, list[ActorQSummary]] | None = None, wire_bits: Sequence[int] = ()) -> ModelReport:
    """The model's whole output: the scaling table and plot for ``cluster`` at each actor
    count, and the validation of every measured run (``validate`` runs predicted from
    ``runs``' costs, or ``runs`` themselves). Writes model.{csv,md,json},
    validation.{csv,md,json} and scaling.png under ``out``."""
    from quarl.evaluation.reports import write_rows

    background = machine_background(runs)
    costs = {p: costs_from_summaries(p, r, background) for p, r in runs.items()}
    for precision in list(costs):
        if wire_bits and precision not in ("int8", "int4"):  # int8 / int4 actors are sent a ready ONNX model
            costs.update(wire_variants(costs[precision], [b for b in wire_bits if b != 32]))
    rows = scaling_rows(costs, actors, cluster)
    check = validation_rows(runs, validate)
    measured: dict[tuple[int, str], list[float]] = {}
    for summaries in (validate or runs).values():
        for s in summaries:
            measured.setdefault((_actors(s), s.actor_precision), []).append(
                float(s.env_steps_per_s))
    points = [{"actors": n, "measured_speedup": float(np.mean(v) / np.mean(measured[(n, "fp32")]))}
              for (n, p), v in measured.items() if p != "fp32" and (n, "fp32") in measured]
    out.mkdir(parents=True, exist_ok=True)
    files = write_rows(rows, out, "model") + write_rows(check, out, "validation")
    where = (f"{cluster.nodes} node(s) x {cluster.cores_per_node} cores, learner x{cluster.learner_speedup:g}, "
             + ("same machine" if math.isinf(cluster.bandwidth_bytes_per_s)
                else f"{8 * cluster.bandwidth_bytes_per_s / 1e9:g} Gbit/s"))
    files.append(plot_scaling(rows, out / "scaling.png", f"ActorQ model: {where}", points))
    return ModelReport(rows, check, files, where)
