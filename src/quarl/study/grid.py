"""A study: a grid of (agent, precision, evaluation seed) cells, each evaluated once and
stored in SQLite (``OUT/study.sqlite``); a rerun evaluates only the missing cells.

Cells run one after the other in this process, or on Ray with ``workers > 1`` or an
``address`` (:mod:`quarl.study.ray_runner`); both call the same :func:`evaluate_cell`,
and evaluation is deterministic, so both store the same numbers.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from quarl.core.errors import QuarlError
from quarl.envs import gym_packages, import_gym_packages
from quarl.evaluation.cells import EvalSettings, config_identity, evaluate_config
from quarl.evaluation.episodes import acting, protocol
from quarl.quantization.config import QuantConfig
from quarl.study.store import StudyKey, StudyRecord, StudyStore
from quarl.verdict import Judging

log = logging.getLogger(__name__)

STATISTICS_FILES = ("obs_rms.pkl", "ret_rms.pkl", "vecnormalize.pkl")
"""Pickles beside the agents that are normalization statistics, not agents."""

SEED_STRIDE = 100_000
"""Evaluation seed s runs episode i on env seed ``s * SEED_STRIDE + i``: seeds never
share episodes."""


@dataclass(frozen=True)
class Column:
    """A column of a study: a precision's config, or (``recovered``) the agent ``quarl recover``
    recovered at that precision (``rec-int4``: its real kernel, against the original fp32)."""

    config: QuantConfig
    recovered: bool = False

    @classmethod
    def parse(cls, label: str, base: QuantConfig | None = None) -> Column:
        """A --precisions label, parsed once onto ``base`` (the study's int options);
        ``rec-int4`` / ``rec-int8`` is recovered (its precision checked as recover's is)."""
        from quarl.recovery import recovered_precision

        precision = recovered_precision(label)
        return cls(QuantConfig.parse(precision or label, base), precision is not None)

    @property
    def label(self) -> str:
        """The column's name, as its cells are stored: ``int8``, ``sim6``, ``rec-int4``..."""
        from quarl.recovery import RECOVERED_PREFIX

        return RECOVERED_PREFIX + self.config.label if self.recovered else self.config.label


def as_column(precision: Column | QuantConfig | str) -> Column:
    """A column as given, a config's plain column, or a label a Python caller wrote, parsed
    once with the default options (:meth:`Column.parse`)."""
    if isinstance(precision, Column):
        return precision
    if isinstance(precision, str):
        return Column.parse(precision)
    return Column(precision)


@dataclass(frozen=True)
class StudyConfig:
    checkpoints: tuple[Path, ...]
    """Agents: SB3 zips, RL Zoo run folders or legacy stable-baselines pickles."""
    precisions: tuple[Column | QuantConfig | str, ...] = ("fp32", "fp16", "int8")
    """The columns: as ``quarl study`` gives them (:class:`Column` s, each label parsed once
    onto its int options), or configs or labels (parsed once, here, with the default options);
    held as :class:`Column` s. fp32 is always added first (at the columns' options): E is
    measured against it."""
    seeds: tuple[int, ...] = (0,)
    episodes: int = 20
    n_envs: int = 32
    max_steps: int | None = None
    trust_pickle: bool = False
    """Allow arbitrary unpickling of the agents' vecnormalize.pkl."""
    workers: int = 1
    """Cells evaluated at once; more than 1 runs them on a local Ray."""
    address: str | None = None
    """Ray cluster to run the cells on (spread over its nodes)."""
    out: Path = Path("results/study")
    decide_episodes: int = 0
    """Where a verdict is undecided, play more seeds for it (and fp32) until it decides or
    its cells hold this many episodes (0: off)."""
    stochastic: bool | None = None
    """Sample actions (True), act greedily (False) or the RL Zoo's default per env (None:
    stochastic on Atari and MinAtar); see :func:`quarl.evaluation.episodes.acting`."""
    sticky_actions: float | None = None
    """Atari / MinAtar agents repeat their previous action with this probability; the other
    agents play as they are."""
    decide_seconds: float | None = None
    """No new round of deciding seeds starts this many seconds after the first (None: no limit)."""
    judging: Judging = Judging()
    """The range the verdicts assume (``--insure``, ``--return-range``)."""

    def __post_init__(self) -> None:
        if not self.checkpoints:
            raise QuarlError("no agents to study: give checkpoints or a folder of agents")
        # one clear line for an unknown precision; kept as columns (dataclasses.replace passes them on as they are)
        object.__setattr__(self, "precisions", tuple(as_column(p) for p in self.precisions))
        if self.episodes < 1:
            raise QuarlError(f"--episodes {self.episodes} must be at least 1")
        if self.workers < 1:
            raise QuarlError(f"--workers {self.workers} must be at least 1")
        if not self.seeds or min(self.seeds) < 0:
            raise QuarlError(f"--seeds {','.join(map(str, self.seeds))} must be non-negative integers")

    @property
    def db_path(self) -> Path:
        return Path(self.out) / "study.sqlite"

    @property
    def columns(self) -> list[Column]:
        """fp32 (at the columns' options) and every column, once each, in order."""
        given = [c for c in self.precisions if isinstance(c, Column)]  # all of them, since __post_init__
        fp32 = Column(given[0].config.at_fp32() if given else QuantConfig())
        return list({c.label: c for c in [fp32, *given]}.values())


@dataclass(frozen=True)
class StudyCell(StudyKey):
    """A cell the study plans: its key (:class:`~quarl.study.store.StudyKey`, the row it will
    be stored as) and how to evaluate it."""

    n_envs: int
    quant: QuantConfig
    """The config its cells run (a recovered column's: the precision it was recovered at)."""
    trust_pickle: bool = False
    recover_out: str = ""
    """``rec-int4`` / ``rec-int8`` cells: the folder the recovered agent is written to (and reused from)."""
    stochastic: bool = False
    """The policy samples its actions (resolved per agent: part of ``policy_sha256``)."""
    sticky_actions: float | None = None
    """Applied to this agent's env (part of ``config_key``)."""
    gym_packages: tuple[str, ...] = ()
    """Modules that register custom envs (``--gym-packages``), imported where the cell runs (a Ray worker too)."""


def config_key(config: QuantConfig, recovered: bool = False, sticky_actions: float | None = None) -> str:
    """Hash of :func:`quarl.evaluation.cells.config_identity` (the config as this CPU runs it, the
    result format, and for real int cells the runtime and CPU), the key ptq's cells are
    built on too; a recovered column adds the recovery's format and options, sticky actions
    their probability (absent ones add nothing, so older stores keep their keys)."""
    identity = config_identity(config)
    parts: list[Any] = [identity.format, identity.config, identity.runtime or {}]
    if recovered:
        from quarl.recovery import RECOVERY_FORMAT, RecoverConfig

        parts.append([RECOVERY_FORMAT, dataclasses.asdict(RecoverConfig(precision=config.label))])
    if sticky_actions is not None:
        parts.append({"sticky_actions": sticky_actions})
    text = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cells(config: StudyConfig) -> list[StudyCell]:
    """Every cell of the grid, keyed on each checkpoint's content (loaded here once)."""
    columns = config.columns
    out = []
    for checkpoint in config.checkpoints:
        path = str(Path(checkpoint).resolve())
        ckpt, own_spec = _load(path, config.trust_pickle)
        spec, policy = protocol(ckpt.policy, own_spec, config.stochastic, config.sticky_actions, where_supported=True)
        sticky = config.sticky_actions if spec is not own_spec else None  # only agents whose env has sticky actions
        sha = policy.fingerprint()
        for seed in config.seeds:
            for column in columns:
                quant = column.config
                folder = str(Path(config.out).resolve() / "recovered" / f"{sha[:12]}-{quant.label}") \
                    if column.recovered else ""
                out.append(StudyCell(path, sha, column.label, config_key(quant, column.recovered, sticky), seed,
                                     config.episodes, config.max_steps or 0, config.n_envs, quant,
                                     config.trust_pickle, folder, policy.stochastic, sticky, gym_packages()))
    return out


def _load(checkpoint: str, trust_pickle: bool = False) -> tuple[Any, Any]:
    """The checkpoint and its env, cached while its files stay as they are (a checkpoint
    replaced in place is read again)."""
    path = Path(checkpoint)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    return _load_cached(checkpoint, trust_pickle, stamp)


@functools.lru_cache(maxsize=16)
def _load_cached(checkpoint: str, trust_pickle: bool, _stamp: tuple[tuple[str, int, int], ...]) -> tuple[Any, Any]:
    from quarl.checkpoints import load_checkpoint
    from quarl.policies.checkpoint import resolve_env_spec

    ckpt = load_checkpoint(Path(checkpoint), trust_pickle=trust_pickle)
    return ckpt, resolve_env_spec(ckpt, None)


def evaluate_cell(cell: StudyCell) -> StudyRecord:
    """Load, quantize and evaluate one cell: the record the store keeps (its log lines
    name the agent and precision)."""
    from quarl.core.logs import about

    ckpt, spec = _load(cell.checkpoint, cell.trust_pickle)
    with about(f"{ckpt.algo} {spec.env_id} {cell.precision}"):
        return _evaluate_cell(cell)


def _evaluate_cell(cell: StudyCell) -> StudyRecord:
    import torch

    torch.set_num_threads(1)
    started = time.perf_counter()
    if cell.gym_packages:
        import_gym_packages(cell.gym_packages)
    ckpt, spec = _load(cell.checkpoint, cell.trust_pickle)
    spec, policy = protocol(ckpt.policy, spec, cell.stochastic, cell.sticky_actions)
    config = cell.quant
    settings = EvalSettings(episodes=cell.episodes, seed=cell.seed * SEED_STRIDE, n_envs=cell.n_envs,
                            max_steps=cell.max_steps or None)
    quantized = None
    if cell.recover_out:  # a recovered column: recovered once per agent (the first cell), its real kernel evaluated
        from quarl.core.atomic import check_folder
        from quarl.recovery import recovered_kernel

        folder = Path(cell.recover_out)  # OUT/recovered/AGENT: folders of the study's own, never a link to another
        check_folder(folder.parent.parent, folder.parent.name, folder.name)
        kernel = recovered_kernel(ckpt.path, ckpt.policy, spec, config.label, Path(cell.recover_out),
                                  cell.trust_pickle, int8_weights=config.int8_weights, block_size=config.block_size)
        quantized = acting(kernel, spec, cell.stochastic)
    result = evaluate_config(policy, spec, config, settings, quantized=quantized)
    return StudyRecord(
        checkpoint=cell.checkpoint,
        policy_sha256=policy.fingerprint(),  # what was evaluated, should the file have changed since
        precision=cell.precision,
        config_key=cell.config_key,
        seed=cell.seed,
        episodes=cell.episodes,
        max_steps=cell.max_steps,
        policy=f"{ckpt.algo} {spec.env_id}",
        algo=ckpt.algo,
        result=result,
        wall_s=time.perf_counter() - started,
        host=platform.node(),
        provenance=None,  # as studies have stored it so far (ptq's records carry it)
        finished_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


OnCell = Callable[[StudyRecord, int, int], None]
"""Called with (record, cells done, cells wanted) as each cell is stored."""


def run_study(config: StudyConfig, on_cell: OnCell | None = None) -> list[StudyRecord]:
    """Evaluate the missing cells, storing each as it finishes; return every record of
    the study's cells. ``on_cell(record, done, total)`` reports progress. With
    ``config.decide_episodes``, undecided verdicts get more seeds (:func:`_decide`)."""
    store = StudyStore(config.db_path)
    try:
        wanted = cells(config)
        records = _run_cells(store, wanted, config, on_cell)
        if config.decide_episodes > config.episodes * len(config.seeds):
            records = _decide(store, wanted, records, config, on_cell)
        return records
    finally:
        store.close()


def _run_cells(store: StudyStore, wanted: list[StudyCell], config: StudyConfig,
               on_cell: OnCell | None) -> list[StudyRecord]:
    """Evaluate the cells of ``wanted`` the store lacks; the records of all of them."""
    stored = store.done()
    todo = [c for c in wanted if c.key() not in stored]
    done = len(wanted) - len(todo)
    if done:
        log.info("%d of %d cells already in %s", done, len(wanted), config.db_path)

    def finished(record: StudyRecord) -> None:
        nonlocal done
        store.insert(record)
        done += 1
        if on_cell:
            on_cell(record, done, len(wanted))

    if todo and (config.workers > 1 or config.address):
        from quarl.study.ray_runner import run_on_ray

        run_on_ray(todo, evaluate_cell, config.workers, config.address, finished)
    else:
        for cell in todo:
            finished(evaluate_cell(cell))
    keys = {c.key() for c in wanted}
    return [r for r in store.records() if r.key() in keys]


def _decide(store: StudyStore, wanted: list[StudyCell], records: list[StudyRecord], config: StudyConfig,
            on_cell: OnCell | None) -> list[StudyRecord]:
    """Verdicts that decide: while an (agent, precision) verdict is undecided and its cells
    hold fewer than ``config.decide_episodes`` episodes, it and its agent's fp32 play one seed
    more (the next seed number, ``config.episodes`` episodes; stored cells, reused by a
    rerun), and the verdicts are looked at again. Decided ones stop;
    a verdict pairs a precision's episodes with fp32's first ones, seed by seed."""
    from quarl.study.report import undecided as undecided_verdicts

    precisions = list(dict.fromkeys(c.precision for c in wanted))
    seeds = list(config.seeds)
    deadline = None if config.decide_seconds is None else time.monotonic() + config.decide_seconds
    while len(seeds) * config.episodes < config.decide_episodes:
        counts: dict[tuple[str, str], int] = {}
        for r in records:
            counts[(r.checkpoint, r.precision)] = counts.get((r.checkpoint, r.precision), 0) + 1
        undecided = {key for key in undecided_verdicts(records, precisions, config.judging)
                     if counts.get(key) == len(seeds)}
        if not undecided:
            break
        if deadline is not None and time.monotonic() > deadline:
            log.warning("%d verdicts undecided after %d seeds: the time budget is spent", len(undecided), len(seeds))
            break
        more = min(1, (config.decide_episodes - len(seeds) * config.episodes) // config.episodes)
        if more < 1:
            break
        new_seeds = tuple(range(max(seeds) + 1, max(seeds) + 1 + more))
        agents = {checkpoint for checkpoint, _ in undecided}
        extra = [c for c in cells(dataclasses.replace(config, seeds=new_seeds))
                 if (c.checkpoint, c.precision) in undecided or (c.precision == "fp32" and c.checkpoint in agents)]
        log.info("%d undecided verdicts after %d seeds: seeds %d..%d for them", len(undecided), len(seeds),
                 new_seeds[0], new_seeds[-1])
        wanted = wanted + extra
        seeds += new_seeds
        records = _run_cells(store, wanted, config, on_cell)
    return records


def find_agents(paths: Sequence[Path]) -> list[Path]:
    """Checkpoints named directly, or found in folders of agents: RL Zoo run folders
    (ALGO/ENV_1) and legacy pickles (ALGO/ENV.pkl); ``hf://ORG/REPO`` is fetched (or
    found in the Hub cache) and taken as the run folder it becomes."""
    from quarl.policies import hub

    found: list[Path] = []
    for path in paths:
        if hub.is_hub(path):
            found.append(hub.fetch(str(path)))
            continue
        path = Path(path)
        if not path.exists():
            raise QuarlError(f"{str(path)!r} does not exist")
        if path.is_file() or list(path.glob("*.zip")):
            found.append(path)
            continue
        pickles = [p for p in path.glob("*/*.pkl") if p.name not in STATISTICS_FILES]
        found += sorted([p for p in path.glob("*/*_*") if p.is_dir()] + pickles)
    return list(dict.fromkeys(found))
