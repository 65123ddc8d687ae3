"""Measured error rates of quarl's verdict against a BCa bootstrap and a t-interval, on
pools of real paired returns (``tests/data/return_pools``, made by
``benchmarks/make_return_pools.py``).

For each pool (an agent at fp32 and one quantized precision, 500+ paired episodes) and each
method, N paired episodes are drawn with replacement, many times, and the harness counts
how often the 95 % interval holds the pool's E (coverage) and how often a decided verdict
is wrong (*keeps* where the pool's E is above 5 %, *loses* where below), at N = 1, 2, 3, 5,
10, 20, 50, 100 and under the deciding schedule (20 episodes, doubled while undecided, up
to 640: the looks ``quarl ptq`` makes by default). See :mod:`quarl.verdict.coverage`.

Run: ``.venv/bin/python benchmarks/bench_verdict_coverage.py`` (about 3 minutes: 1000 draws
per cell, the bootstrap 200; ``--quick`` for a smoke run). Writes
``results/verdict-coverage/coverage.{md,csv,json}`` and prints the table; a cell under the
acceptance line (coverage below 93 % or more than 5 % of draws decided wrongly, beyond
Monte Carlo error) is marked ``*``.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

from quarl.evaluation.reports import write_rows
from quarl.verdict.coverage import METHODS, SIZES, fixed_n, load_pools, sequential

POOLS = Path(__file__).resolve().parents[1] / "tests" / "data" / "return_pools"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=1000, help="draws per cell (the bootstrap: a fifth)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--pools", type=Path, default=POOLS)
    parser.add_argument("--out", type=Path, default=None,
                        help="folder of coverage.{md,csv,json} (default results/verdict-coverage; --quick: a temporary one)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 40 draws, two pools, N up to 20")
    args = parser.parse_args()
    pools = load_pools(args.pools)
    sizes: tuple[int, ...] = SIZES
    cap = 640
    if args.quick:
        args.draws, pools, sizes, cap = 40, pools[:2], (1, 5, 20), 80
        args.out = args.out or Path(tempfile.mkdtemp(prefix="quarl-coverage-"))  # the docs' table stays as made
    args.out = args.out or Path("results/verdict-coverage")
    methods = args.methods.split(",")
    rows = []
    started = time.perf_counter()
    for pool in pools:
        for method in methods:
            draws = args.draws if method != "bca" else max(args.draws // 5, 20)
            margin = 2 * math.sqrt(0.05 * 0.95 / draws)  # two Monte Carlo standard errors at the 5 % line
            row: dict[str, object] = {"pool": f"{pool.name} {pool.precision}", "E%": round(pool.e, 2), "method": method}
            cells = [(str(n), fixed_n(pool, method, n, draws, seed=n)) for n in sizes]
            cells.append(("seq", sequential(pool, method, 20, cap, draws, seed=1)))
            for name, r in cells:
                bad = r.coverage < 0.93 - margin or r.wrong > 0.05 + margin
                row[f"N={name}"] = f"{100 * r.coverage:.0f} / {100 * r.wrong:.0f}" + (" *" if bad else "")
            seq = cells[-1][1]
            row["seq decided%"] = round(100 * seq.decided)
            row["seq episodes"] = round(seq.episodes)
            rows.append(row)
            print(f"{time.perf_counter() - started:6.0f} s  {row['pool']:<28} {method:<4} "
                  + "  ".join(f"{k[2:]}:{v}" for k, v in row.items() if k.startswith("N=")), flush=True)
    write_rows(rows, args.out, "coverage")
    print(f"\ncoverage % / wrong decided % per N (95 % intervals; * under 93 % coverage or over 5 % wrong "
          f"beyond Monte Carlo error); seq: 20 episodes doubled to {cap} while undecided")
    print((args.out / "coverage.md").read_text())


if __name__ == "__main__":
    main()
