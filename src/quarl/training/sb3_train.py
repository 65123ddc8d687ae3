"""Train a Stable-Baselines3 agent and save it as an RL Zoo run folder
(``DIR/algo/ENV_1/ENV.zip`` + ``DIR/algo/ENV_1/ENV/config.yml``, ``args.yml``) that
:func:`quarl.policies.sb3.load_checkpoint` reads back as is."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml

from quarl.errors import QuarlError

log = logging.getLogger(__name__)

# The RL Zoo's tuned PPO CartPole-v1 hyperparameters (linear schedules as constants of
# their start value): the policy the demo trains when no zoo agents are at hand.
CARTPOLE_PPO: dict[str, Any] = {
    "n_envs": 8,
    "n_steps": 32,
    "batch_size": 256,
    "gae_lambda": 0.8,
    "gamma": 0.98,
    "n_epochs": 20,
    "ent_coef": 0.0,
    "learning_rate": 1e-3,
    "clip_range": 0.2,
}

_ALGOS = ("a2c", "ppo", "dqn", "sac", "td3", "ddpg")


def train_zoo_run(
    algo: str,
    env_id: str,
    timesteps: int,
    out_dir: Path,
    seed: int = 0,
    hyperparams: dict[str, Any] | None = None,
    progress_bar: bool = False,
) -> Path:
    """Train and save; returns the run folder (``out_dir/algo/ENV_1``)."""
    import stable_baselines3 as sb3
    from stable_baselines3.common.env_util import make_vec_env

    if algo not in _ALGOS:
        raise QuarlError(f"unknown algorithm {algo!r}: allowed {', '.join(_ALGOS)}")
    params = dict(hyperparams or {})
    n_envs = int(params.pop("n_envs", 1))
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    model_cls = getattr(sb3, algo.upper())
    model = model_cls("MlpPolicy", env, seed=seed, verbose=0, device="cpu", **params)
    log.info("training %s on %s for %d steps", algo, env_id, timesteps)
    model.learn(total_timesteps=timesteps, progress_bar=progress_bar)
    run_dir = Path(out_dir) / algo / f"{env_id}_1"
    config_dir = run_dir / env_id
    config_dir.mkdir(parents=True, exist_ok=True)
    model.save(run_dir / f"{env_id}.zip")
    config = {**params, "n_envs": n_envs, "n_timesteps": timesteps, "policy": "MlpPolicy"}
    (config_dir / "config.yml").write_text(yaml.safe_dump(config))
    (config_dir / "args.yml").write_text(yaml.safe_dump({"algo": algo, "env": env_id, "seed": seed}))
    env.close()
    return run_dir
