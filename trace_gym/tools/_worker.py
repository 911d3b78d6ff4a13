"""The program that runs inside a sandbox: a manager and the Python interpreters it serves.

This file is executed as a script (``python -s -c <this source> <config json>``) inside the
isolation layer (bubblewrap, namespaces or a container). It imports nothing from trace_gym and
only the standard library, so it runs wherever a Python interpreter runs.

Processes inside one sandbox:

- the **manager** (pid 1 of the sandbox's pid namespace where there is one) talks to the host
  over one stream socket. It never runs cell code. It starts interpreters, forwards cells to
  the live one, kills it (and everything it started) on a timeout, and keeps checkpoints;
- the **live interpreter** runs cells in one persistent namespace (notebook semantics);
- **checkpoints**: paused copy-on-write forks of an interpreter. Each holds a copy of the
  scratch directory's files taken when it was forked, and on request forks a new live
  interpreter that continues exactly from that moment. Checkpoint 0, the *pristine*
  interpreter, is taken right after start-up; restarts after a timeout or a crash fork from it.

Every message is a frame: a 4-byte big-endian length and a JSON object. File descriptors travel
with a frame as SCM_RIGHTS ancillary data (Unix domain sockets only).
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import json
import linecache
import os
import resource
import selectors
import signal
import socket
import struct
import sys
import time
import traceback
from typing import Any

_HEADER = struct.Struct(">I")
_MAX_FDS = 4
_MAX_FRAME = 1 << 26
PRISTINE = 0
_CHECKPOINT_TIMEOUT = 5.0


class Closed(Exception):  # noqa: N818 (reads as the event)
    """The other end of a channel went away."""


class Channel:
    """Length-prefixed JSON frames over a connected Unix stream socket, with optional fds."""

    def __init__(self, sock: socket.socket, max_frame: int = _MAX_FRAME) -> None:
        self.sock = sock
        self.max_frame = max_frame
        self._buffer = b""
        self._fds: list[int] = []

    def fileno(self) -> int:
        """The socket's file descriptor (for selectors)."""
        return self.sock.fileno()

    def send(self, obj: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
        """Send one frame; `fds` are attached to its first byte."""
        payload = json.dumps(obj, separators=(",", ":")).encode()
        data = _HEADER.pack(len(payload)) + payload
        if fds:
            sent = socket.send_fds(self.sock, [data], list(fds))
            data = data[sent:]
        if data:
            self.sock.sendall(data)

    def _fill(self, n: int) -> None:
        while len(self._buffer) < n:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, 1 << 16, _MAX_FDS)
            if not data:
                for fd in fds:
                    os.close(fd)
                raise Closed
            self._buffer += data
            self._fds.extend(fds)

    def recv(self) -> tuple[dict[str, Any], list[int]]:
        """Receive one frame and the fds that came with it (blocks)."""
        self._fill(_HEADER.size)
        (size,) = _HEADER.unpack(self._buffer[: _HEADER.size])
        if size > self.max_frame:
            raise Closed(f"a frame of {size} bytes (at most {self.max_frame})")
        self._fill(_HEADER.size + size)
        payload = self._buffer[_HEADER.size : _HEADER.size + size]
        self._buffer = self._buffer[_HEADER.size + size :]
        fds, self._fds = self._fds, []
        obj = json.loads(payload)
        if not isinstance(obj, dict):
            raise Closed
        return obj, fds

    def pending(self) -> bool:
        """Whether a whole frame is already buffered."""
        if len(self._buffer) < _HEADER.size:
            return False
        (size,) = _HEADER.unpack(self._buffer[: _HEADER.size])
        return bool(len(self._buffer) >= _HEADER.size + size)

    def close(self) -> None:
        """Close the socket and any fds received but not taken."""
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        self.sock.close()


# --------------------------------------------------------------------------------------------
# The interpreter


class CappedWriter:
    """A text stream that keeps the first `limit` characters and counts the rest.

    It stands in for `sys.stdout` / `sys.stderr` while a cell runs, so printing 100 MB costs
    a counter increment per call, never memory or pipe bandwidth.
    """

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[str] = []
        self.kept = 0
        self.dropped = 0

    def write(self, text: str) -> int:
        """Keep what fits under the limit; count the rest."""
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        room = self.limit - self.kept
        if room > 0:
            piece = text[:room]
            self.parts.append(piece)
            self.kept += len(piece)
            self.dropped += len(text) - len(piece)
        else:
            self.dropped += len(text)
        return len(text)

    def flush(self) -> None:
        """Nothing to flush."""

    def isatty(self) -> bool:
        """Never a terminal."""
        return False

    def writable(self) -> bool:
        """Always writable."""
        return True

    def getvalue(self) -> str:
        """What was kept, with a note of how much was dropped."""
        text = "".join(self.parts)
        if self.dropped:
            text += f"\n[... {self.dropped} more characters truncated]"
        return text


class Interpreter:
    """One persistent namespace that runs cells like a notebook kernel."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
        self.counter = 0

    def run(self, code: str) -> dict[str, Any]:
        """Execute one cell; the value of a trailing expression is printed like a REPL does."""
        limit = int(self.config["max_output_chars"])
        out, err = CappedWriter(limit), CappedWriter(limit)
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        error: str | None = None
        start = time.perf_counter()
        try:
            self.counter += 1
            filename = f"<cell {self.counter}>"
            linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
            tree = ast.parse(code, filename, "exec")
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            assert last is None or isinstance(last, ast.Expr)
            exec(compile(tree, filename, "exec"), self.namespace)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), filename, "eval"), self.namespace)
                if value is not None:
                    print(repr(value), file=out)
        except SystemExit as exc:
            error = f"SystemExit: {exc.code}"
        except BaseException as exc:  # the cell's own failure is its result
            lines = traceback.format_exception_only(type(exc), exc)
            error = lines[-1].strip() if lines else type(exc).__name__
            frames = traceback.extract_tb(exc.__traceback__)
            frames = traceback.StackSummary.from_list([f for f in frames if f.filename.startswith("<cell")])
            if frames:
                err.write("Traceback (most recent call last):\n" + "".join(frames.format()))
            err.write("".join(lines))
        finally:
            sys.stdout, sys.stderr = saved
        if error is not None and len(error) > limit:
            error = error[:limit] + f" [... {len(error) - limit} more characters truncated]"
        if error is None and (out.dropped or err.dropped):
            error = (
                f"OutputTruncated: the cell wrote {out.kept + out.dropped} characters to stdout and "
                f"{err.kept + err.dropped} to stderr; only the first {limit} of each were kept"
            )
        return {
            "stdout": out.getvalue(),
            "stderr": err.getvalue(),
            "error": error,
            "duration": time.perf_counter() - start,
        }


def _scratch_files(scratch: str, limit: int) -> dict[str, bytes] | None:
    """The scratch directory's files as {relative path: contents}; None when over `limit` bytes.

    Empty directories are kept as "path/" entries; symbolic links and special files are left out.
    """
    files: dict[str, bytes] = {}
    total = 0
    for root, dirs, names in os.walk(scratch):
        for name in dirs:
            path = os.path.join(root, name)
            if not os.listdir(path):
                files[os.path.relpath(path, scratch) + "/"] = b""
        for name in names:
            path = os.path.join(root, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            total += os.path.getsize(path)
            if total > limit:
                return None
            with open(path, "rb") as handle:
                files[os.path.relpath(path, scratch)] = handle.read()
    return files


def _clear_dir(path: str) -> None:
    """Empty a directory, whatever permissions cell code gave its contents."""
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    for entry in os.listdir(path):
        full = os.path.join(path, entry)
        if os.path.isdir(full) and not os.path.islink(full):
            _clear_dir(full)
            with contextlib.suppress(OSError):
                os.rmdir(full)
        else:
            with contextlib.suppress(OSError):
                os.unlink(full)


def _write_scratch(scratch: str, files: dict[str, bytes]) -> None:
    _clear_dir(scratch)
    for rel, data in files.items():
        path = os.path.join(scratch, rel)
        if rel.endswith("/"):
            os.makedirs(path, exist_ok=True)
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)


def _random_state() -> Any:
    """The `random` module's state, if imported (forks reseed it; a restore must not)."""
    module = sys.modules.get("random")
    return module.getstate() if module is not None else None


def _set_random_state(state: Any) -> None:
    module = sys.modules.get("random")
    if module is not None and state is not None:
        module.setstate(state)


def _after_fork(keep: tuple[int, ...]) -> None:
    """In a freshly forked child: close every descriptor but stdio and `keep`."""
    os.closerange(3, min(x for x in keep))
    for low, high in zip(sorted(keep), [*sorted(keep)[1:], 65536], strict=True):
        os.closerange(low + 1, high)


_SERVING: dict[str, int] = {"pid": 0, "fd": -1, "own_fork": 0}


def _after_user_fork() -> None:
    """In a child that cell code forked: it must never speak on the interpreter's channel.

    It also runs at a lower priority, so that the manager stays responsive under a fork bomb.
    """
    if not _SERVING["own_fork"] and _SERVING["fd"] >= 0:
        with contextlib.suppress(OSError):
            os.close(_SERVING["fd"])
        _SERVING["fd"] = -1
        with contextlib.suppress(OSError):
            os.nice(10)


def own_fork() -> int:
    """`os.fork()` for the sandbox's own processes (not treated as a fork by cell code)."""
    _SERVING["own_fork"] = 1
    try:
        return os.fork()
    finally:
        _SERVING["own_fork"] = 0


def serve_interpreter(interpreter: Interpreter, channel: Channel) -> None:
    """The live interpreter's loop: run cells and fork checkpoints until the manager goes away."""
    os.setpgid(0, 0)
    os.chdir(interpreter.config["scratch"])
    me = os.getpid()
    _SERVING["pid"], _SERVING["fd"] = me, channel.fileno()
    if not _SERVING.get("hooked"):
        os.register_at_fork(after_in_child=_after_user_fork)
        _SERVING["hooked"] = 1
    while True:
        try:
            request, _fds = channel.recv()
        except (Closed, OSError):
            os._exit(0)
        op = request.get("op")
        if op == "run":
            result = interpreter.run(str(request["code"]))
            if os.getpid() != me:  # a child forked by the cell came back here
                os._exit(0)
            result["seq"] = request.get("seq")
            channel.send(result)
        elif op == "fork":
            _fork_checkpoint(interpreter, channel, bool(request.get("files", True)), request.get("seq"))
        else:
            channel.send({"error": f"unknown op {op!r}"})


def _fork_checkpoint(interpreter: Interpreter, channel: Channel, with_files: bool, seq: Any) -> None:
    # The scratch files are read before the fork: the checkpoint holds them as of this moment,
    # whatever the next cell does, and nobody has to wait for the checkpoint to read them.
    files: dict[str, bytes] | None = {}
    if with_files:
        files = _scratch_files(interpreter.config["scratch"], int(interpreter.config["snapshot_bytes"]))
    if files is None:
        channel.send({"forked": None, "error": "the scratch directory is too big to copy", "seq": seq})
        return
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    state = _random_state()
    try:
        pid = own_fork()
    except OSError as exc:
        parent_end.close()
        child_end.close()
        channel.send({"forked": None, "error": str(exc), "seq": seq})
        return
    if pid == 0:
        try:
            # Only the sandbox's own sockets are closed: files the cells opened stay open.
            parent_end.close()
            channel.sock.close()
            _set_random_state(state)
            serve_checkpoint(interpreter, Channel(child_end), files)
        finally:
            os._exit(0)
    del files
    # Its own process group, set from this side too: killing this interpreter's group right after
    # the fork must not reach the checkpoint, whether or not it has run yet.
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)
    child_end.close()
    channel.send({"forked": pid, "seq": seq}, (parent_end.fileno(),))
    parent_end.close()


class _Standby:
    """A child forked from a checkpoint ahead of time, paused until it is made the live interpreter.

    Forking costs milliseconds; a restore that finds a standby only hands its socket over and
    forks the next standby after it has answered.
    """

    def __init__(self, interpreter: Interpreter, files: dict[str, bytes], parent: Channel) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        state = _random_state()
        try:
            pid = own_fork()
        except OSError:
            ours.close()
            theirs.close()
            raise
        if pid == 0:
            try:
                ours.close()
                parent.sock.close()
                os.setpgid(0, 0)
                _set_random_state(state)
                channel = Channel(theirs)
                try:
                    start, _ = channel.recv()
                except (Closed, OSError):
                    os._exit(0)
                if start.get("files"):
                    _write_scratch(interpreter.config["scratch"], files)
                serve_interpreter(interpreter, channel)
            finally:
                os._exit(0)
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # as the child does; whichever runs first
        theirs.close()
        self.pid = pid
        self.channel = Channel(ours)

    def discard(self) -> None:
        """Kill the standby (it never ran cell code)."""
        self.channel.close()
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)


def serve_checkpoint(interpreter: Interpreter, channel: Channel, files: dict[str, bytes]) -> None:
    """A paused checkpoint: on "spawn", hand over a live interpreter that continues from here."""
    os.setpgid(0, 0)
    statuses: dict[int, int] = {}
    standby: _Standby | None = None
    try:
        while True:
            if standby is None:
                with contextlib.suppress(OSError):
                    standby = _Standby(interpreter, files, channel)
            _reap_into(statuses)
            try:
                request, _fds = channel.recv()
            except (Closed, OSError):
                return
            op = request.get("op")
            if op == "spawn":
                try:
                    live = standby or _Standby(interpreter, files, channel)
                except OSError as exc:
                    channel.send({"spawned": None, "error": str(exc)})
                    continue
                standby = None
                try:
                    live.channel.send({"files": bool(request.get("files"))})
                except OSError:  # the standby was killed (cell code can signal it): fork afresh
                    live.discard()
                    try:
                        live = _Standby(interpreter, files, channel)
                        live.channel.send({"files": bool(request.get("files"))})
                    except OSError as exc:
                        channel.send({"spawned": None, "error": str(exc)})
                        continue
                channel.send({"spawned": live.pid}, (live.channel.fileno(),))
                live.channel.close()
            elif op == "reap":
                pid = int(request["pid"])
                channel.send({"status": statuses.pop(pid) if pid in statuses else _wait(pid, 2.0)})
            elif op == "exit":
                return
    finally:
        if standby is not None:
            standby.discard()
            _wait(standby.pid, 1.0)


def _reap_into(statuses: dict[int, int]) -> None:
    """Reap every finished child, keeping its wait status."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        statuses[pid] = status


def _wait(pid: int, timeout: float) -> int | None:
    """Wait up to `timeout` s for child `pid`; its raw wait status, or None."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return status
        if time.monotonic() > deadline:
            return None
        time.sleep(0.001)


def describe_status(status: int | None) -> str:
    """A wait status in words: "signal 11: SIGSEGV" or "exit status 3"."""
    if status is None:
        return "it exited"
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = "unknown"
        return f"signal {number}: {name}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


# --------------------------------------------------------------------------------------------
# The manager


class Checkpoint:
    """The manager's handle on a paused checkpoint process."""

    def __init__(self, channel: Channel, pid: int) -> None:
        self.channel = channel
        self.pid = pid


class Manager:
    """Talks to the host; owns the live interpreter and the checkpoints."""

    def __init__(self, config: dict[str, Any], host: Channel) -> None:
        self.config = config
        self.host = host
        self.checkpoints: dict[int, Checkpoint] = {}
        self.live: Channel | None = None
        self.live_pid = 0
        self.live_parent: int | None = None  # checkpoint id that forked it; None: the manager
        self.statuses: dict[int, int] = {}
        self.sequence = 0  # numbers requests to the interpreter; replies must carry the number

    # process bookkeeping ---------------------------------------------------------------

    def _reap_orphans(self) -> None:
        _reap_into(self.statuses)

    def _strays(self, keep_live: bool) -> list[int]:
        """Processes below the manager that are neither checkpoints nor (if `keep_live`) the live one.

        Orphans come back to the manager (it is pid 1 or a child subreaper), so the strays are the
        manager's children that are not checkpoints, the live interpreter's descendants, and all
        that is below them.
        """
        keep = {checkpoint.pid for checkpoint in self.checkpoints.values()}
        live = self.live_pid if keep_live and self.live is not None else None
        roots = _children(os.getpid())
        if live is not None:
            roots += _children(live)
        if live is not None:
            keep.add(live)
        victims: list[int] = []
        for root in roots:
            if root not in keep:
                victims += [root, *_tree(root, keep)]
        return [pid for pid in victims if _state(pid) != "Z"]

    def _kill_strays(self, keep_live: bool, wait: bool = True) -> None:
        """SIGKILL every stray process; with `wait`, again until none is left (a fork bomb forks on)."""
        for attempt in range(200 if wait else 1):
            victims = self._strays(keep_live)
            if not victims:
                break
            for victim in victims:
                with contextlib.suppress(OSError):
                    os.kill(victim, signal.SIGKILL)
            self._reap_orphans()
            if attempt:
                time.sleep(0.001)
        self._reap_orphans()

    def _kill_live(self, wait: bool = False) -> int | None:
        """Kill the live interpreter and everything it started.

        With `wait`, wait until they are gone and return the interpreter's wait status; without,
        return at once (SIGKILL cannot be ignored; the dead are reaped later).
        """
        if self.live is None:
            return None
        pid, parent = self.live_pid, self.live_parent
        self.live.close()
        self.live = None
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        self._kill_strays(keep_live=False, wait=wait)
        if not wait:
            return None
        status: int | None = None
        if parent is not None and parent in self.checkpoints:
            channel = self.checkpoints[parent].channel
            try:
                channel.send({"op": "reap", "pid": pid})
                reply, _ = channel.recv()
                status = reply.get("status")
            except (Closed, OSError):
                status = None
        if status is None:  # our own child, or an orphan that came back to us
            status = _wait(pid, 2.0)
            self._reap_orphans()
            status = self.statuses.pop(pid, status)
        self._reap_orphans()
        return status

    def _spawn(self, checkpoint_id: int, files: bool) -> bool:
        """Make a new live interpreter, forked from checkpoint `checkpoint_id`.

        Cell code can kill a checkpoint (it may be the interpreter's parent). A lost pristine
        checkpoint is made again from scratch; for any other, this returns False.
        """
        checkpoint = self.checkpoints.get(checkpoint_id)
        try:
            if checkpoint is None:
                raise Closed
            for attempt in range(100):  # a fork fails while killed processes still count
                checkpoint.channel.send({"op": "spawn", "files": files})
                reply, fds = checkpoint.channel.recv()
                if fds:
                    break
                self._reap_orphans()
                time.sleep(0.002 * attempt)
        except (Closed, OSError):
            if checkpoint is not None:
                del self.checkpoints[checkpoint_id]
                self._drop(checkpoint)
            if checkpoint_id != PRISTINE:
                return False
            self.start()
            return True
        if not fds:
            raise RuntimeError(f"could not start an interpreter: {reply.get('error')}")
        self.live = Channel(socket.socket(fileno=fds[0]))
        self.live_pid = int(reply["spawned"])
        self.live_parent = checkpoint_id
        return True

    def _reply(self, sequence: int) -> tuple[dict[str, Any], list[int]]:
        """The live interpreter's reply to request `sequence`, skipping stale or forged frames."""
        assert self.live is not None
        while True:
            reply, fds = self.live.recv()
            if reply.get("seq") == sequence:
                return reply, fds
            for fd in fds:
                os.close(fd)

    def _fork(self, checkpoint_id: int, files: bool = True) -> bool:
        """Ask the live interpreter to fork a checkpoint; False if its files were too big."""
        assert self.live is not None
        self.sequence += 1
        self.live.send({"op": "fork", "files": files, "seq": self.sequence})
        reply, fds = self._reply(self.sequence)
        if not fds:
            return False
        sock = socket.socket(fileno=fds[0])
        sock.settimeout(_CHECKPOINT_TIMEOUT)  # a checkpoint that cell code stopped counts as lost
        self.checkpoints[checkpoint_id] = Checkpoint(Channel(sock), int(reply["forked"]))
        return True

    def _drop(self, checkpoint: Checkpoint) -> None:
        with contextlib.suppress(OSError):
            checkpoint.channel.send({"op": "exit"})
        checkpoint.channel.close()
        with contextlib.suppress(OSError):
            os.kill(checkpoint.pid, signal.SIGKILL)
        _wait(checkpoint.pid, 0.5)
        self._reap_orphans()

    def start(self) -> None:
        """Start a fresh interpreter from the manager's memory and keep its pristine checkpoint."""
        self._kill_live()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        interpreter = Interpreter(self.config)
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                _after_fork((theirs.fileno(),))
                _set_interpreter_signals()
                serve_interpreter(interpreter, Channel(theirs))
            finally:
                os._exit(0)
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # as the child does; whichever runs first
        theirs.close()
        self.live, self.live_pid, self.live_parent = Channel(ours), pid, None
        if not self._fork(PRISTINE, files=False):
            raise RuntimeError("the pristine checkpoint could not be taken")

    # requests ----------------------------------------------------------------------------

    def _run(self, request: dict[str, Any]) -> None:
        if self.live is None:
            self._spawn(PRISTINE, files=False)
        assert self.live is not None
        self.sequence += 1
        self.live.send({**request, "seq": self.sequence})
        selector = selectors.DefaultSelector()
        selector.register(self.live.sock, selectors.EVENT_READ, "live")
        selector.register(self.host.sock, selectors.EVENT_READ, "host")
        try:
            while True:
                if self.host.pending():
                    ready = ["host"]
                elif self.live.pending():
                    ready = ["live"]
                else:
                    ready = [key.data for key, _ in selector.select()]
                if "live" in ready:
                    try:
                        reply, fds = self.live.recv()
                        if reply.get("seq") != self.sequence:  # stale, or forged by cell code
                            for fd in fds:
                                os.close(fd)
                            continue
                    except (Closed, OSError, ValueError):
                        status = self._kill_live(wait=True)
                        self._spawn(PRISTINE, files=False)
                        self.host.send({"died": describe_status(status)})
                        return
                    for fd in fds:
                        os.close(fd)
                    # Processes a cell started do not outlive it.
                    self._kill_strays(keep_live=True)
                    self.host.send({"result": _checked(reply, int(self.config["max_output_chars"]))})
                    return
                if "host" in ready:
                    message, _ = self.host.recv()
                    if message.get("op") == "kill":
                        self._kill_live(wait=True)
                        self._spawn(PRISTINE, files=False)
                        self.host.send({"killed": True})
                        return
                    if message.get("op") == "exit":
                        raise SystemExit(0)
        finally:
            selector.close()

    def handle(self, request: dict[str, Any]) -> None:
        """Serve one request from the host."""
        op = request.get("op")
        if op == "run":
            self._run(request)
        elif op in ("kill", "restart"):
            # "kill" can arrive just after a cell finished; the host has reported the cell as
            # timed out with its state lost, so the interpreter restarts either way.
            self._kill_live(wait=op == "kill")
            self._spawn(PRISTINE, files=False)
            self.host.send({"killed": True})
        elif op == "reset":
            self._kill_live()
            _clear_dir(self.config["scratch"])
            self._spawn(PRISTINE, files=False)
            self.host.send({"ok": True})
        elif op == "checkpoint":
            ok = self._fork(int(request["id"])) if self.live is not None else False
            self.host.send({"ok": ok})
        elif op == "restore":
            checkpoint_id = int(request["id"])
            if checkpoint_id not in self.checkpoints:
                self.host.send({"ok": False})
                return
            self._kill_live()
            if self._spawn(checkpoint_id, files=bool(request.get("files", True))):
                self.host.send({"ok": True})
            else:
                self._spawn(PRISTINE, files=False)
                self.host.send({"ok": False})
        elif op == "drop":
            checkpoint = self.checkpoints.pop(int(request["id"]), None)
            if checkpoint is not None:
                if self.live_parent == int(request["id"]):
                    self.live_parent = None
                self._drop(checkpoint)
            self.host.send({"ok": True})
        elif op == "ping":
            self.host.send({"pong": os.getpid(), "live": self.live_pid})
        else:
            self.host.send({"error": f"unknown op {op!r}"})

    def serve(self) -> None:
        """Serve the host until it says exit or goes away; then kill everything."""
        try:
            while True:
                try:
                    request, _ = self.host.recv()
                except (Closed, OSError):
                    return
                if request.get("op") == "exit":
                    return
                try:
                    self.handle(request)
                except SystemExit:
                    return
                except Exception as exc:  # a broken manager: the host restarts the sandbox
                    with contextlib.suppress(OSError):
                        self.host.send({"broken": f"{type(exc).__name__}: {exc}"})
                    return
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """Kill the live interpreter, the checkpoints and anything they started."""
        self._kill_live(wait=True)
        for checkpoint in list(self.checkpoints.values()):
            self._drop(checkpoint)
        self.checkpoints.clear()
        self._kill_strays(keep_live=False)
        with contextlib.suppress(OSError):
            self.host.send({"bye": True})


def _checked(reply: dict[str, Any], limit: int) -> dict[str, Any]:
    """A cell's result as the interpreter sent it, with the types and sizes the host expects.

    The interpreter runs cell code, which can write its own frames; nothing it sends is trusted.
    """
    room = limit + 200  # the truncation note
    error = reply.get("error")
    duration = reply.get("duration")
    return {
        "stdout": reply["stdout"][:room] if isinstance(reply.get("stdout"), str) else "",
        "stderr": reply["stderr"][:room] if isinstance(reply.get("stderr"), str) else "",
        "error": None if error is None else str(error)[:room],
        "duration": float(duration) if isinstance(duration, (int, float)) else 0.0,
    }


def _children(pid: int) -> list[int]:
    """The children of `pid` (all its threads'), from /proc/PID/task/*/children."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as handle:
                found += [int(x) for x in handle.read().split()]
        except OSError:
            continue
    return found


def _tree(pid: int, keep: set[int]) -> list[int]:
    """Every descendant of `pid`, except the processes in `keep` and everything below them."""
    below: list[int] = []
    frontier = [child for child in _children(pid) if child not in keep]
    while frontier:
        current = frontier.pop()
        below.append(current)
        frontier += [child for child in _children(current) if child not in keep]
    return below


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return "Z"
    return stat[stat.rfind(b")") + 2 :].split()[0].decode()


def _set_interpreter_signals() -> None:
    # Writing past RLIMIT_FSIZE raises OSError(EFBIG) instead of killing the interpreter.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


# --------------------------------------------------------------------------------------------
# Start-up: privileges, mounts and limits


_LIBC: Any = None


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _prctl(option: int, value: int) -> None:
    _libc().prctl(option, value, 0, 0, 0)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    result = _libc().mount(
        source.encode() if source else None,
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = (
    1,
    2,
    4,
    32,
    4096,
    16384,
    1 << 18,
)


def _setup_mounts(config: dict[str, Any]) -> None:
    """Namespace fallback: read-only host, tmpfs over hidden paths, the scratch directory bound rw."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    keep = {path: os.open(path, os.O_PATH) for path in [config["scratch"], *config["reveal"]]}
    # A read-only recursive bind of / on itself, then everything else goes on top of it.
    _mount("/", "/", None, _MS_BIND | _MS_REC)
    with open("/proc/self/mountinfo") as handle:
        mounts = handle.read().splitlines()
    for line in reversed(mounts):
        target = line.split()[4]
        with contextlib.suppress(OSError):
            _mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)
    for hidden in config["hide"]:
        if os.path.isdir(hidden):
            _mount("tmpfs", hidden, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
    for path, fd in keep.items():
        os.makedirs(path, mode=0o755, exist_ok=True)
        flags = _MS_BIND | _MS_REC
        _mount(f"/proc/self/fd/{fd}", path, None, flags)
        # A bind mount starts with its source's flags (read-only here): set the ones wanted.
        writable = path == config["scratch"]
        _mount(None, path, None, _MS_REMOUNT | _MS_BIND | (0 if writable else _MS_RDONLY))
        os.close(fd)


def _apply_limits(config: dict[str, Any]) -> None:
    megabyte = 1 << 20
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if config.get("memory_mb"):
        size = int(config["memory_mb"]) * megabyte
        resource.setrlimit(resource.RLIMIT_AS, (size, size))
    if config.get("file_size_mb"):
        size = int(config["file_size_mb"]) * megabyte
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    if config.get("cpu_seconds"):
        seconds = int(config["cpu_seconds"])
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))
    if config.get("max_processes"):
        count = int(config["max_processes"])
        resource.setrlimit(resource.RLIMIT_NPROC, (count, count))


def _drop_privileges(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def main(argv: list[str]) -> None:
    """Set up the sandbox from the config in argv[1], then serve the host."""
    config: dict[str, Any] = json.loads(argv[1])
    if config.get("mounts"):
        _setup_mounts(config)
    if config.get("uid") is not None:
        _drop_privileges(int(config["uid"]))
    if config.get("parent_death"):
        _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the host process
    if os.getpid() != 1:
        _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans of the interpreters come back to us
    os.chdir(config["scratch"])
    if config.get("connect"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(config["connect"])
    else:
        sock = socket.socket(fileno=int(config["fd"]))
    _apply_limits(config)
    for fd in (0, 1, 2):
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, fd)
        os.close(null)
    host = Channel(sock)
    manager = Manager(config, host)
    try:
        manager.start()
    except Exception as exc:
        host.send({"failed": f"{type(exc).__name__}: {exc}"})
        manager.shutdown()
        return
    host.send({"ready": os.getpid()})
    manager.serve()


if __name__ == "__main__":
    main(sys.argv)
