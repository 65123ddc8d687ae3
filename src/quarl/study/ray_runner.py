"""Study cells as Ray tasks (one CPU each, spread over a cluster's nodes); the driver
stores each record as its task finishes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from quarl.core.errors import QuarlError
from quarl.core.ray_cluster import start_ray

log = logging.getLogger(__name__)

Record = TypeVar("Record")


def run_on_ray(cells: Sequence[Any], evaluate: Callable[[Any], Record], workers: int, address: str | None,
               on_record: Callable[[Record], None]) -> None:
    import ray

    owns = start_ray(address, workers)
    try:
        task = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(evaluate)
        pending = {task.remote(cell): cell for cell in cells}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            cell = pending.pop(done[0])
            try:
                record = ray.get(done[0])
            except ray.exceptions.RayTaskError as exc:
                cause = exc.cause if isinstance(exc.cause, QuarlError) else exc
                raise QuarlError(f"cell {cell.precision} seed {cell.seed} of {cell.checkpoint} failed: "
                                 f"{str(cause).splitlines()[-1]}") from None
            on_record(record)
    finally:
        if owns:
            ray.shutdown()
