"""The ActorQ run format: a policy trained by ``quarl actorq`` (``OUT/policy.pt`` +
``OUT/summary.json``) loaded as a Policy, so that ActorQ's output goes through ``ptq``,
``export`` and ``bench`` like any checkpoint. The weights are read with
``torch.load(weights_only=True)``; the network is rebuilt from their shapes (ReLU between
layers, the algorithm's head: tanh after the last for D4PG) and the env from the run's own
config. Importing this module registers the format (``actorq-run``) in
:data:`quarl.policies.formats.FORMATS`."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
from torch import nn

from quarl.actorq.algorithms import get_algorithm
from quarl.actorq.summary import ActorQRunConfig, ActorQRunRecord, read_summary_json
from quarl.core.errors import QuarlError
from quarl.core.file_schema import parse_record
from quarl.core.limits import check_tensors, load_torch, torch_file_cap
from quarl.envs import EnvSpec, current_env_id, make_env
from quarl.policies.base import Policy, check_outputs
from quarl.policies.checkpoint import Checkpoint, CheckpointFormat
from quarl.policies.formats import register_format
from quarl.policies.sb3_layers import mlp_from  # the slot-by-slot Sequential rebuild

POLICY_FILE, SUMMARY_FILE = "policy.pt", "summary.json"


def is_actorq_run(path: Path) -> bool:
    return path.is_dir() and (path / POLICY_FILE).exists() and (path / SUMMARY_FILE).exists()


def read_run_config(summary: Path) -> ActorQRunConfig:
    """The algo and env of an ActorQ run, from its ``summary.json`` (as an
    :class:`~quarl.actorq.summary.ActorQRunRecord`: a run of any quarl version), or one line
    naming the file and the field."""
    raw = read_summary_json(summary)
    if not isinstance(raw, dict) or "config" not in raw:
        raise QuarlError(f"{summary} is not an ActorQ summary (no config with algo and env_id)")
    return parse_record(ActorQRunRecord, raw, summary).config


def load_actorq_run(path: Path) -> tuple[Policy, EnvSpec, str]:
    """(policy, env spec, algo) of an ActorQ output folder."""

    config = read_run_config(path / SUMMARY_FILE)
    algo, env_id = config.algo, config.env_id
    sd = load_torch(path / POLICY_FILE, torch_file_cap(), "an ActorQ policy",
                    unreadable=lambda error: f"{path / POLICY_FILE} cannot be read as plain tensors ({error})")
    if not isinstance(sd, dict):
        raise QuarlError(f"{path / POLICY_FILE} holds a {type(sd).__name__}, not a state dict of tensors")
    check_tensors(sd, str(path / POLICY_FILE))
    try:
        layers = mlp_from({k: v.float() for k, v in sd.items()}, "", nn.ReLU, trailing=False)
    except (RuntimeError, KeyError, ValueError, IndexError) as exc:  # a bias that is not its weight's size...
        raise QuarlError(f"{path / POLICY_FILE} does not hold the layers of a policy (their shapes do not fit each "
                         f"other: {(str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]})") from None
    if not layers:
        raise QuarlError(f"{path / POLICY_FILE} holds no Linear layers")
    spec = EnvSpec(current_env_id(env_id))
    env = make_env(spec)
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    algorithm = get_algorithm(algo)
    discrete = isinstance(act_space, gym.spaces.Discrete)
    if not isinstance(act_space, (gym.spaces.Discrete, gym.spaces.Box)):
        raise QuarlError(f"{path}: ActorQ algo {algo!r} on {env_id} is not a policy quarl can act with")
    algorithm.check_actions(discrete, env_id, act_space)
    if not discrete and algorithm.tanh_for_continuous:
        layers.append(nn.Tanh())  # actions in [-1, 1], mapped onto the bounds
    head = algorithm.policy_head(discrete)
    policy = Policy(nn.Sequential(*layers), obs_space, act_space, head, algo=algo)
    check_outputs(policy, f"{path / POLICY_FILE} (the {algo} policy of {env_id})")  # shapes that chain, finite outputs
    return policy, spec, algo


def load(path: Path, trust_pickle: bool = False) -> Checkpoint:
    """The run's checkpoint (its files hold no pickle)."""
    policy, spec, algo = load_actorq_run(path)
    return Checkpoint(policy=policy, env_spec=spec, algo=algo, path=path)


FORMAT = register_format(CheckpointFormat("actorq-run", is_actorq_run, load,
                                          "quarl actorq's OUT folder (policy.pt + summary.json)"))
