"""ProcessSandbox (and DockerSandbox where an engine runs): cells, timeouts, snapshots, fail-closed."""

from __future__ import annotations

import os
import pickle
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from unittest import mock

import pytest

from tests.tools._sandbox_helpers import (
    NO_ISOLATION_REASON,
    descendants,
    docker_unavailable,
    isolation_here,
    make,
)
from trace_gym.errors import ConfigError, SnapshotError
from trace_gym.tools import sandbox as sandbox_module
from trace_gym.tools.sandbox import (
    CellResult,
    ProcessSandbox,
    PythonSandbox,
    SandboxError,
    SandboxState,
    fingerprint,
    make_sandbox,
)

needs_isolation = pytest.mark.skipif(isolation_here() == "none", reason=NO_ISOLATION_REASON)

BACKENDS = [
    pytest.param("process", marks=needs_isolation),
    pytest.param(
        "docker",
        marks=pytest.mark.skipif(docker_unavailable() is not None, reason=str(docker_unavailable())),
    ),
]


@pytest.fixture(params=BACKENDS)
def box(request: pytest.FixtureRequest) -> Iterator[PythonSandbox]:
    sandbox = make(request.param, timeout=5.0, memory_mb=1024)
    try:
        yield sandbox
    finally:
        sandbox.close()


@pytest.fixture
def process_box() -> Iterator[ProcessSandbox]:
    if isolation_here() == "none":
        pytest.skip(NO_ISOLATION_REASON)
    sandbox = ProcessSandbox(timeout=5.0, memory_mb=1024)
    try:
        yield sandbox
    finally:
        sandbox.close()


# -- cells -----------------------------------------------------------------------------------------


def test_notebook_semantics(box: PythonSandbox) -> None:
    assert box.run("import math\nx = 6 * 7\ndef double(v):\n    return 2 * v").error is None
    assert box.run("print(double(x), math.floor(2.5))").stdout == "84 2\n"
    assert box.run("x + 1").stdout == "43\n"  # a trailing expression is shown like a REPL
    assert box.run("y = x").stdout == ""
    assert box.run("None").stdout == ""


def test_exception_is_an_error_observation(box: PythonSandbox) -> None:
    result = box.run("a = 1\n1 / 0")
    assert result.error == "ZeroDivisionError: division by zero"
    assert "Traceback" in result.stderr and "<cell" in result.stderr
    assert not result.timed_out
    assert box.run("a").stdout == "1\n"  # the interpreter survives its cell's exception
    assert box.run("syntax error here").error.startswith("SyntaxError")  # type: ignore[union-attr]
    assert box.run("import sys; sys.exit(3)").error == "SystemExit: 3"
    assert box.run("a").stdout == "1\n"


def test_timeout_restarts_the_interpreter(box: PythonSandbox) -> None:
    box.run("x = 1")
    start = time.perf_counter()
    result = box.run("while True: pass", timeout=0.5)
    assert time.perf_counter() - start < 2.5
    assert result.timed_out
    assert result.error is not None and "TimeoutError: cell exceeded 0.5 s" in result.error
    assert "state was lost" in result.error
    after = box.run("x")
    assert after.error == "NameError: name 'x' is not defined"
    assert box.run("x = 2; x").stdout == "2\n"


def test_output_is_capped_inside_the_sandbox(box: PythonSandbox) -> None:
    small = make_sandbox(box.backend, max_output_chars=100, timeout=5.0)
    try:
        result = small.run("print('a' * 10_000_000)")
        assert result.stdout.startswith("a" * 100)
        assert len(result.stdout) < 200 and "truncated" in result.stdout
        assert result.error is not None and result.error.startswith("OutputTruncated")
        assert small.run("print('short')").stdout == "short\n"
    finally:
        small.close()


def test_scratch_directory_is_the_working_directory(box: PythonSandbox) -> None:
    box.run("with open('notes.txt', 'w') as f:\n    f.write('kept')")
    assert box.run("print(open('notes.txt').read())").stdout == "kept\n"


def test_environment_is_whitelisted(process_box: ProcessSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACE_GYM_TEST_SECRET", "hunter2")
    box = ProcessSandbox(timeout=5.0, env={"EXTRA": "yes"})
    try:
        env = box.run("import os; sorted(os.environ)").stdout
        assert "TRACE_GYM_TEST_SECRET" not in env
        assert "EXTRA" in env and "PATH" in env
    finally:
        box.close()


# -- snapshots --------------------------------------------------------------------------------------

PREFIX = [
    "import random\nrandom.seed(7)\nvalues = [random.random() for _ in range(3)]",
    "with open('log.txt', 'w') as f:\n    f.write('one')",
    "total = sum(values)\nprint(round(total, 6))",
]
FOLLOW_UP = [
    "print(random.random())",  # the RNG continues from the checkpoint, not from a reseed
    "print(open('log.txt').read())",
    "total * 2",
    "with open('log.txt', 'a') as f:\n    f.write('two')\nprint(open('log.txt').read())",
]


def _follow_up(box: PythonSandbox) -> list[CellResult]:
    return [box.run(code) for code in FOLLOW_UP]


def _outputs(results: list[CellResult]) -> list[tuple[str, str | None]]:
    return [(r.stdout, r.error) for r in results]


def test_fork_restore_equals_replay_restore(box: PythonSandbox) -> None:
    for code in PREFIX:
        assert box.run(code).error is None
    state = box.checkpoint()
    assert box.live_checkpoints == 1
    original = _outputs(_follow_up(box))
    # Trash the interpreter and the scratch directory, then restore from the fork checkpoint.
    box.run("del values, total\nimport os\nos.remove('log.txt')")
    box.restore(state)
    forked = _outputs(_follow_up(box))
    # A second sandbox has no checkpoint of this state: it restores by replay.
    other = make_sandbox(box.backend, timeout=5.0, checkpoints=0)
    try:
        other.restore(state)
        replayed = _outputs(_follow_up(other))
    finally:
        other.close()
    assert original == forked == replayed
    assert original[1] == ("one\n", None) and original[3] == ("onetwo\n", None)


def test_restore_by_fork_does_not_rerun_cells(box: PythonSandbox) -> None:
    box.run("import time\ntime.sleep(0.5)\nx = 1")
    state = box.checkpoint()
    box.run("x = 2")
    start = time.perf_counter()
    box.restore(state)
    assert time.perf_counter() - start < 0.4  # a replay would sleep 0.5 s
    assert box.run("x").stdout == "1\n"


def test_replay_divergence_raises_snapshot_error(box: PythonSandbox) -> None:
    box.run("import random\nprint(random.random())")  # unseeded: differs on every run
    state = box.checkpoint()
    box.run("z = 1")
    box.restore(state)  # the fork checkpoint reproduces it exactly
    other = make_sandbox(box.backend, timeout=5.0, checkpoints=0)
    try:
        with pytest.raises(SnapshotError, match=r"replaying cell 1 of 1 did not reproduce"):
            other.restore(state)
    finally:
        other.close()


def test_replay_ignores_memory_addresses(process_box: ProcessSandbox) -> None:
    process_box.run("def f():\n    pass\nf")  # prints <function f at 0x7f...>
    state = process_box.checkpoint()
    other = ProcessSandbox(timeout=5.0, checkpoints=0)
    try:
        other.restore(state)
        assert other.run("f()").error is None
    finally:
        other.close()


def test_restore_time_does_not_grow_with_depth(process_box: ProcessSandbox) -> None:
    timings = {}
    for depth in (1, 16):
        process_box.reset()
        process_box.run("import time\ntime.sleep(0.05)")
        for index in range(depth - 1):
            process_box.run(f"v{index} = {index}")
        state = process_box.checkpoint()
        process_box.run("w = 0")
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            process_box.restore(state)
            best = min(best, time.perf_counter() - start)
            process_box.run("w = 1")
        timings[depth] = best
    # Replay would take 50 ms (the sleeping cell) plus a round trip per cell.
    assert timings[1] < 0.05 and timings[16] < 0.05, timings


def test_restore_extends_the_longest_checkpointed_prefix(process_box: ProcessSandbox) -> None:
    process_box.run("import time\ntime.sleep(0.4)\na = 1")
    process_box.checkpoint()
    process_box.run("b = a + 1")
    longer = process_box.checkpoint()
    process_box.run("c = 0")
    process_box.reset()
    process_box.restore(SandboxState(longer.cells[:1]))  # exact checkpoint
    start = time.perf_counter()
    process_box.restore(SandboxState((*longer.cells, ("d = b * 10", None, fingerprint(_ok())))))
    assert time.perf_counter() - start < 0.35  # forked at depth 2, replayed one cell
    assert process_box.run("print(a, b, d)").stdout == "1 2 20\n"


def _ok() -> CellResult:
    return CellResult("", "", None, False, 0.0)


def test_timed_out_cell_replays_without_waiting(process_box: ProcessSandbox) -> None:
    process_box.run("before = 1")
    assert process_box.run("while True: pass", timeout=1.0).timed_out
    process_box.run("after = 2")
    state = process_box.checkpoint()
    other = ProcessSandbox(timeout=5.0, checkpoints=0)
    try:
        other.run("pass")  # started: time the replay only
        start = time.perf_counter()
        other.restore(state)
        assert time.perf_counter() - start < 0.9
        assert other.run("after").stdout == "2\n"
        assert other.run("before").error == "NameError: name 'before' is not defined"
    finally:
        other.close()


def test_open_files_stay_usable_after_a_fork_restore(process_box: ProcessSandbox) -> None:
    # The scratch files come back as they were; an open handle still works (on the file it had open).
    process_box.run("f = open('log.txt', 'w')\nf.write('a')\nf.flush()")
    state = process_box.checkpoint()
    process_box.run("f.write('b')\nf.flush()")
    process_box.restore(state)
    result = process_box.run("f.write('c')\nf.flush()\nprint(open('log.txt').read())")
    assert (result.stdout, result.error) == ("a\n", None)


def test_a_big_scratch_directory_is_not_checkpointed_but_replays(process_box: ProcessSandbox) -> None:
    box = ProcessSandbox(timeout=5.0, snapshot_files_mb=0.001)  # 1 KiB
    try:
        box.run("open('big.txt', 'w').write('x' * 10_000)\nn = 1")
        state = box.checkpoint()
        assert box.live_checkpoints == 0
        box.run("import os\nos.remove('big.txt')\nn = 2")
        box.restore(state)  # by replay: the cell writes the file again
        assert box.run("print(n, len(open('big.txt').read()))").stdout == "1 10000\n"
    finally:
        box.close()


def test_branches_from_one_state_are_isolated(box: PythonSandbox) -> None:
    box.run("x = [1]")
    state = box.checkpoint()
    box.run("x.append(2)")
    other = make_sandbox(box.backend, timeout=5.0)
    try:
        other.restore(state)
        other.run("x.append(3)")
        assert box.run("x").stdout == "[1, 2]\n"
        assert other.run("x").stdout == "[1, 3]\n"
        box.restore(state)
        assert box.run("x").stdout == "[1]\n"
        assert other.run("x").stdout == "[1, 3]\n"
    finally:
        other.close()


def test_state_is_a_plain_value(process_box: ProcessSandbox) -> None:
    process_box.run("x = 1")
    state = process_box.checkpoint()
    assert pickle.loads(pickle.dumps(state)) == state
    assert hash(state) == hash(SandboxState(state.cells))
    code, timeout, digest = state.cells[0]
    assert (code, timeout) == ("x = 1", None) and len(digest) == 32


def test_checkpoints_are_a_bounded_lru(process_box: ProcessSandbox) -> None:
    small = ProcessSandbox(timeout=5.0, checkpoints=2)
    try:
        states = []
        for index in range(4):
            small.run(f"x = {index}")
            states.append(small.checkpoint())
        assert small.live_checkpoints == 2
        small.restore(states[0])  # evicted: replayed
        assert small.run("x").stdout == "0\n"
        small.restore(states[3])
        assert small.run("x").stdout == "3\n"
    finally:
        small.close()


def test_reset_gives_a_fresh_interpreter_and_scratch(box: PythonSandbox) -> None:
    box.run("x = 1\nopen('f', 'w').write('x')")
    box.reset()
    assert box.run("x").error == "NameError: name 'x' is not defined"
    assert box.run("import os; os.listdir('.')").stdout == "[]\n"
    assert [code for code, _, _ in box.checkpoint().cells] == ["x", "import os; os.listdir('.')"]


def test_restore_empty_state(box: PythonSandbox) -> None:
    box.run("x = 1")
    box.restore(SandboxState())
    assert box.run("x").error == "NameError: name 'x' is not defined"


# -- life cycle, isolation report, fail-closed ---------------------------------------------------------


def test_repr_shows_backend_and_isolation(process_box: ProcessSandbox) -> None:
    assert process_box.isolation in ("bubblewrap", "namespaces")
    assert f"ProcessSandbox(isolation={process_box.isolation!r}" in repr(process_box)
    assert "not started" in repr(process_box)
    process_box.run("1")
    assert "running" in repr(process_box)
    process_box.close()
    assert "closed" in repr(process_box)


def test_constructing_and_closing_is_cheap_and_leaves_nothing(process_box: ProcessSandbox) -> None:
    before = descendants(os.getpid())
    start = time.perf_counter()
    ProcessSandbox().close()
    assert time.perf_counter() - start < 0.5
    box = ProcessSandbox()
    box.run("import subprocess\np = subprocess.Popen(['sleep', '60'])")
    box.checkpoint()
    box.close()
    box.close()  # idempotent
    assert descendants(os.getpid()) == before
    with pytest.raises(SandboxError, match="closed"):
        box.run("1")


def test_auto_fails_closed_without_an_isolation_primitive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_module, "detect_isolation", lambda: "none")
    with pytest.raises(SandboxError, match=r"apt-get install bubblewrap") as caught:
        ProcessSandbox()
    assert "isolation='none'" in str(caught.value)


def test_explicit_primitive_that_is_missing_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_module, "_bubblewrap_works", lambda bwrap: False)
    with pytest.raises(SandboxError, match=r"`bwrap` is missing or does not work"):
        ProcessSandbox(isolation="bubblewrap")


def test_isolation_none_warns_and_still_runs() -> None:
    with pytest.warns(RuntimeWarning, match="without file-system or network isolation"):
        box = ProcessSandbox(isolation="none", timeout=5.0)
    try:
        assert box.isolation == "none"
        assert box.run("x = 2; x * 21").stdout == "42\n"
        assert box.run("while True: pass", timeout=0.3).timed_out
        state = box.checkpoint()
        box.restore(state)
    finally:
        box.close()


def test_configuration_errors() -> None:
    with pytest.raises(ConfigError, match=r"valid backends are \['docker', 'process'\]"):
        make_sandbox("vm")
    with pytest.raises(ConfigError, match="isolation must be one of"):
        ProcessSandbox(isolation="chroot")
    with pytest.raises(ConfigError, match="timeout must be a positive number"):
        ProcessSandbox(timeout=0)
    with pytest.raises(ConfigError, match="memory_mb must be a positive integer"):
        ProcessSandbox(memory_mb=0)
    with pytest.raises(TypeError):
        make_sandbox("process", memory_gb=1)


@pytest.mark.skipif(isolation_here() == "none", reason=NO_ISOLATION_REASON)
def test_namespaces_fallback_isolates_too() -> None:
    from trace_gym.tools.sandbox import _namespaces_work

    if not _namespaces_work("unshare"):
        pytest.skip("`unshare` cannot create user, mount and network namespaces here")
    box = ProcessSandbox(isolation="namespaces", timeout=5.0)
    try:
        assert box.run("open('here.txt', 'w').write('ok')").error is None
        assert box.run("open('/usr/evil', 'w')").error.startswith("OSError: [Errno 30]")  # type: ignore[union-attr]
        hidden = box.run(f"open({sandbox_module.__file__!r}).read()")
        assert hidden.error is not None and "No such file" in hidden.error
        net = box.run("import socket; socket.create_connection(('192.0.2.1', 80), timeout=1)")
        assert net.error is not None and "unreachable" in net.error
        assert box.run("import os; os.getpid()").stdout != ""
    finally:
        box.close()


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"),
    reason="needs root, setpriv and /usr/bin/python3 to run the sandbox as an unprivileged user",
)
@pytest.mark.skipif(isolation_here() != "bubblewrap", reason="bubblewrap is not available here")
def test_bubblewrap_as_an_unprivileged_user() -> None:
    # CI runs as root (a fresh uid, no user namespace); a normal user gets a user namespace instead.
    # Build that command line and run it as `nobody` with the system Python (stdlib is all it needs).
    with (
        mock.patch.object(os, "geteuid", return_value=65534),
        mock.patch.object(sandbox_module, "_python_paths", return_value=["/usr"]),
    ):
        box = ProcessSandbox(isolation="bubblewrap", python="/usr/bin/python3")
        os.chown(box.scratch, 65534, 65534)
        config = box._worker_config()
        ours, theirs = socket.socketpair()
        config["fd"] = theirs.fileno()
        command = box._command(config)
    assert "--unshare-user" in command and "--cap-add" not in command
    setpriv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    process = subprocess.Popen(
        [*setpriv, *command], pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=box._environment()
    )
    theirs.close()
    connection = sandbox_module._Connection(ours)
    try:
        assert connection.receive(10.0) == {"ready": 1}
        connection.send({"op": "run", "code": "import os; print(os.getuid(), sorted(os.listdir('/root')))"})
        reply = connection.receive(10.0)
        assert reply is not None and reply["result"]["stdout"] == "65534 []\n"
        connection.send({"op": "run", "code": "import socket; socket.create_connection(('1.1.1.1', 443), 1)"})
        reply = connection.receive(10.0)
        assert reply is not None and "unreachable" in reply["result"]["error"]
        assert connection.request({"op": "checkpoint", "id": 1}) == {"ok": True}
        assert connection.request({"op": "restore", "id": 1}) == {"ok": True}
        assert connection.request({"op": "exit"}) == {"bye": True}
        assert process.wait(5.0) == 0
    finally:
        connection.close()
        if process.poll() is None:
            process.kill()
            process.wait()
        box.close()


def test_a_lost_manager_restarts_the_whole_sandbox() -> None:
    # Without isolation, cell code can kill the manager (elsewhere it is pid 1 of the sandbox and
    # cannot be signalled): the sandbox starts again, and the log replays that as a restart.
    with pytest.warns(RuntimeWarning):
        box = ProcessSandbox(isolation="none", timeout=5.0)
    try:
        box.run("x = 1")
        result = box.run("import os, signal, time\nos.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(0.3)")
        assert result.error is not None
        assert result.error.startswith("the interpreter died (its sandbox stopped")
        assert box.restarts == 1
        assert box.run("x").error == "NameError: name 'x' is not defined"
        box.run("y = 2")
        state = box.checkpoint()
        assert state.cells[1][2].startswith("restart:")
        with pytest.warns(RuntimeWarning):
            other = ProcessSandbox(isolation="none", timeout=5.0, checkpoints=0)
        try:
            other.restore(state)  # replays x = 1, restarts instead of the fatal cell, then the rest
            assert other.run("y").stdout == "2\n"
            assert other.run("x").error == "NameError: name 'x' is not defined"
            assert other.restarts == 0
        finally:
            other.close()
    finally:
        box.close()
