"""Evaluation on every core: episodes split over worker processes.

Each episode is reset with its own seed and the policy is stateless, so an episode's
return and length do not depend on which process plays it or beside which others: the
episodes are cut into contiguous chunks (``seed + start .. seed + start + count - 1``),
each chunk is played by :func:`quarl.evaluation.episodes.evaluate` in a worker, and the results are
put back in episode order, equal to a serial run's (tested). Each worker reports every
episode as it ends on a queue it was given at start, so a progress bar moves per episode
while the chunks run.

Workers are started once per process (``forkserver``, with torch, ONNX Runtime and quarl
imported once in the server, so a new worker costs a fork, not an import) and reused by
every later evaluation; each runs one thread (``OMP_NUM_THREADS=1``). The policy travels
once per evaluation as a file that each worker reads once (an ONNX Runtime session is
rebuilt from its model bytes), not once per chunk.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import itertools
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from quarl.core import lifeline
from quarl.core.errors import QuarlError
from quarl.envs import EnvSpec, gym_packages, make_env
from quarl.evaluation.episodes import EvalResult
from quarl.evaluation.episodes import evaluate as evaluate_serial
from quarl.policies.base import Policy

PROGRESS_POLL_S = 0.2
"""How often the caller looks for finished episodes while the workers play."""
_evaluations = itertools.count()

_pool: tuple[int, ProcessPoolExecutor, Any] | None = None
_worker_policies: dict[str, Policy] = {}
_worker_envs: dict[str, list] = {}
_finished: Any = None
"""In a worker: the queue it reports each finished episode on, ``(evaluation, episode,
return)``, so the caller's progress bar moves per episode, not per chunk."""


PARENT_POLL_S = 0.5
"""How often a worker checks that the process that started it is still alive."""


def _die_with(parent: int) -> None:
    """Exit this worker once ``parent`` (the quarl process) is gone: a worker's own parent is
    the fork server, not quarl (without this both played on, owned by init, after ``kill -9``
    of ``quarl ptq --workers 2``; with it, and the fork server's lifeline, nothing quarl
    started outlives it by more than a second or two, the resource tracker included: it
    exits, after removing what the dead left, once its last client is gone)."""
    import threading

    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            try:
                os.kill(parent, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:  # pragma: no cover - the pid now belongs to another user's process
                os._exit(1)

    threading.Thread(target=watch, name="quarl-parent-watch", daemon=True).start()


def _start_worker(finished: Any, parent: int) -> None:
    global _finished
    _finished = finished
    # the kernel ends a worker with the fork server (which ends with quarl, see
    # quarl.core.lifeline); polling quarl itself is the guard where that signal is missing
    lifeline.parent_death_signal(signal.SIGTERM)
    _die_with(parent)
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    from quarl.core import quiet

    quiet.install()


def _executor(workers: int) -> ProcessPoolExecutor:
    global _pool
    if _pool is not None and _pool[0] == workers:
        return _pool[1]
    if _pool is not None:
        _pool[1].shutdown(cancel_futures=True)
    context = multiprocessing.get_context("forkserver")
    # the lifeline first: the server ends with quarl even while it imports torch
    context.set_forkserver_preload(["quarl.core.lifeline", "torch", "onnxruntime", "gymnasium",
                                    "quarl.evaluation.parallel"])
    from multiprocessing import forkserver

    with lifeline.spawning_fork_server():  # started here, where this thread is known
        forkserver.ensure_running()
    finished = context.SimpleQueue()
    _pool = (workers, ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                                          initargs=(finished, os.getpid())), finished)
    return _pool[1]


def warm_up(workers: int) -> None:
    """Start the workers now, in the background (the fork server imports torch once), so
    they are ready by the first evaluation."""
    executor = _executor(workers)
    with _main_module_hidden():
        for _ in range(workers):
            executor.submit(os.getpid)


@atexit.register
def shutdown() -> None:
    """Stop the workers (also at exit)."""
    global _pool
    if _pool is not None:
        _pool[1].shutdown(cancel_futures=True)
        _pool = None


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Workers start without importing the caller's ``__main__``: they need only quarl, and a
    user's script without an ``if __name__ == "__main__"`` guard would otherwise run again
    in every worker (multiprocessing's spawn / forkserver re-import it)."""
    main = sys.modules.get("__main__")
    saved = [(k, main.__dict__[k]) for k in ("__file__", "__spec__") if main is not None and k in main.__dict__]
    if main is not None:
        main.__dict__.pop("__file__", None)
        main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


def _play_chunk(policy_file: str, digest: str, env_spec: EnvSpec, seed: int, start: int, count: int, n_envs: int,
                max_steps: int | None, evaluation: int, packages: tuple[str, ...] = ()
                ) -> tuple[int, np.ndarray, np.ndarray, list[str] | None]:
    if packages:  # custom envs (--gym-packages) registered in this worker too
        from quarl.envs import import_gym_packages

        import_gym_packages(packages)
    policy = _worker_policies.get(digest)
    if policy is None:
        _worker_policies.clear()  # one policy at a time: a worker never holds every precision's model
        policy = _worker_policies[digest] = pickle.loads(Path(policy_file).read_bytes())
    # a worker keeps its envs between chunks (a MuJoCo or Atari env takes longer to make than
    # an episode to play); every episode starts with a seeded reset, as in a serial run
    key = repr(env_spec)
    if key not in _worker_envs:
        for old in _worker_envs.pop(next(iter(_worker_envs)), []) if _worker_envs else []:
            old.close()
        _worker_envs[key] = []
    envs = _worker_envs[key]
    while len(envs) < min(n_envs, count):
        envs.append(make_env(env_spec))

    def report(episode: int, value: float) -> None:
        if _finished is not None:
            _finished.put((evaluation, start + episode, float(value)))

    result = evaluate_serial(policy, env_spec, episodes=count, seed=seed + start, max_steps=max_steps,
                             envs=envs[: min(n_envs, count)], on_episode=report)
    return start, result.returns, result.lengths, result.endings


def _drain(evaluation: int, report: Callable[[int, float], None]) -> None:
    """Report the episodes the workers have finished so far (messages of an earlier,
    abandoned evaluation are dropped)."""
    finished = _pool[2] if _pool is not None else None
    while finished is not None and not finished.empty():
        which, episode, value = finished.get()
        if which == evaluation:
            report(episode, value)


def chunks(episodes: int, workers: int, n_envs: int = 32) -> list[tuple[int, int]]:
    """Contiguous ``(start, count)`` pieces of ``range(episodes)``, sizes within one of each
    other: about ``n_envs`` episodes each (a worker plays a piece's episodes side by side,
    their policy calls batched, so a piece much smaller than ``n_envs`` wastes that) and a
    multiple of ``workers`` pieces, so that the workers finish together."""
    rounds = max(1, round(episodes / (workers * max(1, n_envs))))
    n = min(episodes, workers * rounds)
    bounds = np.linspace(0, episodes, n + 1).round().astype(int)
    return [(int(a), int(b - a)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def evaluate(policy: Policy, env_spec: EnvSpec, episodes: int = 20, seed: int = 0, n_envs: int = 32,
             max_steps: int | None = None, on_episode: Callable[[int, float], None] | None = None,
             workers: int = 1) -> EvalResult:
    """:func:`quarl.evaluation.episodes.evaluate` with the episodes split over ``workers`` processes
    (one process plays them all when ``workers`` is 1)."""
    if workers <= 1 or episodes <= 1:
        return evaluate_serial(policy, env_spec, episodes=episodes, seed=seed, n_envs=n_envs, max_steps=max_steps,
                               on_episode=on_episode)
    # the engine acts; the network beside it (an int mode's PyTorch reference) stays here
    acting = dataclasses.replace(policy, network=nn.Sequential())
    try:
        payload = pickle.dumps(acting, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise QuarlError(f"a {policy.precision} policy cannot be sent to evaluation workers ({exc}): "
                         "use --workers 1") from None
    digest = hashlib.sha256(payload).hexdigest()
    folder = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    returns = np.zeros(episodes)
    lengths = np.zeros(episodes, dtype=np.int64)
    endings = [""] * episodes
    executor = _executor(workers)
    start_time = time.perf_counter()
    with tempfile.NamedTemporaryFile(prefix="quarl-policy-", suffix=".pkl", dir=folder) as fh:
        fh.write(payload)
        fh.flush()
        pending: set[Future] = set()
        evaluation = next(_evaluations)
        reported: set[int] = set()

        def report(episode: int, value: float) -> None:
            if on_episode is not None and episode not in reported:
                reported.add(episode)
                on_episode(episode, value)

        try:
            with _main_module_hidden():  # workers (and the fork server) may start during submit
                pending = {executor.submit(_play_chunk, fh.name, digest, env_spec, seed, start, count, n_envs,
                                           max_steps, evaluation, gym_packages())
                           for start, count in chunks(episodes, workers, n_envs)}
            while pending:
                done, pending = wait(pending, timeout=PROGRESS_POLL_S, return_when=FIRST_COMPLETED)
                _drain(evaluation, report)
                for future in done:
                    start, chunk_returns, chunk_lengths, chunk_endings = future.result()
                    returns[start : start + len(chunk_returns)] = chunk_returns
                    lengths[start : start + len(chunk_lengths)] = chunk_lengths
                    endings[start : start + len(chunk_endings)] = chunk_endings
                    for i, r in enumerate(chunk_returns):  # any the queue has not brought yet
                        report(start + i, float(r))
        except BrokenProcessPool:  # a worker killed (out of memory, a signal): the pool is not reusable
            shutdown()
            raise QuarlError("an evaluation worker died mid-episode (out of memory or killed): run again, or with "
                             "--workers 1") from None
        finally:
            for future in pending:
                future.cancel()
    return EvalResult(returns, lengths, time.perf_counter() - start_time, endings=endings)
