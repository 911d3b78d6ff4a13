"""The runner's own cost with a free policy: turns/s, snapshot/restore time, snapshot memory.

With `SimulatedPolicy` generation costs nothing, so what this measures is the
framework itself: batching, env stepping, snapshots and tree building. Targets
(issue "Core"): >= 20,000 simulated turns/s on one core, snapshot + restore
< 20 µs, 10,000 snapshots < 20 MB.

Run: python benchmarks/bench_runner.py [--tasks 1000] [--group 8] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import timeit
import tracemalloc

import gymnasium
import numpy as np

import trace_gym
from trace_gym import Job, RolloutRunner, SimulatedPolicy
from trace_gym.envs.synthetic import SyntheticTreeEnv, advance_call

ENV_ID = "trace_gym/SyntheticTree-v0"


def turns_per_second(tasks: int, group: int, repeats: int) -> list[float]:
    """End-to-end turns/s of each of `repeats` runner.run calls on `tasks` jobs of `group` rollouts.

    A first, unmeasured run fills the env pool (its envs are then reused through restore).
    """
    runner = RolloutRunner(ENV_ID, SimulatedPolicy(), seed=0, max_live=1024)
    jobs = [Job(t, group) for t in runner.tasks[:tasks]]
    runner.run(jobs)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        trees = runner.run(jobs)
        seconds = time.perf_counter() - start
        rates.append(sum(len(t.nodes) - 1 for t in trees) / seconds)
        del trees
        gc.collect()
    return rates


def snapshot_restore_us(wrapped: bool) -> tuple[float, float]:
    """Microseconds per snapshot and per restore of SyntheticTree after 3 turns."""
    env = gymnasium.make(ENV_ID)
    env.reset(seed=0, options={"index": 0})
    for k in range(3):
        env.step(advance_call(k * 1000 + 123))
    target = env if wrapped else env.unwrapped
    brancher = trace_gym.env.Brancher(target)
    n = 50_000
    snap_s = min(timeit.repeat(brancher.snapshot, number=n, repeat=3)) / n
    snap = brancher.snapshot()
    restore_s = min(timeit.repeat(lambda: brancher.restore(snap), number=n, repeat=3)) / n
    return snap_s * 1e6, restore_s * 1e6


def snapshot_memory_mb(count: int) -> float:
    """Memory (MB, tracemalloc) retained by `count` snapshots of distinct states, one per turn."""
    env = SyntheticTreeEnv()
    rng = np.random.default_rng(0)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    snaps: list[trace_gym.Snapshot] = []
    episode = 0
    while len(snaps) < count:
        env.reset(seed=episode, options={"index": episode % len(env.tasks)})
        episode += 1
        snaps.append(env.snapshot())
        done = False
        while not done and len(snaps) < count:
            _, _, term, trunc, _ = env.step(env.example_action(rng))
            done = term or trunc
            snaps.append(env.snapshot())
    env.close()
    del env
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(snaps) == count
    return held / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--snapshots", type=int, default=10_000)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as the target says
    rates = turns_per_second(args.tasks, args.group, args.repeats)
    best, median = max(rates), float(np.median(rates))
    bare = snapshot_restore_us(wrapped=False)
    wrapped = snapshot_restore_us(wrapped=True)
    memory = snapshot_memory_mb(args.snapshots)
    rows = [
        (f"turns/s end to end (best of {len(rates)})", f"{best:,.0f}", ">= 20,000", best / 20_000),
        (f"turns/s end to end (median of {len(rates)})", f"{median:,.0f}", ">= 20,000", median / 20_000),
        ("snapshot + restore, bare env (µs)", f"{bare[0]:.2f} + {bare[1]:.2f}", "< 20", 20 / sum(bare)),
        (
            "snapshot + restore, via make (µs)",
            f"{wrapped[0]:.2f} + {wrapped[1]:.2f}",
            "< 20",
            20 / sum(wrapped),
        ),
        (f"memory of {args.snapshots:,} snapshots (MB)", f"{memory:.2f}", "< 20", 20 / memory),
    ]
    print(f"{'measure':<38} {'value':>16} {'target':>10} {'margin x':>9}")
    for name, value, target, margin in rows:
        print(f"{name:<38} {value:>16} {target:>10} {margin:>9.2f}")
    print(f"\n({args.tasks} tasks x {args.group} rollouts per run, one core; margin > 1 meets the target)")
    print("reproduce: python " + " ".join([sys.argv[0], *sys.argv[1:]]))


if __name__ == "__main__":
    main()
