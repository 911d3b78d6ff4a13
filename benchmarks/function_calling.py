"""FunctionCalling-v0 speed and snapshot cost, per BFCL category.

For every entry of each category the ground truth is replayed through the env as a
policy sends it (per user turn one action with all the turn's calls, then a reply),
taking a snapshot after every step as the rollout runner does. Reported per category:

- steps/s: env steps per second of these scripted episodes, BFCL's checker included;
- snapshot: mean time of `env.snapshot()` after a step (instances a step did not touch
  reuse their pickle) and of a cold snapshot (every instance pickled);
- restore: mean time of `env.restore(snapshot)` (every instance unpickled);
- state KiB: mean pickled size of the instances.

Then the memory of 10,000 snapshots of the long-context entry with the largest state,
measured with tracemalloc: as taken along replays (unchanged instances share their
pickle) and all cold (no sharing).

Run: python benchmarks/function_calling.py [--entries 200] [--snapshots 10000]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import tracemalloc
from collections.abc import Sequence

from trace_gym.env import Snapshot
from trace_gym.envs import _bfcl
from trace_gym.envs.function_calling import CATEGORIES, FunctionCallingEnv, ground_truth_actions


def state_bytes(snap: Snapshot) -> int:
    """Pickled size of the instances a snapshot holds."""
    return sum(len(blob) for _, blob in snap.state[-1][-1])


def cold_snapshot(env: FunctionCallingEnv) -> Snapshot:
    """A snapshot that pickles every instance anew (drops the env's reuse cache)."""
    env._pickled.clear()
    return env.snapshot()


def category_row(category: str, entries: int) -> dict[str, float]:
    env = FunctionCallingEnv(categories=category)
    ids = env.task_ids[:entries]
    scripts = {task_id: ground_truth_actions(task_id) for task_id in ids}
    steps, successes = 0, 0
    start = time.perf_counter()
    for task_id in ids:
        env.reset(options={"task_id": task_id})
        for action in scripts[task_id]:
            _, reward, terminated, _, _ = env.step(action)
            steps += 1
        successes += int(terminated and reward == 1.0)
    replay_s = time.perf_counter() - start

    warm, cold, restore, sizes = [], [], [], []
    for task_id in ids:
        env.reset(options={"task_id": task_id})
        snaps = []
        for action in scripts[task_id][:-1]:  # the last step ends the episode
            env.step(action)
            t0 = time.perf_counter()
            snaps.append(env.snapshot())
            warm.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            cold_snapshot(env)
            cold.append(time.perf_counter() - t0)
            sizes.append(state_bytes(snaps[-1]))
        for snap in snaps:
            t0 = time.perf_counter()
            env.restore(snap)
            restore.append(time.perf_counter() - t0)
    return {
        "entries": len(ids),
        "passed": successes,
        "steps": steps,
        "steps_per_s": steps / replay_s,
        "snapshot_us": 1e6 * statistics.fmean(warm),
        "cold_snapshot_us": 1e6 * statistics.fmean(cold),
        "restore_us": 1e6 * statistics.fmean(restore),
        "state_kib": statistics.fmean(sizes) / 1024,
    }


def largest_long_context_entry() -> str:
    env = FunctionCallingEnv(categories="long_context")
    sizes = {}
    for task_id in env.task_ids:
        env.reset(options={"task_id": task_id})
        sizes[task_id] = state_bytes(env.snapshot())
    return max(sizes, key=lambda k: sizes[k])


def snapshot_memory(task_id: str, count: int, *, cold: bool) -> tuple[float, float]:
    """MiB held by `count` snapshots taken along replays of `task_id`, and the seconds taken."""
    env = FunctionCallingEnv(categories="long_context")
    actions = ground_truth_actions(task_id)[:-1]
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    start = time.perf_counter()
    snaps: list[Snapshot] = []
    while len(snaps) < count:
        env.reset(options={"task_id": task_id})
        snaps.append(cold_snapshot(env) if cold else env.snapshot())
        for action in actions:
            if len(snaps) >= count:
                break
            env.step(action)
            snaps.append(cold_snapshot(env) if cold else env.snapshot())
    seconds = time.perf_counter() - start
    del env
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert len(snaps) == count
    return held / 2**20, seconds


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--entries", type=int, default=200, help="entries per category (max 200)")
    parser.add_argument("--snapshots", type=int, default=10_000, help="snapshots in the memory test")
    args = parser.parse_args(argv)
    print(f"bfcl-eval {_bfcl.BFCL_VERSION}; ground-truth replays, snapshot after every step\n")
    header = (
        f"{'category':<13}{'entries':>8}{'passed':>8}{'steps':>7}{'steps/s':>9}"
        f"{'snapshot µs':>13}{'cold snap µs':>14}{'restore µs':>12}{'state KiB':>11}"
    )
    print(header)
    print("-" * len(header))
    for category in CATEGORIES:
        r = category_row(category, args.entries)
        print(
            f"{category:<13}{r['entries']:>8.0f}{r['passed']:>8.0f}{r['steps']:>7.0f}{r['steps_per_s']:>9.0f}"
            f"{r['snapshot_us']:>13.1f}{r['cold_snapshot_us']:>14.1f}{r['restore_us']:>12.1f}"
            f"{r['state_kib']:>11.1f}"
        )
    task_id = largest_long_context_entry()
    print(f"\nMemory of {args.snapshots:,} snapshots of {task_id} (largest long-context state), tracemalloc:")
    for cold in (False, True):
        mib, seconds = snapshot_memory(task_id, args.snapshots, cold=cold)
        how = "all cold (no sharing)" if cold else "as taken along replays"
        per = 1024 * mib / args.snapshots
        print(f"  {how:<24} {mib:8.1f} MiB  ({per:.1f} KiB each; taken in {seconds:.1f} s)")
    print(
        f"\nReproduce: python benchmarks/function_calling.py --entries {args.entries} --snapshots {args.snapshots}"
    )


if __name__ == "__main__":
    main()
