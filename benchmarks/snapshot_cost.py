"""Restore latency of a Python sandbox against prefix depth, and the round trip of `print(1)`.

A prefix of depth d is d cells, one of which sleeps 50 ms (a stand-in for real work); the rest
set a variable each. Restore strategies:

- replay: a fresh sandbox with no checkpoints replays the cell log (`checkpoints=0`);
- fork: the sandbox that took the checkpoint resumes from its forked copy-on-write interpreter;
- docker replay / docker fork: the same two in `DockerSandbox` (skipped without a Docker engine).

Each restore is followed by one cell that checks the state came back; the time is the restore alone
(median of `--repeats`). Targets: fork restore under 10 ms at any depth; `print(1)` under 5 ms in
ProcessSandbox.

Run: python benchmarks/snapshot_cost.py [--repeats 7] [--depths 1 4 16] [--no-docker]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from collections.abc import Callable

from trace_gym.errors import MissingDependencyError
from trace_gym.tools.sandbox import PythonSandbox, SandboxError, SandboxState, make_sandbox

FORK_TARGET_MS = 10.0
ROUND_TRIP_TARGET_MS = 5.0


def prefix(depth: int) -> list[str]:
    """`depth` cells; the first sleeps 50 ms."""
    return ["import time\ntime.sleep(0.05)\nv0 = 0", *(f"v{i} = v{i - 1} + 1" for i in range(1, depth))]


def median_ms(fn: Callable[[], object], repeats: int, after: Callable[[], object] | None = None) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        if after is not None:
            after()
    return statistics.median(times) * 1e3


def recorded_state(backend: str, depth: int) -> tuple[PythonSandbox, SandboxState]:
    box = make_sandbox(backend, timeout=10.0)
    for code in prefix(depth):
        result = box.run(code)
        assert result.error is None, result
    return box, box.checkpoint()


def check(box: PythonSandbox, depth: int) -> None:
    assert box.run(f"print(v{depth - 1})").stdout == f"{depth - 1}\n"


def fork_restore_ms(backend: str, depth: int, repeats: int) -> float:
    box, state = recorded_state(backend, depth)
    try:

        def restore() -> None:
            box.restore(state)

        def diverge() -> None:
            check(box, depth)
            box.run("v0 = -1")

        diverge()
        return median_ms(restore, repeats, diverge)
    finally:
        box.close()


def replay_restore_ms(backend: str, depth: int, repeats: int) -> float:
    source, state = recorded_state(backend, depth)
    source.close()
    box = make_sandbox(backend, timeout=10.0, checkpoints=0)
    try:
        box.run("pass")  # started: measure the replay, not the interpreter's start-up

        def restore() -> None:
            box.restore(state)

        def diverge() -> None:
            check(box, depth)
            box.run("v0 = -1")

        return median_ms(restore, repeats, diverge)
    finally:
        box.close()


def checkpoint_ms(backend: str, repeats: int) -> float:
    """Time of `checkpoint()` on a new state (it forks the interpreter), one cell deeper each time."""
    box = make_sandbox(backend, timeout=10.0, checkpoints=repeats + 1)
    try:
        box.run("import random\nvalues = list(range(1000))")
        times = []
        for index in range(repeats):
            box.run(f"x = {index}")
            start = time.perf_counter()
            box.checkpoint()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3
    finally:
        box.close()


def round_trip_ms(backend: str, repeats: int) -> float:
    box = make_sandbox(backend, timeout=10.0)
    try:
        box.run("print(1)")
        return median_ms(lambda: box.run("print(1)"), repeats * 10)
    finally:
        box.close()


def docker_available() -> str | None:
    try:
        make_sandbox("docker").close()
    except (SandboxError, MissingDependencyError) as exc:
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--no-docker", action="store_true")
    args = parser.parse_args(argv)

    backends = ["process"]
    why_not = "skipped (--no-docker)" if args.no_docker else docker_available()
    if why_not is None:
        backends.append("docker")
    probe = make_sandbox("process")
    isolation = probe.isolation
    probe.close()

    rows: list[tuple[str, list[float]]] = []
    for backend in backends:
        label = "process" if backend == "process" else "docker"
        rows.append((f"{label} replay", [replay_restore_ms(backend, d, args.repeats) for d in args.depths]))
        rows.append((f"{label} fork", [fork_restore_ms(backend, d, args.repeats) for d in args.depths]))
    trips = {backend: round_trip_ms(backend, args.repeats) for backend in backends}
    checkpoints = {backend: checkpoint_ms(backend, args.repeats) for backend in backends}

    print(f"Restore latency (ms, median of {args.repeats}); ProcessSandbox isolation: {isolation}")
    header = "| strategy | " + " | ".join(f"depth {d}" for d in args.depths) + " |"
    print(header)
    print("|" + "---|" * (len(args.depths) + 1))
    for name, values in rows:
        print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in values) + " |")
    print()
    print("Round trip of print(1) and cost of checkpoint() (ms, median):")
    print("| sandbox | print(1) | checkpoint() |")
    print("|---|---|---|")
    for backend, value in trips.items():
        print(f"| {backend} | {value:.2f} | {checkpoints[backend]:.1f} |")
    if why_not is not None:
        print(f"\nDocker: {why_not}")
    fork_worst = max(max(values) for name, values in rows if name == "process fork")
    print(
        f"\nfork restore worst {fork_worst:.1f} ms (target < {FORK_TARGET_MS:g} ms): "
        f"{'met' if fork_worst < FORK_TARGET_MS else 'MISSED'}; "
        f"print(1) {trips['process']:.2f} ms (target < {ROUND_TRIP_TARGET_MS:g} ms): "
        f"{'met' if trips['process'] < ROUND_TRIP_TARGET_MS else 'MISSED'}"
    )
    print(f"\nReproduce: python benchmarks/snapshot_cost.py {shlex.join(sys.argv[1:])}".rstrip())


if __name__ == "__main__":
    main()
