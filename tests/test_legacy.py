"""The paper's agents: legacy stable-baselines (TensorFlow) pickles of rl-baselines-zoo."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from quarl.checkpoints import load_checkpoint
from quarl.core.errors import QuarlError
from quarl.evaluation.cells import EvalSettings
from quarl.policies.legacy import read_pickle
from quarl.ptq.run import run_ptq
from tests.conftest import ROOT

PAPER = Path(os.environ.get("QUARL_PAPER_AGENTS", ROOT.parent / "shared" / "paper-agents"))

# (file, algorithm, env, the least mean return the trained agent gets: CartPole's
# maximum, MountainCarContinuous' "solved" 90)
AGENTS = [
    ("dqn/CartPole-v1.pkl", "dqn", "CartPole-v1", 475.0),
    ("ppo2/CartPole-v1.pkl", "ppo", "CartPole-v1", 475.0),
    ("a2c/CartPole-v1.pkl", "a2c", "CartPole-v1", 475.0),
    ("ddpg/MountainCarContinuous-v0.pkl", "ddpg", "MountainCarContinuous-v0", 90.0),
    ("ppo2/MountainCarContinuous-v0.pkl", "ppo", "MountainCarContinuous-v0", 90.0),
]


def paper_agent(name: str) -> Path:
    path = PAPER / name
    if not path.exists():
        pytest.skip(f"paper agent {name} not found under {PAPER} (../shared is absent)")
    return path


@pytest.mark.parametrize("name,algo,env_id,least", AGENTS, ids=[a[0] for a in AGENTS])
def test_paper_agents_load_and_keep_their_return_at_int8(name: str, algo: str, env_id: str, least: float,
                                                          tmp_path: Path) -> None:
    ckpt = load_checkpoint(paper_agent(name))
    assert ckpt.algo == algo and ckpt.env_spec.env_id == env_id
    result = run_ptq(ckpt.policy, ckpt.env_spec, ["fp32", "int8"], EvalSettings(episodes=5, seed=0, n_envs=5),
                     tmp_path)
    rows = {r["precision"]: r for r in result}
    assert rows["fp32"]["mean"] >= least, rows
    assert rows["int8"]["mean"] >= least - 0.05 * abs(least), rows


def _reference_dqn(params: list[np.ndarray], obs: np.ndarray) -> np.ndarray:
    """stable-baselines' dueling DQN with layer norm, written out in numpy from the raw
    variable list: [eps], action_value (w, b, beta, gamma, w, b), state_value (same)."""
    p = [np.asarray(v, np.float64) for v in params if np.ndim(v) > 0]

    def stream(w1, b1, beta, gamma, w2, b2):
        h = obs @ w1 + b1
        h = (h - h.mean(1, keepdims=True)) / np.sqrt(h.var(1, keepdims=True) + 1e-12) * gamma + beta
        return np.maximum(h, 0) @ w2 + b2

    advantage, value = stream(*p[0:6]), stream(*p[6:12])
    return value + advantage - advantage.mean(1, keepdims=True)


def test_dqn_network_matches_the_tensorflow_graph_written_out() -> None:
    path = paper_agent("dqn/CartPole-v1.pkl")
    _, params = read_pickle(path)
    policy = load_checkpoint(path).policy
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    with torch.no_grad():
        q = policy.network(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(q, _reference_dqn(params, obs), rtol=1e-4, atol=1e-4)


def test_ppo2_gaussian_policy_acts_with_its_mean_on_normalized_observations() -> None:
    path = paper_agent("ppo2/MountainCarContinuous-v0.pkl")
    _, params = read_pickle(path)
    policy = load_checkpoint(path).policy
    p = [np.asarray(v, np.float64) for v in params]
    obs = np.array([[-0.5, 0.0], [-1.1, 0.05], [0.3, -0.02]])
    mean, var = policy.obs_normalizer.mean, policy.obs_normalizer.var
    x = np.clip((obs - mean) / np.sqrt(var + 1e-8), -10, 10)
    # creation order: pi_fc0, vf_fc0, pi_fc1, vf_fc1, vf, pi, logstd, q
    h = np.tanh(np.tanh(x @ p[0] + p[1]) @ p[4] + p[5])
    expected = np.clip(h @ p[10] + p[11], -1, 1)
    np.testing.assert_allclose(policy.act(obs), expected, rtol=1e-4, atol=1e-5)


class _Payload:
    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def test_a_pickle_that_would_run_code_runs_none(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    bad = tmp_path / "dqn" / "CartPole-v1.pkl"
    bad.parent.mkdir()
    bad.write_bytes(pickle.dumps(({"policy": _Payload(marker)}, [_Payload(marker)])))
    with pytest.raises(QuarlError, match="cannot tell|not supported|unsupported"):
        load_checkpoint(bad)
    assert not marker.exists()


def test_not_a_model_file_fails_with_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "ppo2" / "CartPole-v1.pkl"
    junk.parent.mkdir()
    junk.write_bytes(b"not a pickle at all")
    with pytest.raises(QuarlError, match="not a readable legacy stable-baselines pickle"):
        load_checkpoint(junk)
    junk.write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(QuarlError, match=r"not a stable-baselines model file: expected \(data, params\)"):
        load_checkpoint(junk)


def test_demo_table_on_the_paper_agents(tmp_path: Path) -> None:
    from tests.conftest import run_cli
    from tests.test_cli import read_csv

    agents = tmp_path / "paper"
    (agents / "dqn").mkdir(parents=True)
    (agents / "dqn" / "CartPole-v1.pkl").symlink_to(paper_agent("dqn/CartPole-v1.pkl"))
    r = run_cli("demo", "--zoo", str(agents), "--episodes", "3", "--out", str(tmp_path / "demo"))
    assert r.returncode == 0, r.stderr
    rows = read_csv(tmp_path / "demo" / "table.csv")
    assert rows[0].pop("int modes")  # the int8 kernel that ran is named
    wide = {"lo": "-268.88", "hi": "72.89", "verdict": "undecided (~62 more episodes)", "range": "env 0:500"}
    assert rows == [
        {"policy": "dqn CartPole-v1", "fp32": "500.0", "fp16": "500.0", "E_fp16%": "0.0", "E_fp16 lo": wide["lo"],
         "E_fp16 hi": wide["hi"], "fp16 verdict": wide["verdict"], "fp16 range": wide["range"], "int8": "500.0",
         "E_int8%": "0.0", "E_int8 lo": wide["lo"], "E_int8 hi": wide["hi"], "int8 verdict": wide["verdict"],
         "int8 range": wide["range"]}
    ]  # 500 on three seeds: no loss seen, but three clean episodes cannot exclude one
