"""What ActorQ's learners fit to, against references written as direct loops (as V-trace's is in
``tests/test_impala.py``): the n-step transitions the actors build (``NStep``), DQN's double-DQN
target on them, and D4PG's categorical projection (Bellemare, Dabney and Munos 2017,
Algorithm 1). Each reference reads the same weights and the same batch as the learner, in
float64, one row (and one atom) at a time.

Each test also shows, on its own data, that the usual mistakes would be caught: the target
network picking the argmax (plain DQN), the online networks standing in for the target ones."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

from quarl.actorq.config import ActorQConfig
from quarl.actorq.learners import D4PGLearner, DQNLearner, mlp, policy_network
from quarl.actorq.replay import Batch, NStep, stack

GAMMA = 0.9
N_STEP = 3
OBS_DIM = 4
N_ACTIONS = 3


@dataclass(frozen=True)
class Step:
    obs: np.ndarray
    action: int
    reward: float
    next_obs: np.ndarray
    terminated: bool
    truncated: bool


def _trajectory(rng: np.random.Generator, length: int) -> list[Step]:
    """Episodes back to back, each ended by a terminal or a time limit (about one step in 8
    each), the last one by a time limit so every step's n-step transition is complete."""
    steps: list[Step] = []
    obs = rng.normal(size=OBS_DIM).astype(np.float32)
    for t in range(length):
        next_obs = rng.normal(size=OBS_DIM).astype(np.float32)
        terminated = bool(rng.random() < 0.12)
        truncated = not terminated and (bool(rng.random() < 0.12) or t == length - 1)
        steps.append(Step(obs, int(rng.integers(N_ACTIONS)), float(rng.normal()), next_obs, terminated, truncated))
        # after an episode ends the next one starts from a reset: a state no transition leads to
        obs = rng.normal(size=OBS_DIM).astype(np.float32) if terminated or truncated else next_obs
    return steps


def reference_nstep(steps: list[Step], n: int, gamma: float) -> list[tuple[int, float, float, int]]:
    """For each step t, from the definition: ``(t, sum_{i<m} gamma^i r_{t+i}, discount, k)``
    where the sum stops after n steps or at the episode's end (m steps, the last one k),
    ``discount`` is gamma^m, or 0 when step k ended the episode at a terminal state (no
    bootstrap; a time limit bootstraps), and the bootstrap state is step k's next state."""
    out = []
    for t in range(len(steps)):
        ret, discount, k = 0.0, 1.0, t
        while True:
            ret += discount * steps[k].reward
            discount *= gamma
            if steps[k].terminated:
                discount = 0.0
                break
            if steps[k].truncated or k - t + 1 == n:
                break
            k += 1
        out.append((t, ret, discount, k))
    return out


def _nstep_batch(steps: list[Step]) -> Batch:
    nstep = NStep(N_STEP, GAMMA)
    transitions = []
    for s in steps:
        transitions += nstep.add(s.obs, np.int64(s.action), s.reward, s.next_obs, s.terminated, s.truncated)
    return stack(transitions)


def test_nstep_transitions_match_their_definition() -> None:
    steps = _trajectory(np.random.default_rng(0), 400)
    batch = _nstep_batch(steps)
    reference = reference_nstep(steps, N_STEP, GAMMA)
    assert len(batch) == len(reference) == len(steps)  # one transition per step, in step order
    for row, (t, ret, discount, k) in enumerate(reference):
        assert np.array_equal(batch.obs[row], steps[t].obs) and batch.action[row] == steps[t].action
        assert np.array_equal(batch.next_obs[row], steps[k].next_obs)
        assert batch.reward[row] == pytest.approx(ret, rel=1e-6, abs=1e-6)
        assert batch.discount[row] == pytest.approx(discount, rel=1e-6, abs=1e-12)
    # the trajectory holds every case: full n-step windows, terminals, short windows before a time limit
    rows = {m: int(np.isclose(batch.discount, GAMMA**m).sum()) for m in range(1, N_STEP + 1)}
    assert rows[N_STEP] > 100 and rows[1] > 10 and rows[2] > 10 and int((batch.discount == 0).sum()) > 20


def _double(module: nn.Module) -> nn.Module:
    return copy.deepcopy(module).double().eval()


def _row(x: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x, np.float64))[None]


def _dqn() -> DQNLearner:
    """A DQN learner whose target network is not its online one (as between two hard
    updates): another initialization, so the two networks' argmax often differ."""
    config = ActorQConfig.flat("CartPole-v1", algo="dqn", policy_layers=(32, 32), n_step=N_STEP, gamma=GAMMA,
                               target_update_period=10_000, learning_rate=1e-3)
    learner = DQNLearner(config, OBS_DIM, N_ACTIONS)
    torch.manual_seed(1)
    learner.target.load_state_dict(policy_network(config, OBS_DIM, N_ACTIONS).state_dict())
    return learner


def test_dqn_target_is_double_dqn_on_nstep_returns() -> None:
    """From the raw trajectory, one step at a time: the n-step return, plus, unless a terminal
    stopped it, gamma^m times the target network's value of the action the online network
    picks at the bootstrap state. The learner's ``targets`` on the n-step batch the actors
    would send, and the loss its ``step`` reports, match it."""
    steps = _trajectory(np.random.default_rng(1), 300)
    batch = _nstep_batch(steps)
    learner = _dqn()
    online, target = _double(learner.q), _double(learner.target)
    expected, plain, picks_differ = [], [], 0
    with torch.no_grad():
        for t, ret, discount, k in reference_nstep(steps, N_STEP, GAMMA):
            q_online = online(_row(steps[k].next_obs))[0].tolist()
            q_target = target(_row(steps[k].next_obs))[0].tolist()
            best = max(range(N_ACTIONS), key=lambda a: q_online[a])  # the online network picks...
            expected.append(ret + discount * q_target[best])  # ...the target network rates
            plain.append(ret + discount * max(q_target))  # plain DQN: the target network does both
            picks_differ += discount > 0 and best != max(range(N_ACTIONS), key=lambda a: q_target[a])
    got = learner.targets(batch).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    # the data tells double from plain DQN: a plain-DQN target would miss by far more than the tolerance
    assert picks_differ > 50 and np.abs(np.asarray(plain) - expected).max() > 0.05

    # and step fits Q(obs, action) to exactly that target (Huber loss, the batch's mean)
    with torch.no_grad():
        q_taken = [online(_row(batch.obs[i]))[0, int(batch.action[i])].item() for i in range(len(batch))]
    huber = [0.5 * d * d if abs(d) < 1 else abs(d) - 0.5 for d in np.subtract(q_taken, expected)]
    assert learner.step(batch)["loss"] == pytest.approx(float(np.mean(huber)), rel=1e-5)


def test_dqn_target_of_a_terminal_is_its_reward_and_a_time_limit_bootstraps() -> None:
    """Two rows with the same next state: at a terminal (discount 0) the target is the reward
    alone; cut by a time limit (discount gamma) it adds gamma times the bootstrap."""
    learner = _dqn()
    next_obs = np.full((2, OBS_DIM), 0.5, np.float32)
    batch = Batch(obs=np.zeros((2, OBS_DIM), np.float32), action=np.zeros(2, np.int64),
                  reward=np.array([1.5, 1.5], np.float32), discount=np.array([0.0, GAMMA], np.float32),
                  next_obs=next_obs)
    with torch.no_grad():
        best = int(_double(learner.q)(_row(next_obs[0]))[0].argmax())
        bootstrap = _double(learner.target)(_row(next_obs[0]))[0, best].item()
    assert abs(bootstrap) > 0.01
    np.testing.assert_allclose(learner.targets(batch).numpy(), [1.5, 1.5 + GAMMA * bootstrap], rtol=1e-6, atol=1e-6)


def reference_projection(reward: float, discount: float, probs: list[float], v_min: float, v_max: float) -> np.ndarray:
    """Bellemare et al. 2017, Algorithm 1, atom by atom: atom z_j moves to
    ``Tz_j = clip(r + discount z_j, v_min, v_max)``, at position ``b_j = (Tz_j - v_min) / dz``
    between atoms l = floor(b_j) and u = ceil(b_j), which get p_j (u - b_j) and p_j (b_j - l).
    Where b_j falls on an atom (l = u) the algorithm as printed gives it nothing; the atom
    takes all of p_j (the usual correction, so the mass stays 1)."""
    n_atoms = len(probs)
    dz = (v_max - v_min) / (n_atoms - 1)
    m = np.zeros(n_atoms)
    for j in range(n_atoms):
        tz = min(max(reward + discount * (v_min + j * dz), v_min), v_max)
        b = (tz - v_min) / dz
        lower, upper = math.floor(b), math.ceil(b)
        if lower == upper:
            m[lower] += probs[j]
        else:
            m[lower] += probs[j] * (upper - b)
            m[upper] += probs[j] * (b - lower)
    return m


def test_d4pg_target_is_the_categorical_projection_of_the_target_networks() -> None:
    """The learner's ``targets``: the target critic's distribution at the target policy's
    action on the next state, projected (Algorithm 1) for rewards inside and beyond
    [v_min, v_max], discounts from 0 (a terminal) to 1, and shifts that land on atoms; and
    ``step``'s critic loss is the cross-entropy of the critic to that distribution."""
    v_min, v_max, n_atoms = -5.0, 5.0, 11  # atoms 1 apart
    config = ActorQConfig.flat("Pendulum-v1", algo="d4pg", policy_layers=(32, 32), critic_layers=(32, 32), v_min=v_min,
                               v_max=v_max, n_atoms=n_atoms, gamma=GAMMA, n_step=N_STEP, target_update_period=10_000)
    obs_dim, act_dim = 3, 2
    learner = D4PGLearner(config, obs_dim, act_dim)
    torch.manual_seed(1)  # target networks apart from the online ones, as between two hard updates
    learner.target_policy.load_state_dict(policy_network(config, obs_dim, act_dim, continuous=True).state_dict())
    learner.target_critic.load_state_dict(mlp([obs_dim + act_dim, 32, 32, n_atoms]).state_dict())
    with torch.no_grad():  # a peaked distribution (a uniform one would hide a misplaced atom)
        learner.target_critic[-1].weight.mul_(8.0)

    rng = np.random.default_rng(2)
    rows = 64
    reward = np.concatenate([rng.normal(0, 2, 40), [12.0, -9.0, 30.0, -30.0], rng.integers(-3, 4, 20)])
    discount = np.concatenate([rng.choice([0.0, GAMMA, GAMMA**2, GAMMA**3], 44), rng.choice([0.0, 1.0], 20)])
    batch = Batch(obs=rng.normal(size=(rows, obs_dim)).astype(np.float32),
                  action=rng.uniform(-1, 1, (rows, act_dim)).astype(np.float32),
                  reward=reward.astype(np.float32), discount=discount.astype(np.float32),
                  next_obs=rng.normal(size=(rows, obs_dim)).astype(np.float32))

    def reference(policy: nn.Module, critic: nn.Module) -> np.ndarray:
        out = []
        with torch.no_grad():
            for i in range(rows):
                next_obs = _row(batch.next_obs[i])
                probs = torch.softmax(critic(torch.cat([next_obs, policy(next_obs)], 1)), 1)[0].tolist()
                out.append(reference_projection(float(batch.reward[i]), float(batch.discount[i]), probs, v_min, v_max))
        return np.stack(out)

    expected = reference(_double(learner.target_policy), _double(learner.target_critic))
    got = learner.targets(batch).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-6)
    np.testing.assert_allclose(got.sum(1), 1.0, atol=1e-6)
    # the online networks give another target, and a projection one atom off is far from it
    assert np.abs(reference(_double(learner.policy), _double(learner.critic)) - expected).max() > 0.05
    assert np.abs(np.roll(expected, 1, axis=1) - expected).max() > 0.1

    critic = _double(learner.critic)
    with torch.no_grad():
        logits = critic(torch.cat([torch.as_tensor(batch.obs, dtype=torch.float64),
                                   torch.as_tensor(batch.action, dtype=torch.float64)], 1))
    cross_entropy = -(torch.as_tensor(expected) * torch.log_softmax(logits, 1)).sum(1)
    assert learner.step(batch)["critic_loss"] == pytest.approx(cross_entropy.mean().item(), rel=1e-5)
