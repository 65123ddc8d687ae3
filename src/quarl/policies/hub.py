"""Agents on the Hugging Face Hub, named ``hf://ORG/REPO`` (``hf://ORG/REPO@REVISION``).

An RL Zoo / SB3 repository (``sb3/ppo-CartPole-v1``) holds ``ALGO-ENV.zip``,
``config.yml``, ``args.yml``, ``env_kwargs.yml`` and maybe ``vec_normalize.pkl``. quarl
fetches only those with the installed Hub client into a cache folder
(``$QUARL_HUB_CACHE``, default ``~/.cache/quarl/hub``, in the Hub's own cache layout),
lays them out as an RL Zoo run folder beside it and hands that folder to the same safe
loader as a local one (:mod:`quarl.policies.zoo`; no pickle is opened unless
``--trust-pickle``). Without a network it uses what the cache holds, and fails in one line
naming the cache when that is nothing. Light to import (``is_hub``, ``parse``): the loader
and torch come with :func:`load`.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from quarl.core.errors import QuarlError

if TYPE_CHECKING:
    from quarl.policies.checkpoint import Checkpoint

PREFIX = "hf://"
_FILES = ["*.zip", "config.yml", "args.yml", "env_kwargs.yml", "vec_normalize.pkl"]
_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_hub(path: object) -> bool:
    """``hf://...``, also as a ``Path`` made of it (which folds ``//`` to ``/``)."""
    return str(path).startswith("hf:/")


def cache_dir() -> Path:
    return Path(os.environ.get("QUARL_HUB_CACHE", Path.home() / ".cache" / "quarl" / "hub"))


def parse(name: str) -> tuple[str, str | None]:
    """(repo id, revision) from ``hf://ORG/REPO[@REVISION]``."""
    repo, _, revision = str(name)[3:].lstrip("/").partition("@")
    if not _REPO.fullmatch(repo) or ".." in repo:
        raise QuarlError(f"{name!r} is not hf://ORG/REPO (e.g. hf://sb3/ppo-CartPole-v1)")
    return repo, revision or None


def fetch(name: str) -> Path:
    """The RL Zoo run folder for ``hf://ORG/REPO``, fetched (or found in the cache)."""
    from huggingface_hub import snapshot_download

    repo, revision = parse(name)
    name = f"{PREFIX}{repo}" + (f"@{revision}" if revision else "")
    cache = cache_dir()
    try:
        snapshot = Path(snapshot_download(repo, revision=revision, cache_dir=cache, allow_patterns=_FILES))
    except Exception as online:  # offline, unknown repo, rate limit: fall back to the cache
        try:
            snapshot = Path(snapshot_download(repo, revision=revision, cache_dir=cache, allow_patterns=_FILES,
                                              local_files_only=True))
        except Exception:
            reason = str(online).strip().splitlines()[0] if str(online).strip() else type(online).__name__
            raise QuarlError(f"{name}: not in the cache {cache} and the Hub cannot be reached ({reason[:160]})") \
                from None
    return _zoo_folder(name, snapshot, cache)


def _zoo_folder(name: str, snapshot: Path, cache: Path) -> Path:
    zips = sorted(snapshot.glob("*.zip"))
    zips = [z for z in zips if z.name != "train_eval_metrics.zip"]
    if len(zips) != 1 or "-" not in zips[0].stem:
        raise QuarlError(f"{name} does not hold one ALGO-ENV.zip model (found {[z.name for z in zips]})")
    algo, env = zips[0].stem.split("-", 1)
    run = cache / "zoo" / snapshot.parent.parent.name / snapshot.name / algo.lower() / f"{env}_1"
    config = run / env
    config.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(zips[0], run / f"{env}.zip")
    for src, dst in (("config.yml", "config.yml"), ("args.yml", "args.yml"), ("env_kwargs.yml", "env_kwargs.yml"),
                     ("vec_normalize.pkl", "vecnormalize.pkl")):
        if (snapshot / src).exists():
            shutil.copyfile(snapshot / src, config / dst)
    if not (config / "config.yml").exists():
        shutil.rmtree(config)  # a bare model: the caller passes --env
    return run


def detect(path: Path) -> bool:
    return is_hub(path)


def load(path: Path, trust_pickle: bool = False) -> Checkpoint:
    """The agent of ``hf://ORG/REPO``: fetched, then loaded as the zoo folder it is."""
    from quarl.policies.zoo import load_zoo

    return load_zoo(fetch(str(path)), trust_pickle)
