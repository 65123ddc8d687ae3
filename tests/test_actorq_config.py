"""ActorQ's run config: the shared fields plus the chosen algorithm's own options (each
registry entry's dataclass), saved as flat JSON with a version; files written before the
version (every algorithm's options in them) still load, resume and are reused."""

from __future__ import annotations

import ast
import json
from dataclasses import fields
from pathlib import Path

import pytest

from quarl.actorq.algorithms import ALGORITHMS, Algorithm, algorithm_names, get_algorithm, register_algorithm
from quarl.actorq.config import CONFIG_VERSION, ActorQConfig, current_json, shared_fields
from quarl.actorq.options import AlgorithmOptions, D4PGOptions, DQNOptions, IMPALAOptions, ReplayOptions, UnrollOptions
from quarl.cli.actorq_options import field_docs
from quarl.core.errors import QuarlError
from tests.conftest import actorq_summary

SRC = Path(__file__).resolve().parents[1] / "src" / "quarl"

OLD_IMPALA = json.loads(
    '{"env_id": "CartPole-v1", "algo": "impala", "actors": 2, "actor_precision": "int8", "wire_bits": 32, '
    '"update_period": 300, "push_period": 100, "policy_layers": [32, 16], "critic_layers": [512, 512, 512], '
    '"n_step": 3, "gamma": 0.99, "batch_size": 256, "learning_rate": 0.0001, "target_update_period": 100, '
    '"replay": "uniform", "priority_exponent": 0.6, "importance_exponent": 0.4, "replay_size": 1000000, '
    '"min_replay": 1000, "samples_per_insert": 32.0, "samples_per_insert_tolerance": 0.1, "max_exploration": 0.2, '
    '"v_min": -150.0, "v_max": 150.0, "n_atoms": 51, "target_reward": null, "max_minutes": 10.0, '
    '"max_env_steps": null, "eval_every_s": 10.0, "eval_every_steps": null, "eval_episodes": 5, '
    '"unroll_length": 20, "rho_bar": 2.0, "c_bar": 1.0, "correction": false, "entropy_cost": 0.01, '
    '"baseline_cost": 0.5, "policy_sigma": 0.3, "clip_range": 0.2, "gae_lambda": 0.95, "ppo_epochs": 4, '
    '"ppo_minibatches": 4, "chunk_steps": 100, "checkpoint_every_s": 60.0, "checkpoint_replay": false, "seed": 0, '
    '"out": "runs/old", "local": false, "address": null, "learner_device": "cpu"}')
"""``ActorQConfig("CartPole-v1", algo="impala", correction=False, rho_bar=2.0, policy_layers=(32, 16),
out=Path("runs/old")).to_json()`` as quarl wrote it before the config had a version (one
flat config with every algorithm's options)."""
OLD_IMPALA_NOW = ActorQConfig("CartPole-v1", "impala", IMPALAOptions(correction=False, rho_bar=2.0),
                              policy_layers=(32, 16), out=Path("runs/old"))


def test_each_algorithm_owns_its_options_and_the_config_only_the_chosen_ones() -> None:
    config = ActorQConfig("Pendulum-v1", "d4pg", D4PGOptions(n_atoms=21))
    assert config.options == D4PGOptions(n_atoms=21) and D4PGOptions.of(config).n_atoms == 21
    assert ActorQConfig("CartPole-v1").options == DQNOptions()  # left out: the algorithm's defaults
    assert ActorQConfig("CartPole-v1", "ppo").options == get_algorithm("ppo").options()
    with pytest.raises(QuarlError, match="options D4PGOptions are not --algo impala's: it takes IMPALAOptions"):
        ActorQConfig("CartPole-v1", "impala", D4PGOptions())
    with pytest.raises(QuarlError, match=r"--clip-range is not an option of --algo impala \(its own: --baseline-cost"):
        ActorQConfig.flat("CartPole-v1", "impala", clip_range=0.1)
    with pytest.raises(TypeError, match="--algo dqn's options are DQNOptions, not UnrollOptions"):
        UnrollOptions.of(ActorQConfig("CartPole-v1"))
    assert ActorQConfig.flat("CartPole-v1", "impala", unroll_length=25).with_values(c_bar=0.5).options == \
        IMPALAOptions(unroll_length=25, c_bar=0.5)
    for name in algorithm_names():  # flat JSON: no option shares a name with a shared field
        options = get_algorithm(name).options
        assert not shared_fields() & {f.name for f in fields(options)}, name
        docs = field_docs(options)  # CleanRL's style: each field says what it is (its --help)
        assert all(docs.get(f.name) for f in fields(options)), (name, set(f.name for f in fields(options)) - set(docs))


def test_an_entry_s_options_fit_how_its_actors_act() -> None:
    dqn = get_algorithm("dqn")
    with pytest.raises(ValueError, match="made-up's options IMPALAOptions must extend ReplayOptions"):
        register_algorithm(Algorithm("made-up", "x", "discrete", dqn.make_learner, dqn.make_replay, dqn.make_limiter,
                                     IMPALAOptions))
    with pytest.raises(ValueError, match="made-up's options AlgorithmOptions must extend UnrollOptions"):
        register_algorithm(Algorithm("made-up", "x", "either", dqn.make_learner, dqn.make_replay, dqn.make_limiter,
                                     AlgorithmOptions, unrolls=True))
    assert "made-up" not in ALGORITHMS
    assert issubclass(DQNOptions, ReplayOptions) and not issubclass(IMPALAOptions, ReplayOptions)


@pytest.mark.parametrize("algo", ["dqn", "d4pg", "impala", "ppo"])
def test_the_saved_config_is_flat_json_with_a_version_and_loads_back(algo: str) -> None:
    config = ActorQConfig("CartPole-v1", algo, policy_layers=(8, 8), seed=3)
    saved = json.loads(json.dumps(config.to_json()))
    assert saved["config_version"] == CONFIG_VERSION == 2
    assert set(saved) == {"config_version"} | shared_fields() | {f.name for f in fields(config.options)}
    assert not any(isinstance(v, dict) for v in saved.values())  # flat
    assert ActorQConfig.from_json(saved) == config


def test_a_config_written_before_the_version_still_loads() -> None:
    """A version-1 file (every algorithm's options in it) loads as its algorithm's config;
    the other algorithms' options in it are dropped."""
    assert ActorQConfig.from_json(OLD_IMPALA) == OLD_IMPALA_NOW
    assert current_json(OLD_IMPALA) == json.loads(json.dumps(OLD_IMPALA_NOW.to_json()))
    with pytest.raises(QuarlError, match=r"config_version 3 is not one this quarl reads: allowed 1..2"):
        ActorQConfig.from_json({**OLD_IMPALA_NOW.to_json(), "config_version": 3})
    with pytest.raises(QuarlError, match="--clip-range is not an option of --algo impala"):
        ActorQConfig.from_json({**OLD_IMPALA_NOW.to_json(), "clip_range": 0.2})  # version 2 holds only its own


def test_an_old_run_folder_is_reused_resumed_and_loaded(tmp_path: Path) -> None:
    """summary.json and checkpoint.pt's config of the version-1 format: ``actorq compare``
    reuses the run for the same configuration (and refuses it for another), ``--resume``
    accepts its checkpoint, and the folder loads as a policy."""
    import torch

    import quarl
    from quarl.actorq.compare import _check_same_run
    from quarl.actorq.learners import policy_network
    from quarl.actorq.snapshot import _check_resumed_config

    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(actorq_summary(config=OLD_IMPALA)))
    _check_same_run(run / "summary.json", OLD_IMPALA_NOW)
    with pytest.raises(QuarlError, match=r"holds a run of another configuration \(rho_bar differ\)"):
        _check_same_run(run / "summary.json", OLD_IMPALA_NOW.with_values(rho_bar=1.0))
    _check_resumed_config(run / "checkpoint.pt", OLD_IMPALA, OLD_IMPALA_NOW)
    with pytest.raises(QuarlError, match="was written by a run with correction=False, this one has True"):
        _check_resumed_config(run / "checkpoint.pt", OLD_IMPALA, OLD_IMPALA_NOW.with_values(correction=True))
    torch.save(policy_network(OLD_IMPALA_NOW, 4, 2).state_dict(), run / "policy.pt")
    agent = quarl.load(run)
    assert agent.env_spec is not None and agent.env_spec.env_id == "CartPole-v1"


def test_no_actorq_or_cli_module_compares_an_algorithm_s_name() -> None:
    """The entry modules register the names; everything else asks the entry."""
    names = set(algorithm_names())
    owners = {SRC / "actorq" / "algorithms.py", SRC / "actorq" / "ppo.py"}  # where the names are registered
    found = []
    for path in sorted([*(SRC / "actorq").glob("*.py"), *(SRC / "cli").glob("*.py")]):
        if path in owners:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                constants = [c for c in (node.left, *node.comparators) for c in ast.walk(c)
                             if isinstance(c, ast.Constant) and c.value in names]
                found += [f"{path.name}:{node.lineno}" for _ in constants[:1]]
    assert not found, found
