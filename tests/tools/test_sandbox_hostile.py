"""Hostile cells against both sandboxes.

Each cell must end in an error observation within its time limit, leave this process and another
live sandbox unharmed (it keeps its variables), and leave no process behind: the sandbox's process
count (host view: the launcher's descendants, or the container's cgroup) returns to what it was.
One sandbox per backend takes every attack in turn, so each test also shows it recovered from the
ones before.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import trace_gym
from tests.tools._sandbox_helpers import (
    NO_ISOLATION_REASON,
    descendants,
    docker_unavailable,
    isolation_here,
    make,
    sandbox_processes,
    settle,
    stable,
)
from trace_gym.tools.sandbox import PythonSandbox

TIMEOUT = 2.0
MEMORY_MB = 512


@dataclass
class Arena:
    box: PythonSandbox
    bystander: PythonSandbox
    count: Callable[[], int]
    baseline: int


BACKENDS = [
    pytest.param("process", marks=pytest.mark.skipif(isolation_here() == "none", reason=NO_ISOLATION_REASON)),
    pytest.param(
        "docker",
        marks=pytest.mark.skipif(docker_unavailable() is not None, reason=str(docker_unavailable())),
    ),
]


@pytest.fixture(scope="module", params=BACKENDS)
def arena(request: pytest.FixtureRequest) -> Iterator[Arena]:
    before = descendants(os.getpid())
    box = make(request.param, timeout=TIMEOUT, memory_mb=MEMORY_MB, file_size_mb=16)
    bystander = make(request.param, timeout=TIMEOUT, memory_mb=MEMORY_MB)
    try:
        assert box.run("ready = True").error is None
        assert bystander.run("x = 42").error is None
        count = sandbox_processes(box)
        yield Arena(box, bystander, count, stable(count))
        # The manager (pid 1 of the sandbox) survived every attack: no restart of the whole sandbox.
        assert box.restarts == 0
    finally:
        box.close()
        bystander.close()
    assert descendants(os.getpid()) == before


def attack(arena: Arena, code: str, timeout: float = TIMEOUT, slack: float = 1.5) -> str:
    """Run `code`; check the error observation, the time, the bystander and the process count.

    `slack`: seconds allowed past `timeout` to kill what the cell started and restart the interpreter.
    """
    start = time.perf_counter()
    result = arena.box.run(code, timeout=timeout)
    elapsed = time.perf_counter() - start
    assert result.error is not None, result
    assert elapsed < timeout + slack, (elapsed, result.error)
    assert arena.bystander.run("x").stdout == "42\n"
    # At most the baseline: a checkpoint that the cell killed is made again only when needed.
    assert settle(arena.count, arena.baseline) <= arena.baseline, "a process was left behind"
    assert arena.box.run("print('alive')").stdout == "alive\n"
    assert settle(arena.count, arena.baseline) <= arena.baseline
    return result.error


def test_infinite_loop(arena: Arena) -> None:
    error = attack(arena, "while True:\n    pass")
    assert error.startswith("TimeoutError")


def test_fork_bomb(arena: Arena) -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    error = attack(arena, code, timeout=1.0, slack=3.0)  # up to 256 processes to kill and reap
    assert error.startswith("TimeoutError")


def test_fork_bomb_that_gives_up(arena: Arena) -> None:
    # The cell's own fork fails at the process limit; the copies it made are killed after the cell.
    error = attack(arena, "import os\nwhile True:\n    os.fork()", timeout=1.0, slack=3.0)
    assert "BlockingIOError" in error or "TimeoutError" in error


def test_background_process_does_not_outlive_its_cell(arena: Arena) -> None:
    code = "import subprocess\nsubprocess.Popen(['sleep', '60'], start_new_session=True)\nraise SystemExit(1)"
    assert attack(arena, code) == "SystemExit: 1"


def test_allocating_10_gb(arena: Arena) -> None:
    assert attack(arena, "block = bytearray(10 * 1024**3)") == "MemoryError"


def test_writing_a_1_gb_file(arena: Arena) -> None:
    code = "with open('big.bin', 'wb') as f:\n    for _ in range(1024):\n        f.write(b'0' * 1024**2)"
    error = attack(arena, code)
    assert "File too large" in error or "No space left" in error
    arena.box.run("import os\nos.remove('big.bin')")


def test_reading_host_files(arena: Arena, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the host's secret")
    source = Path(trace_gym.__file__).parent / "env.py"
    for path in [secret, source, Path("/root/.ssh/id_rsa"), Path("/etc/shadow")]:
        error = attack(arena, f"print(open({str(path)!r}).read())")
        assert "No such file" in error or "Permission denied" in error, (path, error)
    listing = arena.box.run("import os\nsorted(os.listdir('/root')) if os.path.isdir('/root') else []")
    assert ".ssh" not in listing.stdout and ".bashrc" not in listing.stdout


def test_writing_outside_scratch(arena: Arena) -> None:
    error = attack(arena, "open('/usr/trace_gym_was_here', 'w')")
    assert "Read-only file system" in error or "Permission denied" in error
    assert not Path("/usr/trace_gym_was_here").exists()


def test_socket_to_a_host_listener(arena: Arena) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    try:
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')"
        error = attack(arena, code)
        assert "Connection refused" in error or "unreachable" in error or "timed out" in error
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


def test_socket_to_an_outside_address(arena: Arena) -> None:
    error = attack(arena, "import socket\nsocket.create_connection(('1.1.1.1', 443), timeout=1)")
    assert "unreachable" in error or "timed out" in error or "refused" in error


def test_signalling_the_parents(arena: Arena) -> None:
    # The interpreter's parent (a checkpoint or the manager) may die; the host's pid is not even visible.
    code = f"import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill({os.getpid()}, signal.SIGKILL)"
    assert attack(arena, code).startswith("ProcessLookupError")
    assert attack(arena, "import os, signal\nos.kill(1, signal.SIGKILL)\nos.kill(1, signal.SIGSTOP)\n1/0")
    assert attack(arena, "import os, signal\nos.kill(-1, signal.SIGKILL)\n1/0")


def test_os_exit(arena: Arena) -> None:
    assert (
        attack(arena, "import os\nos._exit(3)") == "the interpreter died (exit status 3); its state was reset"
    )


def test_segfault_through_ctypes(arena: Arena) -> None:
    error = attack(arena, "import ctypes\nctypes.string_at(0)")
    assert error == "the interpreter died (signal 11: SIGSEGV); its state was reset"


def test_printing_100_mb(arena: Arena) -> None:
    error = attack(arena, "print('x' * (100 * 1024**2))")
    assert error.startswith("OutputTruncated: the cell wrote 104857601 characters")


def test_printing_100_mb_in_small_writes(arena: Arena) -> None:
    error = attack(arena, "line = 'x' * 1023\nfor _ in range(100 * 1024):\n    print(line)")
    assert error.startswith("OutputTruncated")


def test_unbounded_recursion(arena: Arena) -> None:
    assert attack(arena, "def f(n):\n    return f(n + 1)\nf(0)").startswith("RecursionError")


def test_recursion_past_the_limit(arena: Arena) -> None:
    code = "import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1)\nf(0)"
    error = attack(arena, code)
    assert error.startswith(("TimeoutError", "MemoryError", "RecursionError", "the interpreter died"))


def test_the_host_is_unharmed(arena: Arena) -> None:
    assert os.getpid() > 0 and signal.getsignal(signal.SIGTERM) is not None
    assert arena.box.run("6 * 7").stdout == "42\n"
    assert arena.bystander.run("x").stdout == "42\n"


def test_forged_frames_to_the_manager(arena: Arena) -> None:
    # Cell code can reach the interpreter's socket; the manager trusts nothing that comes over it.
    channel = "import os, struct, sys\nfd = sys.modules['__main__']._SERVING['fd']\n"
    huge = attack(arena, channel + "os.write(fd, struct.pack('>I', 2**31))")
    assert huge.startswith("the interpreter died")
    forged = arena.box.run(
        channel + "os.write(fd, struct.pack('>I', 13) + b'{\"stdout\": 5}')\nprint('real')"
    )
    assert (forged.stdout, forged.error) == (
        "real\n",
        None,
    )  # the frame without the request's number is dropped
    assert arena.box.run("print('next')").stdout == "next\n"


def test_huge_exception_message(arena: Arena) -> None:
    error = attack(arena, "raise ValueError('v' * 10**7)")
    assert error.startswith("ValueError: vvv") and len(error) < 20_000


@pytest.mark.slow  # about 4 s: five attacks, two of them run to their timeout
@pytest.mark.skipif(isolation_here() == "none", reason=NO_ISOLATION_REASON)
def test_namespaces_fallback_takes_the_worst_attacks(tmp_path: Path) -> None:
    from trace_gym.tools.sandbox import ProcessSandbox, _namespaces_work

    if not _namespaces_work("unshare"):
        pytest.skip("`unshare` cannot create user, mount and network namespaces here")
    before = descendants(os.getpid())
    box = ProcessSandbox(isolation="namespaces", timeout=1.0, memory_mb=MEMORY_MB, file_size_mb=16)
    bystander = ProcessSandbox(isolation="namespaces", timeout=TIMEOUT)
    try:
        box.run("pass")
        bystander.run("x = 42")
        count = sandbox_processes(box)
        arena = Arena(box, bystander, count, stable(count))
        secret = tmp_path / "secret.txt"
        secret.write_text("the host's secret")
        assert "No such file" in attack(arena, f"open({str(secret)!r}).read()")
        bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
        assert attack(arena, bomb, slack=3.0).startswith("TimeoutError")
        outside = "import socket\nsocket.create_connection(('1.1.1.1', 443), timeout=1)"
        assert "unreachable" in attack(arena, outside)
        host = os.getpid()
        parents = f"import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill({host}, signal.SIGKILL)"
        assert attack(arena, parents).startswith("ProcessLookupError")
        assert attack(arena, "import ctypes\nctypes.string_at(0)").endswith("its state was reset")
        assert box.restarts == 0
    finally:
        box.close()
        bystander.close()
    assert descendants(os.getpid()) == before
