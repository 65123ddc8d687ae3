"""The algorithms ``quarl train`` runs and the RL Zoo's tuned hyperparameters for them, read
from the files the ``rl_zoo3`` package ships (``rl_zoo3/hyperparams/ALGO.yml``), or quarl's
own entries for env families the zoo has none for. :mod:`quarl.training.train_setup` turns
an entry into Stable-Baselines3 constructor kwargs; :mod:`quarl.training.hp_checks` checks
``--hp`` overrides.

rl_zoo3 itself ``eval``s strings such as ``policy_kwargs: "dict(net_arch=[256, 256])"``
and patches gymnasium on import; quarl reads the files without importing the package and
parses those strings as literals (:mod:`quarl.training.train_setup`), mapping the few class
names that appear in them through an allow-list.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ConfigDict, Field

from quarl.core.errors import QuarlError
from quarl.core.file_schema import Record, parse_record
from quarl.core.limits import read_capped
from quarl.core.registry import Registry
from quarl.envs import env_family, is_atari

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm


@dataclass(frozen=True)
class Trainer:
    """An algorithm ``quarl train`` runs: its Stable-Baselines3 / sb3-contrib class and the
    action spaces it takes. Its hyperparameters come from rl_zoo3's ``<name>.yml``; the
    loader reads what it saves through :data:`quarl.policies.sb3.LAYOUTS`; QAT wraps its
    acting network (:func:`quarl.training.qat_sb3.qat_targets`). A new one is one entry."""

    name: str
    module: str
    cls: str
    actions: str = "both"
    """``discrete``, ``continuous`` or ``both``."""
    qat_refused: str = ""
    """Why quantization-aware training cannot run this algorithm (empty: it can)."""

    def algo_class(self) -> type[BaseAlgorithm]:
        from stable_baselines3.common.base_class import BaseAlgorithm

        cls = getattr(importlib.import_module(self.module), self.cls, None)
        if not (isinstance(cls, type) and issubclass(cls, BaseAlgorithm)):
            raise QuarlError(f"trainer {self.name!r}: {self.module}.{self.cls} is not a Stable-Baselines3 algorithm "
                             "class")
        return cls


def trainer(algo: str) -> Trainer:
    """The registered trainer named ``algo``, else one line naming the algorithms allowed."""
    return TRAINERS.lookup(algo)


TRAINERS: Registry[Trainer] = Registry("algorithm")
"""The algorithms ``quarl train`` runs, in registration order (``--algo``'s help lists them so)."""


def register_trainer(trainer: Trainer) -> Trainer:
    """Add an algorithm ``quarl train`` runs (its hyperparameters come from rl_zoo3's
    ``<name>.yml`` or ``--hp``); a name already taken is refused."""
    if trainer.actions not in ("discrete", "continuous", "both"):
        raise QuarlError(f"trainer {trainer.name!r}: actions {trainer.actions!r} is not discrete, continuous or both")
    return TRAINERS.register(trainer.name, trainer)


for _trainer in (
    Trainer("a2c", "stable_baselines3", "A2C"),
    Trainer("ppo", "stable_baselines3", "PPO"),
    Trainer("dqn", "stable_baselines3", "DQN", "discrete"),
    Trainer("ddpg", "stable_baselines3", "DDPG", "continuous"),
    Trainer("td3", "stable_baselines3", "TD3", "continuous"),
    Trainer("sac", "stable_baselines3", "SAC", "continuous"),
    Trainer("qrdqn", "sb3_contrib", "QRDQN", "discrete"),
    Trainer("tqc", "sb3_contrib", "TQC", "continuous"),
    Trainer("trpo", "sb3_contrib", "TRPO", qat_refused=(
        "trpo's natural-gradient step needs second derivatives, which fake quantization's straight-through "
        "estimator does not give (its line search divides by zero): train trpo without --qat-bits")),
):
    register_trainer(_trainer)


Hyperparams = dict[str, Any]
"""A zoo entry or ``--hp`` overrides by key: values as the zoo's YAML or ``--hp``'s literals give
them (numbers, strings, lists, dicts), checked by :mod:`quarl.training.hp_checks` and bound
for SB3's constructor, which types each argument itself."""
SB3Kwargs = dict[str, Any]
"""Keyword arguments of a Stable-Baselines3 constructor (the algorithm's, its policy's or
VecNormalize's), with schedules, classes and noise objects built."""


_MINATAR_POLICY = "dict(features_extractor_class='SmallCNN', net_arch=[])"
OWN_HYPERPARAMS: dict[str, dict[str, Hyperparams]] = {
    # MinAtar is not in the RL Zoo: settings after the MinAtar paper's (DQN) and CleanRL's
    # Atari PPO, scaled to 10x10 games; the small CNN is MinAtar's own network
    "minatar": {
        # DQN: one update per 4 steps (the MinAtar paper made one per step; 4x faster on a CPU)
        "dqn": {"policy": "CnnPolicy", "n_timesteps": 1_000_000, "learning_rate": 2.5e-4, "buffer_size": 100_000,
                "learning_starts": 5_000, "batch_size": 32, "train_freq": 4, "gradient_steps": 1,
                "target_update_interval": 1_000, "exploration_fraction": 0.1, "exploration_final_eps": 0.01,
                "policy_kwargs": _MINATAR_POLICY},
        "qrdqn": {"policy": "CnnPolicy", "n_timesteps": 1_000_000, "learning_rate": 2.5e-4, "buffer_size": 100_000,
                  "learning_starts": 5_000, "batch_size": 32, "train_freq": 4, "gradient_steps": 1,
                  "target_update_interval": 1_000, "exploration_fraction": 0.1, "exploration_final_eps": 0.01,
                  "policy_kwargs": _MINATAR_POLICY},
        # measured here on MinAtar/Breakout-v1 at 40k steps: PPO 5.3 (2.5e-4 and 128-step rollouts: 0.4 at 30k),
        # A2C 3.6
        "ppo": {"policy": "CnnPolicy", "n_timesteps": 1_000_000, "n_envs": 8, "n_steps": 64, "n_epochs": 4,
                "batch_size": 128, "learning_rate": 1e-3, "clip_range": 0.1, "ent_coef": 0.01, "vf_coef": 0.5,
                "policy_kwargs": _MINATAR_POLICY},
        "a2c": {"policy": "CnnPolicy", "n_timesteps": 1_000_000, "n_envs": 16, "learning_rate": 1e-3, "ent_coef": 0.01,
                "vf_coef": 0.25, "policy_kwargs": _MINATAR_POLICY},
    },
}
"""quarl's own entries for env families the RL Zoo has none for (family -> algo -> entry)."""
OWN_KEYS = ("n_envs", "n_timesteps", "policy", "normalize", "env_wrapper", "frame_stack", "noise_type", "noise_std",
            "callback", "env_kwargs")
"""Keys of a zoo entry quarl handles itself; everything else goes to the algorithm's constructor."""


def zoo_hyperparams_dir() -> Path:
    spec = importlib.util.find_spec("rl_zoo3")
    if spec is None or not spec.submodule_search_locations:
        raise QuarlError("the rl_zoo3 package is not installed: it ships the tuned hyperparameters "
                         "(pip install rl_zoo3)")
    return Path(list(spec.submodule_search_locations)[0]) / "hyperparams"


class ZooEntry(Record):
    """The keys of a zoo entry that quarl acts on itself (the others go to the algorithm's
    constructor, through :func:`quarl.training.hp_checks.check_hyperparameter`)."""

    model_config = ConfigDict(extra="allow")
    n_envs: int = Field(1, ge=1, le=1024)
    n_timesteps: int | float | None = Field(None, ge=1, le=10**10)
    policy: str = "MlpPolicy"
    normalize: bool | str = False
    frame_stack: int = Field(1, ge=1, le=64)
    env_wrapper: str | list[Any] | dict[str, Any] | None = None
    noise_type: str | None = None
    noise_std: float = Field(0.1, gt=0, le=1e6)
    env_kwargs: dict[str, Any] | None = None


ZOO_FILE_CAP = 16 << 20
"""Bytes of one rl_zoo3 hyperparameter file (the largest, ppo.yml, is ~20 kB)."""


def missing_statistics(algo: str, env_id: str, zip_name: str) -> str | None:
    """The one line to say where a bare zip plays without the VecNormalize statistics it
    was trained with: the RL Zoo's entry for ``algo`` on ``env_id`` normalizes, and a zip
    carries no statistics (they sit in its run folder's ``ENV/vecnormalize.pkl``). None
    where the zoo does not normalize (or has no entry, or rl_zoo3 is absent)."""
    try:
        raw, key = zoo_hyperparams(algo.lower(), env_id)
    except QuarlError:
        return None
    if not raw.get("normalize"):
        return None
    return (f"{zip_name} plays without observation normalization: the RL Zoo trains {algo.lower()} on {key} with "
            f"VecNormalize, whose statistics are not in the zip but in its run folder "
            f"({key}_1/{key}/vecnormalize.pkl); pass the run folder instead, or expect returns far from the trained "
            "agent's")


def zoo_hyperparams(algo: str, env_id: str) -> tuple[Hyperparams, str | None]:
    """(raw zoo entry, the key it was found under) for ``algo`` on ``env_id``: the exact id,
    else the same env at another version, else the zoo's ``atari`` entry for Atari games.
    ``({}, None)`` when the zoo has none (SB3 defaults apply). The entry is checked as a
    :class:`ZooEntry` (one line naming the file, the entry and the field)."""
    path = zoo_hyperparams_dir() / f"{algo}.yml"
    if not path.exists():
        return {}, None
    try:
        table = yaml.safe_load(read_capped(path, ZOO_FILE_CAP, "the RL Zoo's hyperparameters")) or {}
    except yaml.YAMLError as exc:
        raise QuarlError(f"{path}: not YAML ({str(exc).splitlines()[0]}): reinstall rl_zoo3") from None
    if not isinstance(table, dict):
        raise QuarlError(f"{path}: a {type(table).__name__}, not a table of envs: reinstall rl_zoo3")
    found = _zoo_entry(table, env_id)
    if found is None:
        family = env_family(env_id).name
        if algo in OWN_HYPERPARAMS.get(family, {}):
            return dict(OWN_HYPERPARAMS[family][algo]), f"quarl's {family}"
        return {}, None
    entry, key = found
    parse_record(ZooEntry, entry, f"{path} [{key}]")
    return dict(entry), key


def _zoo_entry(table: dict[Any, Any], env_id: str) -> tuple[Any, str] | None:
    """(entry, key) of ``env_id`` in a zoo file's table (YAML: keys and entries as written)."""
    if env_id in table:
        return table[env_id], env_id
    name = env_id.rsplit("-v", 1)[0]
    versions = sorted((k for k in table if isinstance(k, str) and k.rsplit("-v", 1)[0] == name), reverse=True)
    if versions:
        return table[versions[0]], versions[0]
    if is_atari(env_id) and "atari" in table:
        return table["atari"], "atari"
    return None

