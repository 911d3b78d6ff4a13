"""Shared helpers for the sandbox tests: which backends run here, and process counting."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable

from trace_gym.errors import MissingDependencyError
from trace_gym.tools.sandbox import (
    DockerSandbox,
    ProcessSandbox,
    PythonSandbox,
    SandboxError,
    detect_isolation,
)


@functools.cache
def isolation_here() -> str:
    return detect_isolation()


NO_ISOLATION_REASON = (
    "no isolation primitive here (bubblewrap or user/mount/net namespaces): install bubblewrap with "
    "`bash scripts/setup_sandboxes.sh`; the fail-closed tests prove the sandbox refuses to start instead"
)


@functools.cache
def docker_unavailable() -> str | None:
    """Why DockerSandbox cannot run here, or None when it can."""
    try:
        DockerSandbox().close()
    except (SandboxError, MissingDependencyError) as exc:
        return f"{exc} (run `bash scripts/setup_sandboxes.sh` as root)"
    return None


def make(backend: str, **kwargs: object) -> PythonSandbox:
    if backend == "docker":
        return DockerSandbox(**kwargs)  # type: ignore[arg-type]
    return ProcessSandbox(**kwargs)  # type: ignore[arg-type]


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found += [int(x) for x in handle.read().split()]
        except OSError:
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def descendants(pid: int) -> list[int]:
    """Live (non-zombie) processes below `pid`, as the host sees them."""
    below: list[int] = []
    frontier = _children(pid)
    while frontier:
        current = frontier.pop()
        if _alive(current):
            below.append(current)
        frontier += _children(current)
    return below


def container_processes(container_id: str) -> list[int]:
    """Live host processes in the container's cgroup."""
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cgroup") as handle:
                if container_id in handle.read() and _alive(int(entry)):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def sandbox_processes(box: PythonSandbox) -> Callable[[], int]:
    """A counter of the live host processes below this test process (ProcessSandbox), or in any
    container the DockerSandbox has used so far (it starts a new one if its manager dies)."""
    if isinstance(box, DockerSandbox):
        seen: set[str] = set()

        def count() -> int:
            if box.container is not None:
                seen.add(box.container.id)
            return sum(len(container_processes(cid)) for cid in seen)

        return count
    return lambda: len(descendants(os.getpid()))


def settle(count: Callable[[], int], expected: int, timeout: float = 3.0) -> int:
    """Poll `count` until it is at most `expected` (killed processes take a moment to go)."""
    deadline = time.monotonic() + timeout
    value = count()
    while value > expected and time.monotonic() < deadline:
        time.sleep(0.02)
        value = count()
    return value


def stable(count: Callable[[], int], quiet: float = 0.3, timeout: float = 5.0) -> int:
    """The count once it has not changed for `quiet` seconds (standby forks start in the background)."""
    deadline = time.monotonic() + timeout
    value, since = count(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.02)
        current = count()
        if current != value:
            value, since = current, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return value
