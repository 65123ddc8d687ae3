"""Studies: a grid of cells in SQLite, resumed after a kill, the same on Ray."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from quarl.core.errors import QuarlError
from quarl.study.grid import StudyConfig, find_agents, run_study
from quarl.study.report import study_table
from quarl.study.store import TABLE, StudyStore
from tests.conftest import ROOT


def _rows(db: Path) -> dict[tuple, str]:
    with sqlite3.connect(db) as conn:
        try:
            return {(p, s): f for p, s, f in conn.execute(f"SELECT precision, seed, finished_at FROM {TABLE}")}
        except sqlite3.OperationalError:  # polled between the file's creation and its table's
            return {}


def test_study_stores_each_cell_and_reruns_only_the_missing_ones(tiny_run: Path, tmp_path: Path) -> None:
    seen: list[tuple[str, int]] = []
    config = StudyConfig((tiny_run,), ("fp32", "int8", "int4"), (0, 1), episodes=2, n_envs=2, out=tmp_path)
    records = run_study(config, lambda r, done, total: seen.append((r["precision"], r["seed"])))
    assert len(records) == 6 and len(seen) == 6
    first = _rows(tmp_path / "study.sqlite")
    assert set(first) == {(p, s) for p in ("fp32", "int8", "int4") for s in (0, 1)}

    seen.clear()
    more = run_study(StudyConfig((tiny_run,), ("fp32", "int8", "int4"), (0, 1, 2), episodes=2, n_envs=2,
                                 out=tmp_path), lambda r, done, total: seen.append((r["precision"], r["seed"])))
    assert sorted(seen) == [("fp32", 2), ("int4", 2), ("int8", 2)]  # only the new seed ran
    assert len(more) == 9
    after = _rows(tmp_path / "study.sqlite")
    assert all(after[k] == v for k, v in first.items())  # stored cells untouched
    rows = study_table(more, ["int8", "int4"])
    assert rows[0]["seeds"] == 3 and set(rows[0]) >= {"fp32", "int8", "E_int8%", "int4", "E_int4%"}
    assert rows[0]["int8 range"] == rows[0]["int4 range"] == "env 0:500"  # CartPole's own range, as ptq judges it


def test_study_table_averages_seeds_and_tells_agents_apart() -> None:
    def rec(checkpoint: str, precision: str, seed: int, mean: float) -> dict:
        return {"checkpoint": checkpoint, "policy": "ppo CartPole-v1", "precision": precision, "seed": seed,
                "mean": mean}

    records = [rec("/z/ppo/CartPole-v1_1", "fp32", 0, 500.0), rec("/z/ppo/CartPole-v1_1", "fp32", 1, 480.0),
               rec("/z/ppo/CartPole-v1_1", "int4", 0, 245.0), rec("/z/ppo/CartPole-v1_1", "int4", 1, 245.0),
               rec("/p/ppo2/CartPole-v1.pkl", "fp32", 0, 500.0), rec("/p/ppo2/CartPole-v1.pkl", "int4", 0, 500.0)]
    rows = {r["policy"]: r for r in study_table(records, ["int4"])}
    zoo = rows["ppo CartPole-v1 (ppo/CartPole-v1_1)"]
    assert zoo["fp32"] == 490.0 and zoo["int4"] == 245.0 and zoo["E_int4%"] == 50.0 and zoo["seeds"] == 2
    paper = rows["ppo CartPole-v1 (ppo2/CartPole-v1.pkl)"]
    assert paper["E_int4%"] == 0.0 and paper["seeds"] == 1


@pytest.mark.slow
def test_killed_study_resumes_from_its_database(tiny_run: Path, tmp_path: Path) -> None:
    args = [sys.executable, "-m", "quarl.cli", "study", str(tiny_run), "--precisions", "fp32,fp16,int8,sim6,int4,sim3",
            "--seeds", "0,1", "--episodes", "3", "--n-envs", "2", "--out", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    db = tmp_path / "study.sqlite"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if db.exists() and len(_rows(db)) >= 2:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = _rows(db)
    assert 2 <= len(before) < 12, "the study should have been killed part-way"
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    after = _rows(db)
    assert len(after) == 12 and all(after[k] == v for k, v in before.items())
    assert (tmp_path / "study.png").exists() and (tmp_path / "table.csv").exists()


@pytest.mark.slow  # over 10 s: run with -m slow
def test_study_on_ray_stores_what_the_local_run_stores(tiny_run: Path, tmp_path: Path) -> None:
    kwargs = dict(precisions=("fp32", "int8"), seeds=(0, 1), episodes=2, n_envs=2)
    local = run_study(StudyConfig((tiny_run,), out=tmp_path / "local", **kwargs))
    ray = run_study(StudyConfig((tiny_run,), out=tmp_path / "ray", workers=2, **kwargs))
    key = lambda r: (r["precision"], r["seed"])  # noqa: E731
    assert {key(r): r["returns"] for r in ray} == {key(r): r["returns"] for r in local}
    assert len(StudyStore(tmp_path / "ray" / "study.sqlite").done()) == 4  # the driver stored every task's record


def test_bad_study_input_fails_with_one_line(tiny_run: Path, tmp_path: Path) -> None:
    with pytest.raises(QuarlError, match="unknown precision 'int1x'"):
        StudyConfig((tiny_run,), ("fp32", "int1x"))
    with pytest.raises(QuarlError, match="--workers 0 must be at least 1"):
        StudyConfig((tiny_run,), workers=0)
    with pytest.raises(QuarlError, match="does not exist"):
        find_agents([tmp_path / "nothing"])
    stats = tmp_path / "ppo2" / "Env-v0"
    stats.mkdir(parents=True)
    (stats / "obs_rms.pkl").write_bytes(b"")
    (tmp_path / "ppo2" / "Env-v0.pkl").write_bytes(b"")
    assert find_agents([tmp_path / "ppo2"]) == []  # statistics beside an agent are not agents
    assert find_agents([tmp_path]) == [tmp_path / "ppo2" / "Env-v0.pkl"]
    (tmp_path / "ppo2" / "Env-v0.pkl").unlink()
    with pytest.raises(QuarlError, match="no agents to study"):
        StudyConfig(tuple(find_agents([tmp_path])))


def test_one_eval_record_definition_serves_results_jsonl_and_the_store(tiny_run: Path, tmp_path: Path) -> None:
    import dataclasses
    import json

    from quarl.checkpoints import load_checkpoint
    from quarl.evaluation.cells import EvalSettings
    from quarl.evaluation.record import EvalRecord
    from quarl.ptq.run import run_ptq
    from quarl.study.store import TABLE, StudyStore

    fields = [f.name for f in dataclasses.fields(EvalRecord)]
    ckpt = load_checkpoint(tiny_run)
    run_ptq(ckpt.policy, ckpt.env_spec, ["fp16"], EvalSettings(episodes=2), tmp_path / "ptq")
    stored = [json.loads(line) for line in (tmp_path / "ptq" / "results.jsonl").read_text().splitlines()]
    assert len(stored) == 2 and all(set(fields) <= set(r) for r in stored)
    EvalRecord(**{k: stored[1][k] for k in fields})  # reads back as the record it was
    store = StudyStore(tmp_path / "study.db")
    columns = [row[1] for row in store.db.execute(f"PRAGMA table_info({TABLE})")]
    assert columns[columns.index("env_id"):columns.index("env_id") + len(fields)] == fields


def test_a_study_plays_more_seeds_where_a_verdict_is_undecided(tmp_path: Path) -> None:
    """An untrained PPO Pendulum with large weights (its actions move with rounding) at sim4,
    4 episodes a seed: undecided over one seed; with decide_episodes the undecided pair (and
    fp32) get more seeds until it decides, and a rerun evaluates nothing again."""
    import sqlite3

    from stable_baselines3 import PPO

    from quarl.study.report import study_table, undecided
    from quarl.study.store import TABLE

    run = tmp_path / "ppo" / "Pendulum-v1_1"
    (run / "Pendulum-v1").mkdir(parents=True)
    model = PPO("MlpPolicy", "Pendulum-v1", n_steps=256, seed=0, device="cpu")
    with torch.no_grad():
        for p in [*model.policy.mlp_extractor.policy_net.parameters(), *model.policy.action_net.parameters()]:
            p.mul_(10.0)
    model.save(run / "Pendulum-v1.zip")
    (run / "Pendulum-v1" / "args.yml").write_text("env: Pendulum-v1\n")
    (run / "Pendulum-v1" / "config.yml").write_text("{}\n")
    plain = run_study(StudyConfig((run,), ("fp32", "sim4"), (0,), episodes=4, n_envs=4, out=tmp_path / "a"))
    assert study_table(plain, ["sim4"])[0]["sim4 verdict"].startswith("undecided")
    assert undecided(plain, ["sim4"]) == {(str(run), "sim4")}  # the Decision, not the label read back
    config = StudyConfig((run,), ("fp32", "sim4"), (0,), episodes=4, n_envs=4, out=tmp_path / "b", decide_episodes=32)
    records = run_study(config)
    seeds = {p: sorted(r["seed"] for r in records if r["precision"] == p) for p in ("fp32", "sim4")}
    row = study_table(records, ["sim4"])[0]
    assert len(seeds["sim4"]) > 1 and seeds["fp32"][: len(seeds["sim4"])] == seeds["sim4"] == list(range(len(
        seeds["sim4"])))
    assert not row["sim4 verdict"].startswith("undecided") or len(seeds["sim4"]) * 4 >= 32, (row, seeds)
    count = sqlite3.connect(tmp_path / "b" / "study.sqlite").execute(f"select count(*) from {TABLE}").fetchone()[0]
    again = run_study(config)
    assert sqlite3.connect(tmp_path / "b" / "study.sqlite").execute(
        f"select count(*) from {TABLE}").fetchone()[0] == count
    assert len(again) == len(records)


def test_a_read_only_store_is_refused_before_computing(tiny_run: Path, tmp_path: Path) -> None:
    """A store this run cannot write is refused in one line before a cell is computed."""
    StudyStore(tmp_path / "study.sqlite").close()
    os.chmod(tmp_path / "study.sqlite", 0o444)
    try:
        if os.access(tmp_path / "study.sqlite", os.W_OK):
            pytest.skip("running as a user who writes read-only files (root)")
        with pytest.raises(QuarlError, match="cannot be written as a study store"):
            run_study(StudyConfig((tiny_run,), ("fp32",), (0,), episodes=1, n_envs=1, out=tmp_path))
    finally:
        os.chmod(tmp_path / "study.sqlite", 0o644)


def test_a_store_held_by_another_writer_is_waited_for(tiny_run: Path, tmp_path: Path) -> None:
    import threading

    """A store another writer holds for a moment is waited for and the cell lands; one held
    past the wait is refused in one line before any cell is computed."""
    from quarl.study import store

    db = tmp_path / "study.sqlite"
    StudyStore(db).close()
    holder = sqlite3.connect(db, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # another study writing
    threading.Timer(1.5, holder.rollback).start()
    records = run_study(StudyConfig((tiny_run,), ("fp32",), (0,), episodes=1, n_envs=1, out=tmp_path))
    assert len(records) == 1 and len(_rows(db)) == 1
    holder.execute("BEGIN IMMEDIATE")
    computed: list = []
    original, store.BUSY_TIMEOUT_S = store.BUSY_TIMEOUT_S, 0.5
    try:
        with pytest.raises(QuarlError, match="database is locked"):
            run_study(StudyConfig((tiny_run,), ("fp32",), (1,), episodes=1, n_envs=1, out=tmp_path),
                      lambda r, d, t: computed.append(r))
    finally:
        store.BUSY_TIMEOUT_S = original
        holder.rollback()
        holder.close()
    assert computed == []


def test_log_lines_of_a_many_agent_run_name_their_agent(tiny_run: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A demo's warnings (a mode that agrees on few states, ...) say which agent they are about."""
    import logging

    from quarl.core.logs import AgentFilter, about
    from quarl.demo import run as demo
    from quarl.evaluation.cells import EvalSettings

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Keep()
    handler.addFilter(AgentFilter())
    logger = logging.getLogger("quarl")
    logger.addHandler(handler)
    real = demo.run_ptq

    def noisy(*args, **kwargs):
        logging.getLogger("quarl.quant.modes").warning("int4: no mode agrees")
        return real(*args, **kwargs)

    monkeypatch.setattr(demo, "run_ptq", noisy)
    try:
        demo.run_demo([tiny_run], ["fp16"], EvalSettings(episodes=2, n_envs=2), tmp_path)
        with about("sac Pendulum-v1"):
            logging.getLogger("quarl").warning("plain")
        logging.getLogger("quarl").warning("outside")
    finally:
        logger.removeHandler(handler)
    assert "ppo CartPole-v1: int4: no mode agrees" in lines
    assert "sac Pendulum-v1: plain" in lines and "outside" in lines
