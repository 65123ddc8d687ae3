"""The ActorQ scaling model: its limits against hand-computed numbers, the regime it
names, the validation it reports, and the command that writes it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from quarl.actorq.model import (
    Cluster,
    Costs,
    background_cores,
    costs_from_summaries,
    load_runs,
    machine_background,
    predict,
    scaling_rows,
    validation_rows,
)
from quarl.actorq.summary import ActorQSummary
from quarl.cli import app
from quarl.core.errors import QuarlError
from tests.conftest import actorq_summary


def _costs(precision: str, actor_ms: float, learner_ms: float = 50.0, **kw) -> Costs:
    base = dict(precision=precision, actor_s_per_step=actor_ms / 1000, actor_cpu_s_per_step=actor_ms / 1000,
                evaluator_cores=0.0, background_cores=0.0, coordinator_s_per_step=0.0,
                learner_s_per_step=learner_ms / 1000, build_s_per_version=0.0, broadcast_bytes=8e6,
                env_steps_per_learner_step=256.0, push_period=25, update_period=300, env_steps_to_target=100_000.0)
    return Costs(**{**base, **kw})


def test_limits_match_the_formulas() -> None:
    c = _costs("fp32", actor_ms=2.0, learner_ms=100.0, build_s_per_version=0.5)
    p = predict(c, Cluster(actors=1, cores_per_node=2))
    assert p.limits["actors"] == pytest.approx(500.0)  # 1 / 2 ms
    assert p.limits["learner"] == pytest.approx(2560.0)  # 256 env steps per 100 ms step
    per_step = 0.002 + 0.5 / (256 * 25) + 0.1 / 256
    assert p.limits["cores"] == pytest.approx(2 / per_step)
    assert math.isinf(p.limits["network"])
    assert p.regime == "actors" and p.env_steps_per_s == pytest.approx(500.0)
    assert p.time_to_reward_s == pytest.approx(200.0)  # 100k steps at 500 / s


def test_actor_wall_time_bounds_actors_and_cpu_time_bounds_cores() -> None:
    c = _costs("fp32", actor_ms=2.0, learner_ms=100.0, actor_cpu_s_per_step=0.0015, evaluator_cores=0.5,
               coordinator_s_per_step=0.0002)
    p = predict(c, Cluster(actors=4, cores_per_node=2))
    assert p.limits["actors"] == pytest.approx(2000.0)  # 4 / 2 ms of wall time
    # 1.5 ms of actor CPU and 0.2 ms of the coordinator's per step, 0.5 core evaluating
    assert p.limits["cores"] == pytest.approx((2 - 0.5) / (0.0015 + 0.0002 + 0.1 / 256))
    assert p.regime == "cores"


def test_regimes_move_with_actors_learner_and_network() -> None:
    c = _costs("fp32", actor_ms=2.0, learner_ms=100.0)
    assert predict(c, Cluster(actors=1, cores_per_node=64)).regime == "actors"
    assert predict(c, Cluster(actors=32, cores_per_node=64)).regime == "learner"  # 16000 > 2560
    assert predict(c, Cluster(actors=32, cores_per_node=4)).regime == "cores"
    gpu = predict(c, Cluster(actors=32, nodes=4, cores_per_node=16, learner_speedup=50))
    assert gpu.regime == "actors" and gpu.env_steps_per_s == pytest.approx(16000.0)
    slow_net = predict(c, Cluster(actors=32, nodes=4, cores_per_node=16, learner_speedup=50,
                                  bandwidth_bytes_per_s=1e6))  # 8 MB every 300 steps over 1 MB/s
    assert slow_net.regime == "network" and slow_net.env_steps_per_s == pytest.approx(1e6 * 300 / 8e6)


def test_speedup_is_the_throughput_ratio_and_vanishes_when_the_learner_binds() -> None:
    costs = {"fp32": _costs("fp32", 2.0), "int8": _costs("int8", 0.5, broadcast_bytes=2e6)}
    rows = scaling_rows(costs, [1, 64], Cluster(actors=1, nodes=8, cores_per_node=16, learner_speedup=1.0))
    by = {(r["actors"], r["actor_precision"]): r for r in rows}
    assert by[(1, "int8")]["speedup"] == pytest.approx(4.0)  # actor-bound: 2 ms / 0.5 ms
    assert by[(64, "int8")]["regime"] == by[(64, "fp32")]["regime"] == "learner"
    assert by[(64, "int8")]["speedup"] == pytest.approx(1.0)


def _summary(precision: str, actors: int, steps_per_s: float, actor_ms: float) -> dict:
    return actorq_summary(
        config={"actor_precision": precision, "actors": actors, "batch_size": 64, "samples_per_insert": 0.25,
                "push_period": 25, "update_period": 300},
        machine={"cores": 2}, env_steps_per_s=steps_per_s, actor_busy_ms_per_step=actor_ms,
        actor_wall_ms_per_step=actor_ms * 1.1, evaluator_busy_s=10.0, elapsed_s=100.0, coordinator_ms_per_step=0.05,
        learner_ms_per_step=40.0, broadcast={"bytes": 4e6, "build_s": 0.2}, env_steps_at_target=50_000)


def test_machine_cpu_beyond_the_timed_parts_is_background_load() -> None:
    """A run whose machine was busier than its actors, learner, evaluator, coordinator and
    builds account for leaves that remainder (Ray's daemons, the OS) off the cores limit."""
    fields = dict(env_steps=50_000, learner_busy_s=30.0, weight_versions=10)
    timed = (2.0 * 50_000 / 1000 + 30.0 + 10.0 + 0.05 * 50_000 / 1000 + 0.2 * 10) / 100.0  # cores, over 100 s
    busy = ActorQSummary.from_json({**_summary("fp32", 1, 500.0, 2.0), **fields, "machine_busy_cores": timed + 0.3})
    assert background_cores(busy) == pytest.approx(0.3)
    older = ActorQSummary.from_json({**_summary("fp32", 1, 500.0, 2.0), **fields})  # not recorded: none assumed
    assert background_cores(older) == 0.0
    with_bg, without = costs_from_summaries("fp32", [busy]), costs_from_summaries("fp32", [older])
    assert with_bg.background_cores == pytest.approx(0.3)
    cluster = Cluster(actors=8, cores_per_node=2)
    ratio = predict(with_bg, cluster).limits["cores"] / predict(without, cluster).limits["cores"]
    assert ratio == pytest.approx((2 - 0.1 - 0.3) / (2 - 0.1))  # 0.1 core evaluating (10 s of 100)
    four = Cluster(actors=8, nodes=4, cores_per_node=2)  # the background runs on every node
    assert predict(with_bg, four).limits["cores"] == pytest.approx((4 * (2 - 0.3) - 0.1) / (4 * 2 - 0.1)
                                                                   * predict(without, four).limits["cores"])
    # the machine's, pooled over every run of every precision
    assert machine_background({"fp32": [busy], "int8": [older, busy]}) == pytest.approx(0.2)
    assert costs_from_summaries("fp32", [busy], background=0.2).background_cores == 0.2


def test_validation_reports_the_error_of_each_run() -> None:
    train = {"fp32": [ActorQSummary.from_json(_summary("fp32", 1, 500.0, 2.0))]}
    test = {"fp32": [ActorQSummary.from_json(_summary("fp32", 2, 800.0, 2.0))]}
    rows = validation_rows(train, test)
    predicted = predict(costs_from_summaries("fp32", train["fp32"]), Cluster(actors=2, cores_per_node=2))
    assert rows == [{"actor_precision": "fp32", "actors": 2, "cores": 2, "regime": predicted.regime,
                     "predicted_steps_per_s": round(predicted.env_steps_per_s, 1), "measured_steps_per_s": 800.0,
                     "error_pct": round(100 * (predicted.env_steps_per_s - 800) / 800, 1)}]


def test_model_command_writes_tables_and_plot(tmp_path: Path) -> None:
    for precision, ms in (("fp32", 2.0), ("int8", 0.6)):
        for rep in range(2):
            run = tmp_path / "cmp" / precision / f"rep{rep}"
            run.mkdir(parents=True)
            (run / "summary.json").write_text(json.dumps(_summary(precision, 1, 1000 / ms * 0.9, ms)))
    r = CliRunner().invoke(app, ["actorq", "model", str(tmp_path / "cmp"), "--actors", "1,4,16", "--wire-bits", "8",
                                 "--learner-speedup", "20", "--out", str(tmp_path / "m")], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    rows = json.loads((tmp_path / "m" / "model.json").read_text())
    assert {row["actor_precision"] for row in rows} == {"fp32", "fp32@8", "int8"}
    int8_1 = next(row for row in rows if row["actors"] == 1 and row["actor_precision"] == "int8")
    assert int8_1["speedup"] == pytest.approx(2.0 / 0.6, rel=0.02)
    assert len(json.loads((tmp_path / "m" / "validation.json").read_text())) == 4
    assert (tmp_path / "m" / "scaling.png").stat().st_size > 10_000


def test_bad_runs_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(QuarlError, match="does not exist"):
        load_runs([tmp_path / "nope"])
    with pytest.raises(QuarlError, match="holds no ActorQ summary.json"):
        load_runs([tmp_path])
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(QuarlError, match="is not an ActorQ summary.json"):
        load_runs([tmp_path])
    r = CliRunner().invoke(app, ["actorq", "model", str(tmp_path), "--actors", "0"])
    assert r.exit_code == 2 and "--actors: '0' is not a positive integer" in r.output


def test_a_part_a_fleet_error_stored_as_missing_never_counts_as_zero() -> None:
    """The evaluator's time or the broadcast's stats that a fleet could not read are stored
    as missing: the model averages the runs that measured them, and refuses in one line
    when none did (a zero would have made the cluster prediction look faster)."""
    fields = dict(env_steps=50_000, learner_busy_s=30.0, weight_versions=10)
    good = ActorQSummary.from_json({**_summary("fp32", 1, 500.0, 2.0), **fields})
    lost = ActorQSummary.from_json({**_summary("fp32", 1, 500.0, 2.0), **fields, "evaluator_busy_s": None,
                                    "broadcast": {}})
    assert costs_from_summaries("fp32", [good, lost]).broadcast_bytes == 4e6  # the measured run's, not (4e6 + 0) / 2
    assert costs_from_summaries("fp32", [good, lost]).evaluator_cores == pytest.approx(0.1)
    with pytest.raises(QuarlError, match="no fp32 run measured the evaluator's busy time"):
        costs_from_summaries("fp32", [lost])
