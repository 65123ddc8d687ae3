"""Replay: n-step transitions built by actors, a uniform ring buffer, its proportional
prioritized variant, and a rate limiter with the semantics of Reverb's
``SampleToInsertRatio``."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, fields, replace
from typing import Annotated, Any, NotRequired, Protocol

import numpy as np
import torch
from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict

from quarl.actorq.run_state import Count


@dataclass(frozen=True)
class Batch:
    """n-step transitions, one row each: what actors send, replay stores and learners read."""

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    """Discounted n-step sum of rewards."""
    discount: np.ndarray
    """gamma^k for the k steps summed; 0 at a terminal (no bootstrap)."""
    next_obs: np.ndarray
    weight: np.ndarray | None = None
    """Importance weights (prioritized replay only)."""
    index: np.ndarray | None = None
    """Replay slots the rows came from (prioritized replay only: where priorities go back)."""

    def __len__(self) -> int:
        return len(self.reward)

    def transitions(self) -> dict[str, np.ndarray]:
        """The stored fields (not the sampling ones), by name."""
        return {name: getattr(self, name) for name in TRANSITION_FIELDS}

    def rows(self, idx: np.ndarray | slice) -> Batch:
        return Batch(**{name: getattr(self, name)[idx] for name in TRANSITION_FIELDS})


TRANSITION_FIELDS = tuple(f.name for f in fields(Batch) if f.name not in ("weight", "index"))


class NStep:
    """Turns single steps into n-step transitions. Call :meth:`add` after every env step;
    it returns the transitions that became complete."""

    def __init__(self, n: int, gamma: float) -> None:
        self.n, self.gamma = n, gamma
        self.window: deque = deque()

    def _emit(self, next_obs: np.ndarray, terminal: bool) -> tuple:
        obs, action, _ = self.window[0]
        ret, disc = 0.0, 1.0
        for _, _, r in self.window:
            ret += disc * r
            disc *= self.gamma
        self.window.popleft()
        return obs, action, ret, 0.0 if terminal else disc, next_obs

    def add(self, obs: np.ndarray, action: np.ndarray | np.integer[Any], reward: float, next_obs: np.ndarray,
            terminated: bool, truncated: bool) -> list[tuple]:
        self.window.append((obs, action, float(reward)))
        out = []
        if terminated or truncated:
            while self.window:  # flush: terminal -> no bootstrap; truncated -> bootstrap from next_obs
                out.append(self._emit(next_obs, terminated))
        elif len(self.window) == self.n:
            out.append(self._emit(next_obs, False))
        return out


def stack(transitions: list[tuple]) -> Batch:
    obs, action, reward, discount, next_obs = zip(*transitions, strict=True)
    return Batch(
        obs=np.asarray(obs, dtype=np.float32),
        action=np.asarray(action),
        reward=np.asarray(reward, dtype=np.float32),
        discount=np.asarray(discount, dtype=np.float32),
        next_obs=np.asarray(next_obs, dtype=np.float32),
    )


@with_config(ConfigDict(strict=True, allow_inf_nan=False, extra="forbid", arbitrary_types_allowed=True))
class ReplayState(TypedDict):
    """What a store keeps in a checkpoint (:meth:`Store.state`): tensors and numbers only, so
    that ``torch.load(weights_only=True)`` reads it back; checked as its annotations say when a
    checkpoint is read (:func:`quarl.actorq.snapshot.restore`)."""

    size: Count
    """Items held (an unroll queue keeps none: 0)."""
    data: NotRequired[dict[str, torch.Tensor] | None]
    """A replay's arrays by transition field, ``capacity`` rows each; None while empty."""
    cursor: NotRequired[Count]
    """A replay's next slot to write."""
    tree: NotRequired[torch.Tensor]
    """Prioritized replay's sum tree of priorities."""
    max_priority: NotRequired[Annotated[float, Field(ge=0)]]
    """Prioritized replay's largest priority so far (new items get it)."""


class Replay:
    """Uniform replay over a fixed-size ring of transitions."""

    def __init__(self, capacity: int, seed: int = 0) -> None:
        self.capacity = capacity
        self.data: dict[str, np.ndarray] | None = None
        """One array per transition field, ``capacity`` rows each."""
        self.size = 0
        self.cursor = 0
        self.rng = np.random.default_rng(seed)

    def insert(self, batch: Batch) -> int:
        n = len(batch)
        arrays = batch.transitions()
        if self.data is None:
            self.data = {k: np.zeros((self.capacity, *v.shape[1:]), dtype=v.dtype) for k, v in arrays.items()}
        idx = (self.cursor + np.arange(n)) % self.capacity
        for k, v in arrays.items():
            self.data[k][idx] = v
        self.cursor = int((self.cursor + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)
        return n

    def sample(self, batch_size: int) -> Batch:
        if self.data is None or self.size == 0:
            raise ValueError("cannot sample from an empty replay")
        idx = self.rng.integers(0, self.size, batch_size)
        return Batch(**{k: v[idx] for k, v in self.data.items()})

    def state(self) -> ReplayState:
        """Tensors and numbers only: a checkpoint loads with ``torch.load(weights_only=True)``."""
        data = None if self.data is None else {k: torch.from_numpy(v) for k, v in self.data.items()}
        return {"data": data, "size": self.size, "cursor": self.cursor}

    def load_state(self, state: ReplayState) -> None:
        data = state["data"]
        self.data = None if data is None else {k: v.numpy() for k, v in data.items()}
        self.size, self.cursor = int(state["size"]), int(state["cursor"])


class SumTree:
    """Sums of a power-of-two array of leaves, updated and searched a whole batch at a time
    (one numpy operation per tree level)."""

    def __init__(self, capacity: int) -> None:
        self.leaves = 1 << max(0, (capacity - 1).bit_length())
        self.tree = np.zeros(2 * self.leaves)

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def get(self, idx: np.ndarray) -> np.ndarray:
        return self.tree[idx + self.leaves]

    def set(self, idx: np.ndarray, values: np.ndarray) -> None:
        pos = np.asarray(idx, dtype=np.int64) + self.leaves
        self.tree[pos] = values
        pos = np.unique(pos // 2)
        while pos[0] >= 1:  # every position in pos is at the same depth
            self.tree[pos] = self.tree[2 * pos] + self.tree[2 * pos + 1]
            pos = np.unique(pos // 2)

    def find(self, targets: np.ndarray) -> np.ndarray:
        """For each target in [0, total): the leaf whose prefix-sum interval holds it."""
        pos = np.ones(len(targets), dtype=np.int64)
        rest = np.asarray(targets, dtype=np.float64).copy()
        while pos[0] < self.leaves:
            left = self.tree[2 * pos]
            right = rest >= left
            rest = np.where(right, rest - left, rest)
            pos = 2 * pos + right
        return pos - self.leaves


class PrioritizedReplay(Replay):
    """Proportional prioritized replay (Schaul et al., 2016). Item i is drawn with
    probability ``p_i^alpha / sum_j p_j^alpha``; a batch carries ``index`` (to send new
    priorities back with :meth:`update_priorities`) and ``weight``, the importance weight
    ``(size * P(i))^-beta`` divided by the batch's largest. New items get the largest
    priority seen so far, so each is likely to be replayed at least once."""

    def __init__(self, capacity: int, seed: int = 0, priority_exponent: float = 0.6,
                 importance_exponent: float = 0.4) -> None:
        super().__init__(capacity, seed)
        self.alpha, self.beta = priority_exponent, importance_exponent
        self.tree = SumTree(capacity)
        self.max_priority = 1.0

    def insert(self, batch: Batch) -> int:
        start = self.cursor
        n = super().insert(batch)
        self.tree.set((start + np.arange(n)) % self.capacity, np.full(n, self.max_priority**self.alpha))
        return n

    def sample(self, batch_size: int) -> Batch:
        if self.data is None or self.size == 0:
            raise ValueError("cannot sample from an empty replay")
        total = self.tree.total
        # stratified: one draw in each of batch_size equal slices of the total mass
        targets = (np.arange(batch_size) + self.rng.random(batch_size)) * (total / batch_size)
        idx = np.minimum(self.tree.find(np.minimum(targets, np.nextafter(total, 0))), self.size - 1)
        probs = self.tree.get(idx) / total
        weight = (self.size * probs) ** -self.beta
        rows = Batch(**{k: v[idx] for k, v in self.data.items()})
        return replace(rows, weight=(weight / weight.max()).astype(np.float32), index=idx)

    def update_priorities(self, idx: np.ndarray, priorities: np.ndarray) -> None:
        p = np.abs(np.asarray(priorities, dtype=np.float64)) + 1e-6  # never zero: every item stays reachable
        self.max_priority = max(self.max_priority, float(p.max()))
        self.tree.set(idx, p**self.alpha)

    def state(self) -> ReplayState:
        state = super().state()
        state["tree"], state["max_priority"] = torch.from_numpy(self.tree.tree), float(self.max_priority)
        return state

    def load_state(self, state: ReplayState) -> None:
        super().load_state(state)
        self.tree.tree, self.max_priority = state["tree"].numpy(), float(state["max_priority"])


@dataclass
class RateLimiter:
    """Reverb's SampleToInsertRatio: keeps ``samples / inserts`` near
    ``samples_per_insert`` once ``min_size`` items are in.

    With ``diff = inserts * samples_per_insert - samples``, sampling is allowed while
    ``inserts >= min_size`` and ``diff >= min_diff``; inserting while ``diff <= max_diff``,
    where ``min_diff / max_diff = min_size * samples_per_insert -/+ error_buffer``. So a
    faster actor fleet lets the learner take more steps per second, and actors wait when
    the learner falls behind (learning stays at the same replay ratio)."""

    samples_per_insert: float
    min_size: int
    error_buffer: float
    inserts: int = 0
    samples: int = 0

    @classmethod
    def from_tolerance(cls, samples_per_insert: float, min_size: int, tolerance: float) -> RateLimiter:
        return cls(samples_per_insert, min_size, tolerance * samples_per_insert * min_size)

    @property
    def diff(self) -> float:
        return self.inserts * self.samples_per_insert - self.samples

    @property
    def min_diff(self) -> float:
        return self.min_size * self.samples_per_insert - self.error_buffer

    @property
    def max_diff(self) -> float:
        return self.min_size * self.samples_per_insert + self.error_buffer

    def can_sample(self, n: int = 1) -> bool:
        """May ``n`` items be sampled now?"""
        return self.inserts >= self.min_size and self.diff - n >= self.min_diff

    def can_insert(self, n: int = 1) -> bool:
        """May ``n`` items be inserted now?"""
        if self.inserts + n <= self.min_size:
            return True
        return self.diff + n * self.samples_per_insert <= self.max_diff

    def inserted(self, n: int) -> None:
        self.inserts += n

    def sampled(self, n: int) -> None:
        self.samples += n


@dataclass(frozen=True)
class Unroll:
    """IMPALA's unit: ``U`` unrolls of ``T`` consecutive steps each (arrays ``[U, T, ...]``),
    as an actor played them with its own policy mu."""

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    discount: np.ndarray
    """gamma, or 0 where the step ended the episode at a terminal state."""
    cont: np.ndarray
    """1 where the episode goes on to the next step of the unroll (0 at a terminal or a truncation)."""
    next_obs: np.ndarray
    behaviour: np.ndarray
    """The actor's network output at each step (logits, or the Gaussian's mean): mu itself,
    so the learner has mu's log-probability and its KL to pi on the same states."""
    version: np.ndarray
    """The weight version the actor acted with, one per unroll: the policy lag."""

    def __len__(self) -> int:
        """Env steps held."""
        return int(self.reward.size)

    @property
    def unrolls(self) -> int:
        return int(self.reward.shape[0])


def stack_unrolls(steps: list[tuple], length: int) -> Unroll | None:
    """``steps`` (obs, action, reward, discount, cont, next_obs, behaviour, version) cut into
    unrolls of ``length``, each with the oldest version it acted with; a tail shorter than
    that is dropped (the actor runs whole unrolls)."""
    n = len(steps) // length * length
    if n == 0:
        return None
    obs, action, reward, discount, cont, next_obs, behaviour, versions = zip(*steps[:n], strict=True)

    def cut(values: tuple, dtype: type | None = np.float32) -> np.ndarray:
        array = np.asarray(values, dtype=dtype)
        return array.reshape(n // length, length, *array.shape[1:])

    return Unroll(cut(obs), cut(action, None), cut(reward), cut(discount), cut(cont), cut(next_obs), cut(behaviour),
                  cut(versions, np.int64).min(axis=1))


class UnrollQueue:
    """First in, first out: each unroll is learned from once, as IMPALA does (``sample``
    takes the oldest ``batch_size // T`` unrolls). Bounded: actors wait (the limiter) when
    the learner falls behind, which bounds the policy lag."""

    def __init__(self, capacity_steps: int, seed: int = 0) -> None:
        self.capacity = capacity_steps
        self.items: deque[Unroll] = deque()
        self.size = 0
        """Env steps queued."""

    def insert(self, unroll: Unroll) -> int:
        for u in range(unroll.unrolls):
            one = Unroll(**{k: v[u : u + 1] for k, v in unroll.__dict__.items()})
            self.items.append(one)
            self.size += len(one)
        return len(unroll)

    def sample(self, batch_size: int) -> Unroll:
        if not self.items:
            raise ValueError("cannot sample from an empty unroll queue")
        length = self.items[0].reward.shape[1]
        taken = [self.items.popleft() for _ in range(min(len(self.items), max(1, batch_size // length)))]
        self.size -= sum(len(u) for u in taken)
        return Unroll(**{k: np.concatenate([getattr(u, k) for u in taken]) for k in Unroll.__dataclass_fields__})

    def state(self) -> ReplayState:
        """Nothing kept across a resume: queued unrolls were played by weights that are gone."""
        return {"size": 0}

    def load_state(self, state: ReplayState) -> None:
        self.items.clear()
        self.size = 0


@dataclass
class QueueLimiter:
    """The rate limiter of an :class:`UnrollQueue` (the interface of :class:`RateLimiter`):
    the learner samples once a batch is queued; actors insert while the queue has room."""

    queue: UnrollQueue
    batch_size: int
    inserts: int = 0
    samples: int = 0
    samples_per_insert: float = 1.0

    def can_sample(self, n: int = 1) -> bool:
        return self.queue.size >= max(n, 1) and bool(self.queue.items)

    def can_insert(self, n: int = 1) -> bool:
        return self.queue.size + n <= self.queue.capacity

    def inserted(self, n: int) -> None:
        self.inserts += n

    def sampled(self, n: int) -> None:
        self.samples += n


class Store(Protocol):
    """What actors fill and the learner samples: a :class:`Replay` (or its prioritized
    variant) of transitions, or an :class:`UnrollQueue` of unrolls."""

    size: int

    def insert(self, item: Any, /) -> int: ...

    def sample(self, batch_size: int, /) -> Batch | Unroll: ...

    def state(self) -> ReplayState: ...

    def load_state(self, state: ReplayState, /) -> None: ...


class Limiter(Protocol):
    """The rate limiter between inserts and samples (:class:`RateLimiter`, :class:`QueueLimiter`)."""

    inserts: int
    samples: int

    def can_sample(self, n: int = 1) -> bool: ...

    def can_insert(self, n: int = 1) -> bool: ...

    def inserted(self, n: int) -> None: ...

    def sampled(self, n: int) -> None: ...
