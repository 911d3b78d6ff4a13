"""Wall time of the Stage 1 and Stage 2 solvers on one core.

Target (DESIGN section 7): `allocate_roots` at B = 1024 candidates, M = 2048, Mmax = 16 in
under 50 ms on one core. Also times 4x that size, `allocate_prefixes` on a pooled Stage 2 of
comparable size (2048 rollouts x 8 prefixes, N = 4), and the straightforward multiple-choice
knapsack DP (values only, no backtracking) as the reference the exact solver replaces.

Run: python benchmarks/solver_speed.py [--repeats 7] [--seed 0] [--no-dp]
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from trace_gym.allocation import allocate_prefixes, allocate_roots, root_value

TARGET_MS = 50.0


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    """Best wall time of `repeats` calls, in milliseconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def dp_value(v: np.ndarray, total: int, m_max: int, min_group: int = 2) -> float:
    """The O(B·M·Mmax) knapsack DP over total rollouts, without choice tables."""
    options = np.array([0, *range(min_group, m_max + 1)])
    values = root_value(v[:, None], options[None, :])
    best = np.full(total + 1, -np.inf)
    best[0] = 0.0
    for row in values:
        new = best + row[0]
        for m, value in zip(options[1:], row[1:], strict=True):
            np.maximum(new[m:], best[: total + 1 - m] + value, out=new[m:])
        best = new
    return float(best[total])


def pin_to_one_core() -> str:
    """Pin this process to one CPU (Linux); say which, or why not."""
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned (no os.sched_setaffinity on this platform)"
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return f"pinned to CPU {cpu}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per case; the best is reported")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random probabilities")
    parser.add_argument("--no-dp", action="store_true", help="skip the (slow) DP reference row")
    args = parser.parse_args()
    pinned = pin_to_one_core()
    rng = np.random.default_rng(args.seed)

    rows: list[tuple[str, float, str]] = []
    for b, m, m_max in [(1024, 2048, 16), (4096, 8192, 16)]:
        v = rng.random(b)
        ms = best_ms(partial(allocate_roots, v, m, m_max), args.repeats)
        target = f"< {TARGET_MS:.0f} ms" if b == 1024 else "-"
        rows.append((f"allocate_roots B={b} M={m} Mmax={m_max}", ms, target))
    if not args.no_dp:
        v = rng.random(1024)
        ms = best_ms(partial(dp_value, v, 2048, 16), max(1, args.repeats // 3))
        rows.append(("DP reference B=1024 M=2048 Mmax=16 (values only)", ms, "-"))
    for n, budget in [(2048 * 8, 2048 * 4), (8192 * 8, 8192 * 4)]:
        v = rng.random(n)
        r = (rng.random(n) < v).astype(np.float64)
        ms = best_ms(partial(allocate_prefixes, v, r, budget), args.repeats)
        rows.append((f"allocate_prefixes n={n} budget={budget}", ms, "-"))

    width = max(len(case) for case, _, _ in rows)
    print(f"solver wall time, best of {args.repeats}, {pinned}, numpy {np.__version__}")
    print(f"{'case':<{width}}  {'ms':>9}  target")
    for case, ms, target in rows:
        print(f"{case:<{width}}  {ms:9.2f}  {target}")
    base, large = rows[0][1], rows[1][1]
    print(f"ratio 4x size / base: {large / base:.1f}x")
    if not args.no_dp:
        print(f"ratio DP reference / allocate_roots (base): {rows[2][1] / base:.0f}x")
    verdict = "meets" if base < TARGET_MS else "MISSES"
    print(f"allocate_roots at the base size {verdict} the {TARGET_MS:.0f} ms target.")
    print("reproduce: " + shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]))


if __name__ == "__main__":
    main()
