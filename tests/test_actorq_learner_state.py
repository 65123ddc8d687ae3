"""ActorQ's learners and stores typed (issue 39): a learner step's metrics (numbers, and
prioritized replay's priorities apart), a learner's checkpoint state (networks', optimizers'
state dicts and its step count) and a store's state, each through a weights-only checkpoint;
a learner state's part of the wrong kind is a TypeError (the resume's one line)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from quarl.actorq.algorithms import make_learner
from quarl.actorq.config import ActorQConfig
from quarl.actorq.coordinator import split_metrics
from quarl.actorq.replay import PrioritizedReplay, Replay, UnrollQueue, stack


def _config(**fields: object) -> ActorQConfig:
    return ActorQConfig.flat("CartPole-v1", **{"local": True, "actors": 1, "policy_layers": (16,), "batch_size": 8,
                                               **fields})


@pytest.mark.parametrize("algo, discrete, act_dim", [("dqn", True, 2), ("d4pg", False, 1), ("impala", True, 2),
                                                     ("ppo", False, 1)])
def test_a_learner_state_round_trips_through_a_weights_only_checkpoint(tmp_path: Path, algo: str, discrete: bool,
                                                                       act_dim: int) -> None:
    config = _config(algo=algo)
    learner = make_learner(config, 4, act_dim, discrete)
    torch.save(learner.state_dict(), tmp_path / "learner.pt")
    other = make_learner(replace(config, seed=1), 4, act_dim, discrete)
    other.load_state_dict(torch.load(tmp_path / "learner.pt", weights_only=True))
    assert all(torch.equal(a, b) for a, b in zip(learner.policy_network().state_dict().values(),
                                                 other.policy_network().state_dict().values(), strict=True))
    assert list(other.state_dict()) == list(learner.state_dict()) and other.steps == learner.steps


def test_a_learner_state_of_the_wrong_kind_is_a_type_error() -> None:
    learner = make_learner(_config(), 4, 2)
    good = learner.state_dict()
    for name, value in (("q", 5), ("q", {"0.weight": [1.0]}), ("opt", {"lr": 0.1}), ("steps", {"n": 1})):
        with pytest.raises(TypeError, match=name):
            learner.load_state_dict({**good, name: value})
    with pytest.raises(KeyError):
        learner.load_state_dict({k: v for k, v in good.items() if k != "target"})


def test_a_learner_steps_metrics_split_into_numbers_and_priorities() -> None:
    numbers, priority = split_metrics({"loss": np.float32(0.5), "critic_kl": 2, "priority": np.array([1.0, 3.0])})
    assert numbers == {"loss": 0.5, "critic_kl": 2.0} and all(type(v) is float for v in numbers.values())
    assert priority is not None and priority.tolist() == [1.0, 3.0]
    assert split_metrics({"loss": 1.0}) == ({"loss": 1.0}, None)


def test_each_store_keeps_its_state_through_a_weights_only_checkpoint(tmp_path: Path) -> None:
    rows = stack([(np.full(4, i, np.float32), i % 2, float(i), 0.99, np.full(4, i + 1, np.float32)) for i in range(6)])
    for store in (Replay(8, seed=3), PrioritizedReplay(8, seed=3), UnrollQueue(64)):
        if not isinstance(store, UnrollQueue):
            store.insert(rows)
        if isinstance(store, PrioritizedReplay):
            store.update_priorities(np.arange(3), np.array([5.0, 0.1, 2.0]))
        torch.save(store.state(), tmp_path / "replay.pt")
        state = torch.load(tmp_path / "replay.pt", weights_only=True)
        copy = type(store)(8, seed=3) if not isinstance(store, UnrollQueue) else UnrollQueue(64)
        copy.load_state(state)
        assert copy.size == store.size and set(state) == set(store.state())
        if isinstance(store, Replay):
            assert store.data is not None and copy.data is not None
            assert all(np.array_equal(store.data[k], copy.data[k]) for k in store.data)
        if isinstance(store, PrioritizedReplay) and isinstance(copy, PrioritizedReplay):
            assert np.array_equal(copy.tree.tree, store.tree.tree) and copy.max_priority == store.max_priority
