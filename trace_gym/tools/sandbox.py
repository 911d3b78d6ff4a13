r"""Persistent Python interpreters for model-written code, isolated from the host (DESIGN section 11).

A sandbox runs *cells* in one namespace, like a notebook: variables, imports and functions
persist across `run` calls. The value of a trailing expression is printed, as in a REPL::

    with make_sandbox("process", timeout=5.0) as box:
        box.run("x = 6 * 7")
        box.run("x").stdout            # '42\n'
        state = box.checkpoint()       # the cell log, plus a forked live checkpoint
        box.run("x = 0")
        box.restore(state)             # back to x == 42, in a few milliseconds
        box.run("print(x)").stdout     # '42\n'

Backends: `ProcessSandbox` (a child process under bubblewrap or Linux namespaces) and
`DockerSandbox` (the same program in a container). Both run `trace_gym/tools/_worker.py`:
a manager process that never runs cell code, the live interpreter, and forked checkpoints.

Snapshots. `checkpoint()` returns a `SandboxState`: the cell log (code, timeout, fingerprint of
each result), a plain value that restores into any sandbox with the same settings by replaying
the cells; a replay whose results differ raises `SnapshotError`. The sandbox also keeps up to
`checkpoints` paused copy-on-write forks of the interpreter (an LRU keyed by state); `restore`
resumes from the longest checkpointed prefix of the state and replays only what follows it, so
restoring a checkpointed state costs one fork whatever its depth. A checkpoint also holds a copy
of the scratch directory (up to `snapshot_files_mb`; a larger directory is not checkpointed and
that state restores by replay). A replayed cell that timed out is not run again: its recorded
result stands and the interpreter restarts, as it did (its partial writes to the scratch
directory are not reproduced).
"""

from __future__ import annotations

import abc
import contextlib
import functools
import hashlib
import importlib
import json
import os
import re
import secrets
import selectors
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from trace_gym.errors import ConfigError, MissingDependencyError, SnapshotError, TraceGymError
from trace_gym.tools import _worker

__all__ = [
    "ISOLATIONS",
    "CellResult",
    "DockerSandbox",
    "ProcessSandbox",
    "PythonSandbox",
    "SandboxError",
    "SandboxState",
    "detect_isolation",
    "fingerprint",
    "make_sandbox",
]

ISOLATIONS = ("auto", "bubblewrap", "namespaces", "none")
"""Values of `ProcessSandbox(isolation=...)`."""

_WORKER_SOURCE = Path(_worker.__file__).read_text()
_START_TIMEOUT = 30.0
_CONTROL_TIMEOUT = 10.0
_KILL_GRACE = 5.0


class SandboxError(TraceGymError, RuntimeError):
    """A sandbox cannot be started as configured (no isolation primitive, no Docker engine, ...)."""


@dataclass(frozen=True, slots=True)
class CellResult:
    """What running one cell produced.

    Attributes:
        stdout: What the cell printed (capped at the sandbox's `max_output_chars`, with a note of
            how much was cut), followed by the repr of a trailing expression's value.
        stderr: What the cell wrote to `sys.stderr`, and the traceback of an exception.
        error: The error in one line ("ZeroDivisionError: division by zero", "TimeoutError: cell
            exceeded 5 s; ...", "the interpreter died (signal 11: SIGSEGV); its state was reset");
            None when the cell ran to its end.
        timed_out: Whether the wall-clock timeout killed the cell (the interpreter restarted).
        duration: Wall-clock seconds, as the caller saw them.
    """

    stdout: str
    stderr: str
    error: str | None
    timed_out: bool
    duration: float


@dataclass(frozen=True, slots=True)
class SandboxState:
    """A sandbox's state as a plain value: its cell log.

    Attributes:
        cells: `(code, timeout, fingerprint)` per cell run since the last reset, in order; the
            fingerprint (`fingerprint(result)`) is what a replay must reproduce.
    """

    cells: tuple[tuple[str, float | None, str], ...] = ()

    def __len__(self) -> int:
        return len(self.cells)


_SANDBOX_LOST = "the interpreter died (its sandbox stopped"
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{8,}")


def fingerprint(result: CellResult) -> str:
    """A digest of a cell's result without its duration.

    A timed-out cell's digest starts with "timeout:" and covers only its error (its output is
    whatever it printed before it was killed); a cell during which the whole sandbox had to be
    started again gets "restart:". Replay does not run such cells again: it restarts the
    interpreter, as happened when they ran. Memory addresses (`<object at 0x7f...>`) differ
    from one process to the next, so they are left out.
    """
    if result.timed_out:
        return "timeout:" + hashlib.sha256(str(result.error).encode()).hexdigest()[:16]
    if result.error is not None and result.error.startswith(_SANDBOX_LOST):
        return "restart:" + hashlib.sha256(b"sandbox lost").hexdigest()[:16]
    fields = [result.stdout, result.stderr, result.error]
    payload = json.dumps([None if f is None else _ADDRESS.sub("0x?", f) for f in fields])
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


class _Broken(Exception):  # noqa: N818 (reads as the event)
    """The sandbox's manager process went away or stopped answering."""


class _Connection:
    """The host's end of the manager's control socket."""

    def __init__(self, sock: socket.socket) -> None:
        sock.settimeout(None)
        self.channel = _worker.Channel(sock)
        self._selector = selectors.DefaultSelector()
        self._selector.register(sock, selectors.EVENT_READ)

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.channel.send(message)
        except OSError as exc:
            raise _Broken(str(exc)) from exc

    def receive(self, timeout: float | None) -> dict[str, Any] | None:
        """The next message, or None if none arrived within `timeout` seconds."""
        if not self.channel.pending() and not self._selector.select(timeout):
            return None
        try:
            message, fds = self.channel.recv()
        except (_worker.Closed, OSError, ValueError) as exc:
            raise _Broken(str(exc) or "the sandbox closed its control socket") from exc
        for fd in fds:
            os.close(fd)
        if "broken" in message:
            raise _Broken(str(message["broken"]))
        return message

    def request(self, message: dict[str, Any], timeout: float = _CONTROL_TIMEOUT) -> dict[str, Any]:
        self.send(message)
        reply = self.receive(timeout)
        if reply is None:
            raise _Broken(f"no answer to {message.get('op')!r} within {timeout:g} s")
        return reply

    def close(self) -> None:
        self._selector.close()
        self.channel.close()


class PythonSandbox(abc.ABC):
    """A persistent Python interpreter with a cell log, checkpoints and restores.

    Subclasses start and stop the isolated manager process (`_launch`, `_terminate`); running
    cells, timeouts, checkpoints and replay live here. Use as a context manager, or call
    `close()`: it is idempotent and leaves no process or container behind.

    Attributes:
        isolation: The isolation in force: "bubblewrap", "namespaces", "docker" or "none".
    """

    isolation: str
    backend: ClassVar[str]

    def __init__(
        self,
        *,
        timeout: float,
        max_output_chars: int,
        checkpoints: int,
        snapshot_files_mb: float,
    ) -> None:
        if not timeout > 0:
            raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if max_output_chars < 1:
            raise ConfigError(f"max_output_chars must be at least 1, got {max_output_chars!r}")
        if snapshot_files_mb < 0:
            raise ConfigError(f"snapshot_files_mb must be >= 0, got {snapshot_files_mb!r}")
        if checkpoints < 0:
            raise ConfigError(f"checkpoints must be >= 0 (0 turns fork checkpoints off), got {checkpoints!r}")
        self.timeout = float(timeout)
        self.max_output_chars = int(max_output_chars)
        self.max_checkpoints = int(checkpoints)
        self.snapshot_files_mb = float(snapshot_files_mb)
        self._connection: _Connection | None = None
        self._log: list[tuple[str, float | None, str]] = []
        self._checkpoints: OrderedDict[tuple[tuple[str, float | None, str], ...], int] = OrderedDict()
        self._next_checkpoint = 1  # 0 is the manager's pristine interpreter
        self._lock = threading.RLock()
        self._closed = False
        self.restarts = 0
        """How many times the whole sandbox was started again after its manager died."""

    # subclass hooks ----------------------------------------------------------------------------

    @abc.abstractmethod
    def _launch(self, config: dict[str, Any]) -> _Connection:
        """Start the manager with `config` (the worker's JSON config) and connect to it."""

    @abc.abstractmethod
    def _terminate(self) -> None:
        """Stop the manager and everything it started (called after it was asked to exit)."""

    @abc.abstractmethod
    def _worker_config(self) -> dict[str, Any]:
        """The worker's config: limits, scratch path, how to reach the host."""

    # life cycle ----------------------------------------------------------------------------------

    def __enter__(self) -> PythonSandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _started(self) -> _Connection:
        if self._closed:
            raise SandboxError(f"{self!r} is closed; make a new sandbox")
        if self._connection is None:
            connection = self._launch(self._worker_config())
            try:
                reply = connection.receive(_START_TIMEOUT)
            except _Broken as exc:
                reply = {"failed": str(exc)}
            if reply is None or "ready" not in reply:
                connection.close()
                self._terminate()
                why = "no answer" if reply is None else reply.get("failed", reply)
                raise SandboxError(f"the {self.backend} sandbox did not start ({why}); {self._start_hint()}")
            self._connection = connection
        return self._connection

    def _start_hint(self) -> str:
        return "check that its isolation works with `python -m trace_gym.tools.sandbox`"

    def _stop(self) -> None:
        """Ask the manager to exit, then make sure everything is gone."""
        connection, self._connection = self._connection, None
        self._checkpoints.clear()
        if connection is not None:
            with contextlib.suppress(_Broken):
                connection.send({"op": "exit"})
                deadline = time.monotonic() + 2.0
                while (remaining := deadline - time.monotonic()) > 0:
                    message = connection.receive(remaining)
                    if message is None or "bye" in message:
                        break
            connection.close()
        self._terminate()

    def _restart(self) -> None:
        """After the manager died or hung: start afresh (the scratch directory is kept)."""
        self._stop()
        self.restarts += 1

    def close(self) -> None:
        """Stop the interpreter, its checkpoints and anything they started; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._stop()
            self._closed = True
            self._cleanup()

    @abc.abstractmethod
    def _cleanup(self) -> None:
        """Remove host-side resources (scratch directory, sockets) after the last stop."""

    # cells ---------------------------------------------------------------------------------------

    def run(self, code: str, timeout: float | None = None) -> CellResult:
        """Run one cell in the persistent namespace and log it.

        A cell that raises, exceeds `timeout` (default: the sandbox's) or kills its interpreter
        yields a result with `error` set; it never raises. After a timeout or a crash the
        interpreter restarts with an empty namespace (the scratch directory is kept).

        Args:
            code: Python source; a trailing expression's value is printed like a REPL.
            timeout: Wall-clock seconds for this cell; None uses the sandbox's `timeout`.

        Raises:
            SandboxError: The sandbox is closed, or cannot be started at all on this machine.
        """
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        if timeout is not None and not timeout > 0:
            raise ConfigError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        with self._lock:
            result = self._execute(code, timeout)
            self._log.append((code, timeout, fingerprint(result)))
            return result

    def _execute(self, code: str, timeout: float | None) -> CellResult:
        limit = self.timeout if timeout is None else float(timeout)
        connection = self._started()
        start = time.perf_counter()
        try:
            connection.send({"op": "run", "code": code})
            reply = connection.receive(limit)
            if reply is None:
                return self._kill(connection, limit, start)
        except _Broken as exc:
            self._restart()
            return _died(f"its sandbox stopped: {exc}", time.perf_counter() - start)
        duration = time.perf_counter() - start
        if "died" in reply:
            return _died(str(reply["died"]), duration)
        result = reply["result"]
        return CellResult(
            stdout=str(result["stdout"]),
            stderr=str(result["stderr"]),
            error=None if result["error"] is None else str(result["error"]),
            timed_out=False,
            duration=duration,
        )

    def _kill(self, connection: _Connection, limit: float, start: float) -> CellResult:
        """The cell ran past its time: kill the interpreter (the manager restarts it)."""
        try:
            connection.send({"op": "kill"})
            deadline = time.monotonic() + _KILL_GRACE
            while True:
                message = connection.receive(max(0.0, deadline - time.monotonic()))
                if message is None:
                    raise _Broken("the interpreter could not be killed")
                if "killed" in message:
                    break
        except _Broken:
            self._restart()
        error = (
            f"TimeoutError: cell exceeded {limit:g} s; the interpreter was restarted and its state was lost"
        )
        return CellResult("", "", error, True, time.perf_counter() - start)

    # snapshots -----------------------------------------------------------------------------------

    def checkpoint(self) -> SandboxState:
        """The current state (the cell log); also keeps a forked live checkpoint of it, if enabled."""
        with self._lock:
            state = SandboxState(tuple(self._log))
            if self.max_checkpoints == 0 or self._connection is None or not state.cells:
                return state
            if state.cells in self._checkpoints:
                self._checkpoints.move_to_end(state.cells)
                return state
            checkpoint_id = self._next_checkpoint
            self._next_checkpoint += 1
            try:
                reply = self._connection.request({"op": "checkpoint", "id": checkpoint_id})
            except _Broken:
                self._restart()
                self._log = []
                self._replay(state.cells, 0)
                return state
            if reply.get("ok"):
                self._checkpoints[state.cells] = checkpoint_id
                while len(self._checkpoints) > self.max_checkpoints:
                    _, oldest = self._checkpoints.popitem(last=False)
                    with contextlib.suppress(_Broken):
                        self._connection.request({"op": "drop", "id": oldest})
            return state

    @property
    def live_checkpoints(self) -> int:
        """How many forked checkpoints this sandbox holds now."""
        return len(self._checkpoints)

    def restore(self, state: SandboxState) -> None:
        """Bring the interpreter to `state`.

        Resumes from the longest prefix of `state` that is live (the current interpreter or a
        forked checkpoint) and replays the remaining cells, checking each result's fingerprint.

        Raises:
            SnapshotError: A replayed cell's result differs from the recorded one.
        """
        if not isinstance(state, SandboxState):
            raise TypeError(f"restore() expects a SandboxState, got {type(state).__name__}")
        with self._lock:
            cells = state.cells
            if not cells and not self._log and self._connection is None:  # nothing ran yet: stay lazy
                return
            connection = self._started()
            current = tuple(self._log)
            live = len(current) if cells[: len(current)] == current else -1
            forked, checkpoint_id = 0, None
            for depth in range(len(cells), live, -1):
                checkpoint_id = self._checkpoints.get(cells[:depth])
                if checkpoint_id is not None:
                    forked = depth
                    self._checkpoints.move_to_end(cells[:depth])
                    break
            try:
                if checkpoint_id is not None:
                    if connection.request({"op": "restore", "id": checkpoint_id}).get("ok"):
                        self._log = list(cells[:forked])
                        self._replay(cells, forked)
                        return
                    del self._checkpoints[cells[:forked]]
                if live >= 0:
                    self._replay(cells, live)
                    return
                connection.request({"op": "reset"})
            except _Broken:
                self._restart()
            self._log = []
            self._replay(cells, 0)

    def _replay(self, cells: tuple[tuple[str, float | None, str], ...], start: int) -> None:
        for index in range(start, len(cells)):
            code, timeout, expected = cells[index]
            if expected.startswith(("timeout:", "restart:")):
                try:
                    self._started().request({"op": "restart"})
                except _Broken:
                    self._restart()
                self._log.append(cells[index])
                continue
            result = self._execute(code, timeout)
            self._log.append((code, timeout, fingerprint(result)))
            if fingerprint(result) != expected:
                shown = code if len(code) <= 200 else code[:200] + "..."
                raise SnapshotError(
                    f"replaying cell {index + 1} of {len(cells)} did not reproduce its recorded result, "
                    f"so this state cannot be restored here. The cell was {shown!r}; now it gave "
                    f"stdout={result.stdout[:200]!r}, error={result.error!r}. A cell whose output "
                    "depends on time, unseeded randomness or outside files is not replayable: seed it, "
                    "or restore in the sandbox that holds a live checkpoint of this state."
                )

    def reset(self) -> None:
        """A fresh interpreter with an empty namespace, an empty scratch directory and an empty log."""
        with self._lock:
            if self._connection is None and not self._log:  # nothing ran yet: stay lazy
                return
            self._log = []
            try:
                self._started().request({"op": "reset"})
            except _Broken:
                self._restart()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("running" if self._connection is not None else "not started")
        return (
            f"{type(self).__name__}(isolation={self.isolation!r}, timeout={self.timeout:g}, "
            f"cells={len(self._log)}, checkpoints={len(self._checkpoints)}/{self.max_checkpoints}, {state})"
        )


def _died(description: str, duration: float) -> CellResult:
    return CellResult("", "", f"the interpreter died ({description}); its state was reset", False, duration)


# ------------------------------------------------------------------------------------------------
# Isolation on this machine


@functools.cache
def _bubblewrap_works(bwrap: str) -> bool:
    command = [bwrap, "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "--die-with-parent"]
    if os.geteuid() != 0:
        command.append("--unshare-user")
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run([*command, "true"], capture_output=True, timeout=10)
        return done.returncode == 0
    return False


@functools.cache
def _namespaces_work(unshare: str) -> bool:
    command = [unshare, "--fork", "--pid", "--net", "--mount", "--ipc", "--uts"]
    if os.geteuid() != 0:
        command += ["--user", "--map-root-user"]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run([*command, "true"], capture_output=True, timeout=10)
        return done.returncode == 0
    return False


def detect_isolation() -> str:
    """The best isolation this machine offers: "bubblewrap", "namespaces", or "none" (nothing works)."""
    bwrap = shutil.which("bwrap")
    if bwrap and _bubblewrap_works(bwrap):
        return "bubblewrap"
    unshare = shutil.which("unshare")
    if unshare and _namespaces_work(unshare):
        return "namespaces"
    return "none"


_NO_ISOLATION = (
    "ProcessSandbox found no isolation primitive on this machine: neither bubblewrap (`bwrap`) nor "
    "Linux user/mount/network namespaces (`unshare`) work here, so model-written code would run with "
    "your privileges and network. Install bubblewrap (`apt-get install bubblewrap`, or run "
    "`bash scripts/setup_sandboxes.sh`), enable unprivileged user namespaces "
    "(`sysctl kernel.unprivileged_userns_clone=1`), use DockerSandbox, or pass isolation='none' to "
    "run without isolation on purpose."
)


def _hidden_paths(extra: tuple[str, ...]) -> list[str]:
    """Host paths the sandbox sees as empty: homes, temp dirs, runtime state, this project."""
    project = Path(__file__).resolve().parents[2]
    candidates = ["/root", "/home", "/tmp", "/var/tmp", "/run", "/mnt", "/media", "/srv", str(project)]
    candidates += [str(Path.home()), os.getcwd(), *extra]
    hidden: list[str] = []
    for path in candidates:
        resolved = os.path.realpath(path)
        # The system itself stays visible (a working directory of /usr/src must not hide /usr).
        system = any(_under(resolved, d) or _under(d, resolved) for d in _SYSTEM_DIRS)
        if not system and os.path.isdir(resolved) and resolved not in hidden:
            hidden.append(resolved)
    return sorted(hidden, key=len)


_SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/dev", "/proc", "/sys")


def _python_paths(python: str) -> list[str]:
    """What the interpreter needs to see: its prefixes and site-packages (read-only)."""
    paths = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    paths.add(str(Path(python).resolve().parents[1]))  # .../bin/python -> its prefix
    paths |= {os.path.realpath(p) for p in site.getsitepackages() if os.path.isdir(p)}
    result: list[str] = []
    for path in sorted(paths, key=len):
        if not any(path == kept or path.startswith(kept + "/") for kept in result):
            result.append(path)
    return result


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class ProcessSandbox(PythonSandbox):
    """A persistent interpreter in an isolated child process: the embedded default.

    Isolation (`isolation`):

    - "bubblewrap": `bwrap` with new pid, network, ipc and uts namespaces. The host's file system is
      mounted read-only; `/root`, `/home`, `/tmp`, `/var/tmp`, `/run`, `/mnt`, `/media`, `/srv`,
      the trace-gym project, the caller's home and working directory (and `hide_paths`) are empty
      tmpfs mounts, with the interpreter's own prefix and site-packages mounted back read-only. The
      scratch directory is the only writable host path. There is no network (loopback only, of a new
      namespace). When the caller is root, the sandbox runs as a fresh unprivileged uid with no
      capabilities; otherwise as the caller inside a user namespace.
    - "namespaces": the same view built with `unshare` (user, mount, pid, network, ipc, uts) and
      mount calls in the sandbox, where bubblewrap is missing.
    - "none": a plain child process with the limits below: no file or network isolation. Only when
      asked for explicitly; it warns.
    - "auto" (default): the best available; with none available the constructor raises
      `SandboxError` saying what to install (it fails closed).

    Limits (per interpreter process): `cpu_seconds` (RLIMIT_CPU; the interpreter dies when it is
    spent), `memory_mb` (RLIMIT_AS: allocations past it raise MemoryError), `file_size_mb`
    (RLIMIT_FSIZE: bigger writes fail with "File too large"), `max_processes` (RLIMIT_NPROC,
    counted for the sandbox's uid, plus room for the checkpoints), `max_output_chars` (per stream,
    capped inside the sandbox), and the per-cell wall-clock `timeout`.

    Output written straight to file descriptors 1 and 2 (subprocesses, C code) is discarded; only
    `sys.stdout` and `sys.stderr` are captured.

    Args:
        isolation: "auto", "bubblewrap", "namespaces" or "none" (see above).
        timeout: Default wall-clock seconds per cell.
        cpu_seconds: CPU seconds per interpreter process (None: no limit).
        memory_mb: Address space per process, in MiB (None: no limit).
        file_size_mb: Largest file a cell may write, in MiB (None: no limit).
        max_processes: Processes the cells may run at once (None: no limit).
        max_output_chars: Characters kept per stream per cell.
        checkpoints: Forked checkpoints kept (LRU); 0 restores by replay only.
        snapshot_files_mb: Largest scratch directory a checkpoint copies; a bigger one is not
            checkpointed (its states restore by replay).
        hide_paths: More host directories to hide (besides the ones above).
        env: Extra environment variables (the rest is a fixed whitelist: PATH, HOME, TMPDIR,
            LANG, PYTHONHASHSEED=0, single-threaded BLAS, ...).
        python: The interpreter to run (default: this one); its prefix is mounted read-only.
    """

    backend = "process"

    def __init__(
        self,
        *,
        isolation: str = "auto",
        timeout: float = 10.0,
        cpu_seconds: int | None = 60,
        memory_mb: int | None = 2048,
        file_size_mb: int | None = 64,
        max_processes: int | None = 64,
        max_output_chars: int = 16_000,
        checkpoints: int = 32,
        snapshot_files_mb: float = 16.0,
        hide_paths: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        python: str | None = None,
    ) -> None:
        super().__init__(
            timeout=timeout,
            max_output_chars=max_output_chars,
            checkpoints=checkpoints,
            snapshot_files_mb=snapshot_files_mb,
        )
        if isolation not in ISOLATIONS:
            raise ConfigError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
        for name, value in [
            ("cpu_seconds", cpu_seconds),
            ("memory_mb", memory_mb),
            ("file_size_mb", file_size_mb),
            ("max_processes", max_processes),
        ]:
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be a positive integer or None (no limit), got {value!r}")
        if isolation == "auto":
            isolation = detect_isolation()
            if isolation == "none":
                raise SandboxError(_NO_ISOLATION)
        elif isolation == "bubblewrap" and not (
            shutil.which("bwrap") and _bubblewrap_works(shutil.which("bwrap") or "")
        ):
            raise SandboxError(
                "isolation='bubblewrap' was asked for, but `bwrap` is missing or does not work "
                "here. Install it with `apt-get install bubblewrap`, or pass isolation='auto'."
            )
        elif isolation == "namespaces" and not _namespaces_work(shutil.which("unshare") or "unshare"):
            raise SandboxError(
                "isolation='namespaces' was asked for, but `unshare` cannot create user, mount "
                "and network namespaces here. Pass isolation='auto', or install bubblewrap."
            )
        elif isolation == "none":
            warnings.warn(
                "ProcessSandbox(isolation='none') runs model-written code without file-system or network "
                "isolation (only resource limits apply). Use it only for trusted code.",
                RuntimeWarning,
                stacklevel=2,
            )
        self.isolation = isolation
        self.cpu_seconds = cpu_seconds
        self.memory_mb = memory_mb
        self.file_size_mb = file_size_mb
        self.max_processes = max_processes
        self.hide_paths = tuple(hide_paths)
        self.env = dict(env or {})
        self.python = python or os.path.realpath(sys.executable)
        self._scratch: str | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._uid: int | None = None
        self._finalizer = weakref.finalize(self, _kill_process_tree, None, None, None)

    @property
    def scratch(self) -> str:
        """The scratch directory (the interpreter's working directory); created on first use."""
        if self._scratch is None:
            self._scratch = tempfile.mkdtemp(prefix="trace-gym-sandbox-")
            os.chmod(self._scratch, 0o700)
        return self._scratch

    def _worker_config(self) -> dict[str, Any]:
        if os.geteuid() == 0 and self.isolation != "none":
            # A fresh unprivileged uid per start: its process count (RLIMIT_NPROC) starts at zero.
            self._uid = secrets.randbelow(60_000) + 200_000
            for root, dirs, files in os.walk(self.scratch):
                for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                    os.lchown(name, self._uid, self._uid)
        processes = None
        if self.max_processes is not None:
            # Each checkpoint (and the pristine one) keeps a forked standby interpreter.
            processes = self.max_processes + 2 * (self.max_checkpoints + 1) + 4
            if self._uid is None and self.isolation != "none":
                processes += _processes_of(os.getuid())
        return {
            "scratch": self.scratch,
            "uid": self._uid,
            "cpu_seconds": self.cpu_seconds,
            "memory_mb": self.memory_mb,
            "file_size_mb": self.file_size_mb,
            "max_processes": processes if os.geteuid() != 0 or self._uid is not None else None,
            "max_output_chars": self.max_output_chars,
            "snapshot_bytes": int(self.snapshot_files_mb * (1 << 20)),
            "parent_death": self.isolation != "bubblewrap",
        }

    def _environment(self) -> dict[str, str]:
        bindir = os.path.dirname(self.python)
        return {
            "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
            "HOME": self.scratch,
            "TMPDIR": self.scratch,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "MPLBACKEND": "Agg",
            **self.env,
        }

    def _command(self, config: dict[str, Any]) -> list[str]:
        python = [self.python, "-s", "-c", _WORKER_SOURCE, json.dumps(config)]
        if self.isolation == "none":
            return python
        python_paths = _python_paths(self.python)
        # A path inside the interpreter's own prefix cannot be hidden from it.
        hidden = [
            path
            for path in _hidden_paths(self.hide_paths)
            if path != self.scratch and not any(_under(path, kept) for kept in python_paths)
        ]
        reveal = [path for path in python_paths if any(_under(path, h) for h in hidden)]
        if self.isolation == "namespaces":
            config["mounts"] = True
            config["hide"] = hidden
            config["reveal"] = reveal
            command = ["unshare", "--fork", "--pid", "--mount-proc", "--net", "--mount", "--ipc", "--uts"]
            command += ["--kill-child"]
            if os.geteuid() != 0:
                command += ["--user", "--map-root-user"]
            return [*command, self.python, "-s", "-c", _WORKER_SOURCE, json.dumps(config)]
        command = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        for path in hidden:
            command += ["--tmpfs", path]
        made: set[str] = set()
        for path in [*reveal, self.scratch]:
            covering = [h for h in hidden if _under(path, h)]
            if covering:
                top = max(covering, key=len)
                parts = Path(path).relative_to(top).parts[:-1]
                for depth in range(1, len(parts) + 1):
                    directory = str(Path(top, *parts[:depth]))
                    if directory not in made:
                        command += ["--perms", "0755", "--dir", directory]
                        made.add(directory)
            command += ["--bind" if path == self.scratch else "--ro-bind", path, path]
        command += [
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-uts",
            "--unshare-cgroup-try",
        ]
        if os.geteuid() == 0:
            command += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            command += ["--unshare-user"]
        command += ["--die-with-parent", "--new-session", "--as-pid-1", "--chdir", self.scratch, "--clearenv"]
        for key, value in self._environment().items():
            command += ["--setenv", key, value]
        return [*command, *python]

    def _launch(self, config: dict[str, Any]) -> _Connection:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        config["fd"] = theirs.fileno()
        command = self._command(config)
        try:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                env=self._environment(),
                cwd=self.scratch,
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            raise SandboxError(f"could not start {command[0]!r}: {exc}") from exc
        finally:
            theirs.close()
        self._finalizer.detach()
        # If the sandbox is dropped without close(): closing the socket makes the manager exit.
        self._finalizer = weakref.finalize(self, _kill_process_tree, self._process, self._scratch, ours)
        return _Connection(ours)

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            _kill_process_tree(process, None, None)

    def _cleanup(self) -> None:
        self._finalizer.detach()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


def _processes_of(uid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += 1
    return count


def _kill_process_tree(
    process: subprocess.Popen[bytes] | None, scratch: str | None, control: socket.socket | None
) -> None:
    """Kill a sandbox's launcher, its process group, and (bwrap/unshare) its pid namespace."""
    if control is not None:
        control.close()
    if process is not None:
        try:
            process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5.0)
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)


# ------------------------------------------------------------------------------------------------
# Docker


DEFAULT_IMAGE = "trace-gym-sandbox:latest"


def _docker_client() -> Any:
    try:
        docker = importlib.import_module("docker")
    except ImportError as exc:
        raise MissingDependencyError(
            "docker", "docker", "DockerSandbox", command="pip install 'trace-gym[docker]'"
        ) from exc
    try:
        return docker.from_env()
    except docker.errors.DockerException as exc:
        raise SandboxError(
            f"DockerSandbox cannot reach a Docker engine ({exc}). Start dockerd, or run "
            "`bash scripts/setup_sandboxes.sh` (installs docker.io, starts dockerd, builds "
            f"{DEFAULT_IMAGE})."
        ) from exc


class DockerSandbox(PythonSandbox):
    """The same interpreter in a Docker container: no network, read-only root, tmpfs scratch.

    The container runs with `network_mode="none"`, a read-only root file system, a tmpfs at
    `/scratch` (the working directory, `scratch_mb` large) and `/tmp`, `memory_mb` of memory (no
    swap), `cpus` CPUs, at most `pids` processes, all capabilities dropped, `no-new-privileges`, as
    `user` (unprivileged). The control socket is a Unix socket in a host directory mounted
    read-only. Fork checkpoints work inside the container as in `ProcessSandbox`.

    Images: `image` (default `trace-gym-sandbox:latest`, built by `scripts/setup_sandboxes.sh`
    without a registry). An image may carry the labels `trace_gym.python` (the interpreter's path)
    and `trace_gym.mounts` (colon-separated host paths to mount read-only, e.g. the host's /usr and
    Python prefix); without them the container runs `python3` from the image, e.g. `python:3.11-slim`.

    Args:
        image: The image to run.
        timeout: Default wall-clock seconds per cell.
        memory_mb: The container's memory (no swap), also the address-space limit per process.
        cpus: CPUs the container may use.
        pids: Processes the container may hold (interpreter, checkpoints and their standbys
            included: two per checkpoint).
        cpu_seconds: CPU seconds per interpreter process (None: no limit).
        file_size_mb: Largest file a cell may write, in MiB (None: no limit).
        scratch_mb: Size of the tmpfs at /scratch.
        max_output_chars: Characters kept per stream per cell.
        checkpoints: Forked checkpoints kept (LRU); 0 restores by replay only.
        snapshot_files_mb: Largest scratch directory a checkpoint copies.
        user: "uid:gid" to run as (unprivileged).
        python: The interpreter inside the container (default: the image's label, else python3).
        env: Extra environment variables.
    """

    backend = "docker"
    isolation = "docker"

    def __init__(
        self,
        *,
        image: str = DEFAULT_IMAGE,
        timeout: float = 10.0,
        memory_mb: int = 2048,
        cpus: float = 1.0,
        pids: int = 256,
        cpu_seconds: int | None = 60,
        file_size_mb: int | None = 64,
        scratch_mb: int = 256,
        max_output_chars: int = 16_000,
        checkpoints: int = 32,
        snapshot_files_mb: float = 16.0,
        user: str = "1000:1000",
        python: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(
            timeout=timeout,
            max_output_chars=max_output_chars,
            checkpoints=checkpoints,
            snapshot_files_mb=snapshot_files_mb,
        )
        for name, value in [("memory_mb", memory_mb), ("pids", pids), ("scratch_mb", scratch_mb)]:
            if value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if not cpus > 0:
            raise ConfigError(f"cpus must be positive, got {cpus!r}")
        self.client = _docker_client()
        try:
            labels = self.client.images.get(image).labels or {}
        except Exception as exc:
            raise SandboxError(
                f"the Docker image {image!r} is not available ({exc}). Build the default one with "
                "`bash scripts/setup_sandboxes.sh`, or pass an image that has python3."
            ) from exc
        self.image = image
        self.python = python or labels.get("trace_gym.python", "python3")
        self.host_mounts = [p for p in labels.get("trace_gym.mounts", "").split(":") if p]
        self.memory_mb, self.cpus, self.pids = memory_mb, cpus, pids
        self.cpu_seconds, self.file_size_mb, self.scratch_mb = cpu_seconds, file_size_mb, scratch_mb
        self.user = user
        self.env = dict(env or {})
        self.container: Any = None
        self._socket_dir: str | None = None
        self._finalizer = weakref.finalize(self, _remove_container, None, None)

    def _start_hint(self) -> str:
        return f"check `docker logs` and that {self.image!r} runs {self.python!r}"

    def _worker_config(self) -> dict[str, Any]:
        return {
            "scratch": "/scratch",
            "connect": "/run/trace-gym/control.sock",
            "cpu_seconds": self.cpu_seconds,
            "memory_mb": self.memory_mb,
            "file_size_mb": self.file_size_mb,
            "max_processes": None,  # the container's pid limit counts instead
            "max_output_chars": self.max_output_chars,
            "snapshot_bytes": int(self.snapshot_files_mb * (1 << 20)),
        }

    def _launch(self, config: dict[str, Any]) -> _Connection:
        if self._socket_dir is None:
            self._socket_dir = tempfile.mkdtemp(prefix="trace-gym-docker-")
            os.chmod(self._socket_dir, 0o755)
        path = os.path.join(self._socket_dir, "control.sock")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        os.chmod(path, 0o666)
        listener.listen(1)
        volumes = {self._socket_dir: {"bind": "/run/trace-gym", "mode": "ro"}}
        volumes |= {p: {"bind": p, "mode": "ro"} for p in self.host_mounts}
        environment = {
            "HOME": "/scratch",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MPLBACKEND": "Agg",
            **self.env,
        }
        try:
            self.container = self.client.containers.run(
                self.image,
                [self.python, "-s", "-c", _WORKER_SOURCE, json.dumps(config)],
                detach=True,
                network_mode="none",
                read_only=True,
                tmpfs={"/scratch": f"size={self.scratch_mb}m,mode=1777", "/tmp": "size=64m,mode=1777"},
                mem_limit=f"{self.memory_mb}m",
                memswap_limit=f"{self.memory_mb}m",
                nano_cpus=int(self.cpus * 1e9),
                pids_limit=self.pids,
                user=self.user,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                environment=environment,
                working_dir="/scratch",
                volumes=volumes,
                labels={"trace_gym.sandbox": "1"},
                auto_remove=True,  # gone even if this process dies without closing it
            )
        except Exception as exc:
            listener.close()
            raise SandboxError(f"could not start a container from {self.image!r}: {exc}") from exc
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _remove_container, self.container, self._socket_dir)
        listener.settimeout(_START_TIMEOUT)
        try:
            sock, _ = listener.accept()
        except OSError as exc:
            logs = ""
            with contextlib.suppress(Exception):
                logs = self.container.logs(tail=20).decode(errors="replace")
            raise SandboxError(
                f"the container did not connect within {_START_TIMEOUT:g} s ({exc}): {logs}"
            ) from exc
        finally:
            listener.close()
        return _Connection(sock)

    def _terminate(self) -> None:
        container, self.container = self.container, None
        _remove_container(container, None)

    def _cleanup(self) -> None:
        self._finalizer.detach()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None


def _remove_container(container: Any, socket_dir: str | None) -> None:
    if container is not None:
        with contextlib.suppress(Exception):
            container.remove(force=True)
    if socket_dir is not None:
        shutil.rmtree(socket_dir, ignore_errors=True)


# ------------------------------------------------------------------------------------------------

_BACKENDS: dict[str, type[PythonSandbox]] = {"process": ProcessSandbox, "docker": DockerSandbox}


def make_sandbox(backend: str = "process", **kwargs: Any) -> PythonSandbox:
    """A sandbox by backend name: "process" (`ProcessSandbox`) or "docker" (`DockerSandbox`).

    Keyword arguments go to the class; an unknown one raises TypeError.
    """
    if backend not in _BACKENDS:
        raise ConfigError(f"unknown sandbox backend {backend!r}; valid backends are {sorted(_BACKENDS)}")
    return _BACKENDS[backend](**kwargs)


if __name__ == "__main__":
    print(f"isolation available here: {detect_isolation()}")
    with ProcessSandbox(isolation="auto") as box:
        print(repr(box), box.run("import sys; sys.version").stdout.strip())
