"""Pools of real paired per-episode returns, for measuring verdicts by resampling.

For each agent, fp32 and one or more quantized precisions play the same evaluation seeds
(episode i resets with seed ``first + i`` at every precision, as ``quarl ptq`` plays them:
quarl's own load / protocol / quantize / evaluate, calibration on its reserved seeds only).
Each agent's pool is one small JSON file, ``OUT/NAME.json``: the agent (path, algo, content
hash, and how it was trained where it was trained here), the env, the settings and command,
the seeds, and per precision the returns (4 decimals) and episode ending digests (equal
digests mark replays of one game). tests/data/return_pools/README.md describes the pools.

The file is written after every chunk of episodes, and a run resumes from it: series whose
key (policy hash, env, seeds, quarl's config identity and result format, chosen int mode)
still matches keep their episodes and only the missing ones are played (episode i's return
does not depend on how the episodes are chunked).

    .venv/bin/python benchmarks/make_return_pools.py [--out tests/data/return_pools] [--only NAME,...]
    .venv/bin/python benchmarks/make_return_pools.py --quick     # tiny pools in a temp folder (CI smoke run)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

log = logging.getLogger("return_pools")

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT.parent / "shared" / "zoo"
DEFAULT_OUT = ROOT / "tests" / "data" / "return_pools"
FORMAT = 1
"""This file's own format (bump when a pool file's fields change meaning)."""


@dataclass(frozen=True)
class Trained:
    """An agent trained here by ``quarl train`` (the RL Zoo's hyperparameters)."""

    algo: str
    env_id: str
    timesteps: int
    seed: int = 0

    def run_dir(self, runs: Path) -> Path:
        return runs / self.algo / f"{self.env_id.replace('/', '_')}_1"

    def command(self, runs: Path) -> str:
        """The ``quarl train`` command that makes the same run folder (in a fresh ``runs``)."""
        return (f".venv/bin/quarl train {self.algo} {self.env_id} --seed {self.seed} -n {self.timesteps} "
                f"--eval-freq 0 --out {_shown(runs)}")


@dataclass(frozen=True)
class Pool:
    name: str
    """The pool file's stem."""
    precisions: tuple[str, ...]
    agent: Path | None = None
    """A checkpoint (RL Zoo folder) or None for ``trained``'s run folder."""
    env: str | None = None
    """Play this env id instead of the agent's own (``--env``)."""
    trained: Trained | None = None
    episodes: int = 1000
    note: str = ""
    """What the pool is for (README)."""


POOLS: tuple[Pool, ...] = (
    Pool("ppo-HalfCheetah-v4", ("sim4", "sim3", "int8", "fp16"), ZOO / "ppo" / "HalfCheetah-v3_1", env="HalfCheetah-v4",
         note="heavy tails: a few quantized episodes fall to 0..2000 from ~5800"),
    Pool("dqn-CartPole-v1", ("int8", "sim8", "sim7", "sim6", "sim4"), ZOO / "dqn" / "CartPole-v1_1",
         note="int8 / sim8 tie fp32 on every episode; low bits lose"),
    Pool("sac-Pendulum-v1", ("int8", "sim6", "sim4", "sim5"), ZOO / "sac" / "Pendulum-v1_1",
         note="negative returns; sim4 near the line, sim5 loses badly"),
    Pool("ppo-LunarLander-v3", ("fp16", "int8", "int4", "sim4"), ZOO / "ppo" / "LunarLander-v2_1",
         note="part ties (fp16), LunarLander's own crashes in both"),
    Pool("a2c-CartPole-v1", ("int8", "sim2"), ZOO / "a2c" / "CartPole-v1_1",
         note="every precision ties fp32 on every episode, even 2 bits"),
    Pool("ppo-MountainCarContinuous-v0", ("int8", "sim4", "sim2"), ZOO / "ppo" / "MountainCarContinuous-v0_1",
         note="small, steady losses; no ties"),
    Pool("dqn-Acrobot-v1", ("int8", "int4", "sim7", "sim6", "sim4"), trained=Trained("dqn", "Acrobot-v1", 50_000),
         note="trained here (RL Zoo hyperparameters, half their budget); sim7 / sim6 near the line, sim4 never "
              "swings up"),
)


def _shown(path: Path) -> str:
    """``path`` as a command run in the repository root names it."""
    resolved = path.resolve()
    return os.path.relpath(resolved, ROOT) if resolved.is_relative_to(ROOT.parent) else str(resolved)


def _quarl_source() -> dict[str, Any]:
    """Which quarl made the numbers: its version and commit. This checkout's src/ when quarl
    is imported from it (its commit and uncommitted changes under src/), else a snapshot
    (``git archive COMMIT src``, run with ``PYTHONPATH=SNAPSHOT/src``) whose commit
    ``$QUARL_SOURCE_COMMIT`` names."""
    import quarl

    out: dict[str, Any] = {"version": quarl.__version__}
    package = Path(quarl.__file__).resolve().parent
    if package != ROOT / "src" / "quarl":
        out.update(commit=os.environ.get("QUARL_SOURCE_COMMIT", "unknown"), imported_from=str(package))
        return out
    try:
        out["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                       check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=ROOT, capture_output=True,
                                 text=True, check=True).stdout.split("\n")
        out["src_changes"] = [line.strip() for line in changed if line.strip()]
    except (OSError, subprocess.CalledProcessError):
        out["commit"] = "unknown"
    return out


def _train(pool: Pool, runs: Path, timesteps: int | None) -> Path:
    """``pool.trained``'s run folder, trained once (``quarl train``'s own config and workflow)."""
    from quarl.training.plan import train_config
    from quarl.training.sb3_train import train

    recipe = _recipe(pool, timesteps)
    run_dir = recipe.run_dir(runs)
    model = run_dir / f"{recipe.env_id.replace('/', '_')}.zip"
    if model.exists():
        log.info("%s: reusing the trained agent %s", pool.name, _shown(run_dir))
        return run_dir
    log.info("%s: training (%s)", pool.name, recipe.command(runs))
    started = time.perf_counter()
    config = train_config(recipe.algo, recipe.env_id, recipe.timesteps, recipe.seed, runs, "fp32", None, None, [],
                          eval_freq=0, eval_episodes=5, checkpoint_freq=0)
    train(dataclasses.replace(config, run_dir=run_dir, progress_bar=False))
    log.info("%s: trained in %.0f s", pool.name, time.perf_counter() - started)
    return run_dir


def _recipe(pool: Pool, timesteps: int | None) -> Trained:
    if pool.trained is None:
        raise ValueError(f"{pool.name} is not trained here")
    return pool.trained if timesteps is None else dataclasses.replace(pool.trained, timesteps=timesteps)


def _load(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        log.warning("%s unreadable (%s): made anew", path, exc)
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def _dumps(data: dict[str, Any]) -> str:
    """JSON with one field a line and every list on one line (small, and diffs by series)."""
    def dump(value: Any, indent: int) -> str:
        if isinstance(value, dict) and value and not all(isinstance(v, (str, int, float, bool, type(None)))
                                                         for v in value.values()):
            pad = " " * (indent + 1)
            items = [f"{pad}{json.dumps(k)}: {dump(v, indent + 1)}" for k, v in value.items()]
            return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
        return json.dumps(value, separators=(", ", ": "))
    return dump(data, 0) + "\n"


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(_dumps(data))
    os.replace(tmp, path)


def summary(fp32: np.ndarray, q: np.ndarray) -> dict[str, Any]:
    """E% (100 (mean fp32 - mean q) / |mean fp32|), the failures (episodes worse than fp32's
    median by more than half its size: below half the median for positive returns), ties."""
    n = min(len(fp32), len(q))
    fp32, q = fp32[:n], q[:n]
    median = float(np.median(fp32))
    floor = median - abs(median) / 2
    return {"episodes": n, "mean_fp32": round(float(fp32.mean()), 4), "mean": round(float(q.mean()), 4),
            "E_percent": round(100 * float(fp32.mean() - q.mean()) / abs(float(fp32.mean())), 4),
            "failures": int(np.sum(q < floor)), "fp32_failures": int(np.sum(fp32 < floor)),
            "ties": int(np.sum(q == fp32))}


def make_pool(pool: Pool, out: Path, runs: Path, episodes: int, chunk: int, command: str,
              train_steps: int | None = None) -> Path:
    """Play ``pool``'s fp32 and precisions on seeds 0..episodes-1 into ``OUT/NAME.json``,
    a chunk at a time, resuming from what the file holds."""
    import quarl
    from quarl.core.provenance import provenance
    from quarl.evaluation.cells import EvalSettings, config_identity
    from quarl.evaluation.episodes import protocol
    from quarl.evaluation.record import RESULT_FORMAT
    from quarl.quantization.config import QuantConfig

    first_seed = 0
    EvalSettings(episodes=episodes, seed=first_seed)  # quarl's check: the seeds stay off the reserved ones
    checkpoint = _train(pool, runs, train_steps) if pool.trained is not None else pool.agent
    if checkpoint is None:
        raise ValueError(f"{pool.name} names neither an agent nor a training recipe")
    agent = quarl.load(checkpoint, env=pool.env)
    spec, policy = protocol(agent.policy, agent.env_spec)  # as ptq plays it (greedy here)
    path = out / f"{pool.name}.json"
    stored = _load(path) or {}
    base_key = {"policy_sha256": policy.fingerprint(), "env": json.loads(json.dumps(dataclasses.asdict(spec))),
                "first_seed": first_seed, "acting": "sampled" if policy.stochastic else "greedy",
                "result_format": RESULT_FORMAT}
    if stored.get("key") != base_key:
        if stored:
            log.warning("%s: %s was made from another policy / env / seeds: made anew", pool.name, path)
        stored = {}
    trained = None
    if pool.trained is not None:
        recipe = _recipe(pool, train_steps)
        trained = {"command": recipe.command(runs), **dataclasses.asdict(recipe),
                   "hyperparameters": "the RL Zoo's for this algo and env (quarl train's default)"}
    data: dict[str, Any] = {
        "format": FORMAT,
        "pool": pool.name,
        "note": pool.note,
        "agent": {"path": _shown(checkpoint), "algo": agent.algo, "policy_sha256": base_key["policy_sha256"],
                  **({"trained": trained} if trained else {})},
        "env_id": spec.env_id,
        "env": base_key["env"],
        "command": command,
        "settings": {"acting": base_key["acting"], "n_envs": 32, "max_steps": None, "chunk": chunk,
                     "api": "quarl.load, quarl.evaluation.episodes.protocol, quarl.quantize, quarl.evaluate"},
        "seeds": {"first": first_seed, "count": episodes,
                  "rule": "episode i resets with seed first + i at every precision (quarl's evaluation seeds; "
                          "calibration uses its reserved seeds 10000..10199 only)"},
        "quarl": _quarl_source(),
        "provenance": {k: v for k, v in provenance().items() if k != "host"},
        "key": base_key,
        "series": {},
        "summary": {},
    }
    old_series: dict[str, Any] = stored.get("series", {})
    labels = ["fp32", *pool.precisions]
    for label in labels:
        started = time.perf_counter()
        config = QuantConfig.parse(label)
        identity = json.loads(json.dumps(dataclasses.asdict(config_identity(config))))
        acting = policy if label == "fp32" else quarl.quantize(policy, config, spec)
        quant = acting.meta.get("quant") or None
        mode = quant.get("mode") if isinstance(quant, dict) else None
        key = {"config": identity, "mode": mode}
        old = old_series.get(label)
        series = old if old is not None and old.get("key") == key else None
        if old is not None and series is None:
            log.warning("%s %s: stored with another config or int mode (%s): played anew", pool.name, label,
                        old.get("key", {}).get("mode"))
        if series is None:
            series = {"key": key, "returns": [], "endings": []}
        series["returns"] = series["returns"][:episodes]
        series["endings"] = series["endings"][:episodes]
        data["series"][label] = series
        done = len(series["returns"])
        if done == episodes:
            log.info("%s %s: %d episodes stored, nothing to play", pool.name, label, done)
        while done < episodes:
            n = min(chunk, episodes - done)
            result = quarl.evaluate(acting, spec, episodes=n, seed=first_seed + done)
            series["returns"] += [round(float(r), 4) for r in result.returns]
            series["endings"] += list(result.endings or [""] * n)
            done += n
            _finish(data, labels)
            _write(path, data)
            log.info("%s %s: %d/%d episodes, mean %.2f (%.0f s)", pool.name, label, done, episodes,
                     float(np.mean(series["returns"])), time.perf_counter() - started)
    _finish(data, labels)
    _write(path, data)
    return path


def _finish(data: dict[str, Any], labels: list[str]) -> None:
    """The summary of every quantized series against fp32 (over their common episodes)."""
    series = data["series"]
    if "fp32" not in series or not series["fp32"]["returns"]:
        return
    fp32 = np.asarray(series["fp32"]["returns"], np.float64)
    data["summary"] = {label: summary(fp32, np.asarray(series[label]["returns"], np.float64))
                       for label in labels[1:] if label in series and series[label]["returns"]}


def table(out: Path) -> str:
    """A Markdown table of every pool file in ``out`` (the README's)."""
    lines = ["| pool | precision | episodes | mean fp32 | mean | E % | failures | fp32 failures | ties |",
             "|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(out.glob("*.json")):
        data = _load(path)
        for label, s in (data or {}).get("summary", {}).items():
            n = s["episodes"]
            lines.append(f"| {path.stem} | {label} | {n} | {s['mean_fp32']:.2f} | {s['mean']:.2f} | "
                         f"{s['E_percent']:.2f} | {s['failures'] / n:.3f} ({s['failures']}) | "
                         f"{s['fp32_failures'] / n:.3f} | {s['ties'] / n:.3f} ({s['ties']}) |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "return-pools",
                        help="where agents trained here go (git-ignored)")
    parser.add_argument("--only", default="", help="comma list of pool names: " + ", ".join(p.name for p in POOLS))
    parser.add_argument("--episodes", type=int, default=0, help="paired episodes per pool (default: each pool's)")
    parser.add_argument("--chunk", type=int, default=100, help="episodes played between writes")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: two tiny pools (the trained agent at 2,000 steps; fp32 and one simulated "
                             "width, 4 episodes) in a temp folder, run twice (the second resumes and plays nothing)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    for name in ("quarl", "py.warnings"):
        logging.getLogger(name).setLevel(logging.ERROR)
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in {p.name for p in POOLS}]
    if unknown:
        print(f"unknown pool {', '.join(unknown)}: allowed {', '.join(p.name for p in POOLS)}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    if args.quick:
        with tempfile.TemporaryDirectory(prefix="return-pools-") as tmp:
            pools = [p for p in POOLS if p.trained is not None]
            pools += [p for p in POOLS if p.name == "dqn-CartPole-v1" and p.agent is not None and p.agent.exists()]
            for attempt in (1, 2):
                for pool in pools:
                    quick = next(p for p in pool.precisions if p.startswith("sim"))  # no calibration: seconds
                    path = make_pool(dataclasses.replace(pool, precisions=(quick,)), Path(tmp),
                                     Path(tmp) / "runs", episodes=4, chunk=2, command="--quick", train_steps=2_000)
                    data = json.loads(path.read_text())
                    if not all(len(s["returns"]) == len(s["endings"]) == 4 for s in data["series"].values()):
                        raise SystemExit(f"{path}: a series without its 4 episodes")
                    log.info("quick run %d: %s %s", attempt, path.name, data["summary"])
        log.info("quick: done in %.0f s", time.perf_counter() - started)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for pool in POOLS:
        if names and pool.name not in names:
            continue
        pool_started = time.perf_counter()
        episodes = args.episodes or pool.episodes
        command = " ".join([".venv/bin/python benchmarks/make_return_pools.py --only", pool.name,
                            *([f"--episodes {episodes}"] if episodes != pool.episodes else []),
                            *([f"--out {shlex.quote(_shown(args.out))}"] if args.out != DEFAULT_OUT else [])])
        make_pool(pool, args.out, args.runs, episodes, args.chunk, command)
        log.info("%s: done in %.0f s", pool.name, time.perf_counter() - pool_started)
    log.info("all pools done in %.0f s", time.perf_counter() - started)
    print(table(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
