from __future__ import annotations

import doctest
import importlib
import pickle
import warnings
from collections.abc import Iterator
from typing import Any

import gymnasium
import pytest
from gymnasium.error import ResetNeeded

from trace_gym import ConfigError, Task, restore, snapshot
from trace_gym.envs.math_python import (
    NO_OUTPUT,
    SYSTEM_PROMPT,
    MathPythonEnv,
    python_call,
)
from trace_gym.errors import MissingDependencyError, SnapshotError
from trace_gym.testing import check_branchable_env
from trace_gym.tools.answers import math_verify_available
from trace_gym.tools.sandbox import SandboxError, detect_isolation, make_sandbox

ENV_ID = "trace_gym/MathPython-v0"
ISOLATION = detect_isolation()
PROCESS = {"isolation": ISOLATION, "timeout": 5.0}
"""The best isolation here ("none" only where the machine has no namespaces or bubblewrap)."""


def _register() -> None:
    if ENV_ID not in gymnasium.registry:
        gymnasium.register(ENV_ID, entry_point="trace_gym.envs.math_python:MathPythonEnv")


def _make(**kwargs: Any) -> gymnasium.Env[str, str]:
    _register()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # isolation="none" warns on machines without any
        env = gymnasium.make(ENV_ID, **kwargs)
        _ = env.unwrapped.sandbox  # type: ignore[attr-defined]
    return env


def _docker_skip_reason() -> str | None:
    try:
        box = make_sandbox("docker")
    except (MissingDependencyError, SandboxError) as exc:
        return f"DockerSandbox is not available here: {exc}"
    box.close()
    return None


@pytest.fixture(scope="module")
def env() -> Iterator[MathPythonEnv]:
    """One bare env reused by the turn-level tests (each resets it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        environment = MathPythonEnv(num_tasks=8, sandbox_kwargs=PROCESS, max_turns=5, max_output_chars=300)
    yield environment
    environment.close()


def _task(answer: str, problem: str = "What is the value?") -> Task:
    return Task("t", problem, answer)


def _reset(env: MathPythonEnv, answer: str = "42") -> str:
    observation, _ = env.reset(seed=0, options={"task": _task(answer)})
    return observation


# ----- the contract -----------------------------------------------------------------------
def test_contract_with_the_process_sandbox() -> None:
    env = _make(num_tasks=4, sandbox_kwargs=PROCESS)
    try:
        report = check_branchable_env(env, seeds=(0, 1, 2), episode_actions=8)
    finally:
        env.close()
    assert report.restores > 50
    assert max(report.episode_lengths.values()) >= 4


@pytest.mark.skipif((reason := _docker_skip_reason()) is not None, reason=reason or "")
def test_contract_with_the_docker_sandbox() -> None:
    env = _make(num_tasks=4, sandbox="docker")
    try:
        assert env.unwrapped.isolation == "docker"  # type: ignore[attr-defined]
        report = check_branchable_env(env, seeds=(0, 2), episode_actions=6, depths=(0, 1, 2, 4))
    finally:
        env.close()
    assert report.restores > 10


@pytest.mark.parametrize("backend", ["process", "docker"])
def test_branches_that_diverge_after_a_variable_was_set_are_isolated(backend: str) -> None:
    if backend == "docker" and (why := _docker_skip_reason()) is not None:
        pytest.skip(why)
    kwargs: dict[str, Any] = {"sandbox_kwargs": PROCESS} if backend == "process" else {"sandbox": "docker"}
    first, second = _make(num_tasks=2, **kwargs), _make(num_tasks=2, **kwargs)
    try:
        first.reset(seed=0)
        first.step(python_call("x = 1"))
        branch = snapshot(first)
        restore(second, branch)
        assert first.step(python_call("x = x + 10\nprint(x)"))[0] == "11"
        assert second.step(python_call("x = x + 100\nprint(x)"))[0] == "101"
        assert first.step(python_call("print(x)"))[0] == "11"
        restore(first, branch)
        assert first.step(python_call("print(x)"))[0] == "1"
        assert second.step(python_call("print(x)"))[0] == "101"
    finally:
        first.close()
        second.close()


def test_a_snapshot_restores_into_a_new_instance_by_replay() -> None:
    env, other = _make(num_tasks=3, sandbox_kwargs=PROCESS), _make(num_tasks=3, sandbox_kwargs=PROCESS)
    try:
        env.reset(seed=1)
        env.step(python_call("import math\ndef f(n):\n    return math.factorial(n)"))
        env.step(python_call("values = [f(n) for n in range(6)]"))
        snap = pickle.loads(pickle.dumps(snapshot(env)))
        expected = env.step(python_call("print(values, f(7))"))
        assert other.unwrapped.isolation is not None  # type: ignore[attr-defined]
        assert other.unwrapped.sandbox.live_checkpoints == 0  # type: ignore[attr-defined]
        restore(other, snap)
        assert other.unwrapped.transcript == env.unwrapped.transcript[:-2]  # type: ignore[attr-defined]
        assert other.step(python_call("print(values, f(7))"))[:4] == expected[:4]
        assert expected[0] == "[1, 1, 2, 6, 24, 120] 5040"
    finally:
        env.close()
        other.close()


def test_the_sandbox_starts_on_first_reset_and_close_stops_it() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        env = MathPythonEnv(num_tasks=2, sandbox_kwargs=PROCESS)
        before = env.isolation
        _, info = env.reset(seed=0)
    assert (before, info["isolation"], env.isolation) == (None, ISOLATION, ISOLATION)
    env.step(python_call("x = 1"))
    snap = env.snapshot()
    env.close()
    env.close()
    after_close = env.isolation
    with pytest.raises(ResetNeeded):
        env.step(python_call("print(x)"))
    with pytest.raises(SnapshotError, match="The env was closed"):
        env.snapshot()
    env.restore(snap)  # a new sandbox after close, by replay
    assert env.step(python_call("print(x)"))[0] == "1"
    env.reset(seed=0)
    assert after_close is None
    assert env.step(python_call("print('again')"))[0] == "again"
    env.close()


# ----- turns ------------------------------------------------------------------------------
def test_reset_shows_the_system_prompt_and_the_problem(env: MathPythonEnv) -> None:
    observation, info = env.reset(seed=3)
    assert env.transcript[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert observation == env.task.prompt  # type: ignore[union-attr]
    assert info["task_id"].startswith("procedural/")
    assert env.tools[0]["function"]["name"] == "python"
    assert env.stop_sequences == ("</tool_call>", "</answer>")


def test_a_python_call_returns_its_output_and_state_persists(env: MathPythonEnv) -> None:
    _reset(env)
    observation, reward, terminated, truncated, info = env.step(python_call("x = 6 * 7\nprint(x)"))
    assert (observation, reward, terminated, truncated) == ("42", 0.0, False, False)
    assert env.transcript[-1] == {"role": "tool", "content": "42"}
    assert info["tool_calls"] == 1 and len(info["tool_durations"]) == 1 and info["tool_errors"] == []
    assert info["isolation"] == ISOLATION
    assert env.step(python_call("x + 1"))[0] == "43"
    assert env.step(python_call("y = 1"))[0] == NO_OUTPUT


def test_an_error_is_shown_after_the_output(env: MathPythonEnv) -> None:
    _reset(env)
    observation, *_, info = env.step(python_call("print('before')\n1 / 0"))
    assert observation.startswith("before\n")
    assert observation.endswith("ZeroDivisionError: division by zero")
    assert info["tool_errors"] == ["ZeroDivisionError: division by zero"]


def test_long_output_is_truncated_and_says_so(env: MathPythonEnv) -> None:
    _reset(env)
    observation = env.step(python_call("print('a' * 5000)"))[0]
    assert observation.startswith("a" * 300 + "\n[output truncated: showing 300 of 5000 characters]")


def test_a_timeout_is_an_error_observation_and_the_episode_goes_on() -> None:
    kwargs = {**PROCESS, "timeout": 1.0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        env = MathPythonEnv(num_tasks=1, sandbox_kwargs=kwargs)
    try:
        env.reset(seed=0)
        env.step(python_call("a = 5"))
        observation, _, terminated, truncated, info = env.step(python_call("while True:\n    pass"))
        assert "Error:" in observation and "Timeout" in observation
        assert not terminated and not truncated and info["tool_errors"]
        assert 1.0 <= info["tool_durations"][0] < 10.0
        assert env.step(python_call("print('alive')"))[0] == "alive"
    finally:
        env.close()


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("I think it is about 40.", "the turn has no tool call and no final answer"),
        ('<tool_call>{"name": "python", "arguments": {"code": </tool_call>', "not valid JSON"),
        ('<tool_call>{"name": "python", "arguments": {"code": "print(1)"}', "no closing </tool_call>"),
        ('<tool_call>{"name": "calculator", "arguments": {"x": 1}}</tool_call>', "unknown tool 'calculator'"),
        ('<tool_call>{"name": "python", "arguments": {}}</tool_call>', "needs a 'code' argument"),
        ('<tool_call>{"name": "python", "arguments": {"code": 5}}</tool_call>', "needs a 'code' argument"),
        ("<answer>  </answer>", "the answer is empty"),
    ],
)
def test_malformed_turns_get_an_error_observation(env: MathPythonEnv, action: str, expected: str) -> None:
    _reset(env)
    observation, reward, terminated, truncated, info = env.step(action)
    assert expected in observation
    assert observation.startswith("Error:")
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, False, False)
    assert env.step(python_call("print('still running')"))[0] == "still running"


def test_only_max_calls_per_turn_calls_run(env: MathPythonEnv) -> None:
    _reset(env)
    calls = "".join(python_call(f"print({i})") for i in range(6))
    env.step(calls)
    tool_messages = [m["content"] for m in env.transcript[3:] if m["role"] == "tool"]
    assert tool_messages == ["0", "1", "2", "3"]
    assert "2 were skipped" in env.transcript[-1]["content"]


def test_the_turn_limit_truncates(env: MathPythonEnv) -> None:
    _reset(env)
    for _ in range(env.max_turns - 1):
        assert env.step(python_call("print(1)"))[3] is False
    _, reward, terminated, truncated, info = env.step(python_call("print(1)"))
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, True, False)


@pytest.mark.parametrize(
    ("action", "reward"),
    [
        ("<answer>42</answer>", 1.0),
        ("The value is \\boxed{42}.", 1.0),
        ("<answer>41</answer>", 0.0),
        ("\\boxed{41}", 0.0),
        (python_call("print('<answer>41</answer>')") + " <answer>42</answer>", 1.0),
    ],
)
def test_a_final_answer_ends_the_episode(env: MathPythonEnv, action: str, reward: float) -> None:
    _reset(env, "42")
    observation, got, terminated, truncated, info = env.step(action)
    assert (got, terminated, truncated, info["success"]) == (reward, True, False, reward == 1.0)
    assert observation.endswith("It is correct." if reward else "It is not correct.")


@pytest.mark.parametrize(
    "action", ["3 + 39 = 42\n#### 42\nThe answer is: 42 apples.", "So the final answer is 42.", "Answer: 42"]
)
def test_answer_phrases_are_final_answers_by_default(env: MathPythonEnv, action: str) -> None:
    _reset(env, "42")
    _, reward, terminated, _, info = env.step(action)
    assert (reward, terminated, info["answer"].startswith("42")) == (1.0, True, True)


def test_answer_phrases_can_be_turned_off() -> None:
    strict = MathPythonEnv([_task("42")], sandbox_kwargs=PROCESS, answer_phrases=False)
    try:
        strict.reset(seed=0)
        observation, _, terminated, *_ = strict.step("The answer is 42.")
        assert not terminated and "no tool call and no final answer" in observation
        assert strict.step("<answer>42</answer>")[1] == 1.0
    finally:
        strict.close()


@pytest.mark.parametrize(
    ("action", "reward"),
    [
        ("Ben has 5 + 4 = 9 books now.", 0.0),
        ("So 40 + 2 = 42 apples.", 1.0),
        ("It is 1,042 minus 1,000: 42", 1.0),
    ],
)
def test_last_number_reads_the_turns_last_number_when_asked(action: str, reward: float) -> None:
    lenient = MathPythonEnv([_task("42")], sandbox_kwargs=PROCESS, last_number=True)
    try:
        lenient.reset(seed=0)
        _, got, terminated, _, _ = lenient.step(action)
        assert (got, terminated) == (reward, True)
    finally:
        lenient.close()


def test_last_number_is_off_by_default_and_never_outranks_tags_or_calls(env: MathPythonEnv) -> None:
    _reset(env, "42")
    observation, _, terminated, *_ = env.step("So 40 + 2 = 42 apples.")
    assert not terminated and "no tool call and no final answer" in observation
    lenient = MathPythonEnv([_task("42")], sandbox_kwargs=PROCESS, last_number=True)
    try:
        lenient.reset(seed=0)
        assert lenient.step("42 is it? <answer>41</answer>")[1] == 0.0
        lenient.reset(seed=0)
        observation, _, terminated, *_ = lenient.step("Try 42: " + python_call("print(40 + 2)"))
        assert (observation, terminated) == ("42", False)
    finally:
        lenient.close()


def test_an_answer_next_to_a_tool_call_is_graded_and_the_call_not_run(env: MathPythonEnv) -> None:
    _reset(env, "7")
    _, reward, terminated, _, info = env.step(python_call("print('unseen')") + "<answer>7</answer>")
    assert (reward, terminated, info["ignored_calls"]) == (1.0, True, 1)
    assert [m["role"] for m in env.transcript[-2:]] == ["assistant", "user"]
    assert "unseen" not in env.transcript[-1]["content"]


def test_a_boxed_expression_next_to_a_tool_call_is_not_an_answer(env: MathPythonEnv) -> None:
    _reset(env, "2")
    observation, _, terminated, *_ = env.step("Maybe \\boxed{2}? " + python_call("print(1 + 1)"))
    assert (observation, terminated) == ("2", False)


# ----- the reward: answer equivalence through the env ------------------------------------
EQUIVALENT = [
    ("1/2", "0.5"),
    ("\\frac{1}{2}", "0.5"),
    ("\\dfrac{3}{4}", "0.75"),
    ("\\tfrac{5}{10}", "1/2"),
    ("\\frac12", "0.5"),
    ("3", "3.0"),
    ("3.0", "3"),
    ("0.50", "1/2"),
    ("x=3", "3"),  # decided: an assignment to one variable is read as its value
    ("x = \\frac{7}{2}", "3.5"),
    ("10%", "0.1"),  # decided: a percentage matches its fraction ...
    ("10\\%", "10"),  # ... and its number of percent
    ("50\\%", "1/2"),
    ("1,000", "1000"),
    ("$1,234.5$", "1234.5"),
    ("1e3", "1000"),
    ("-1/2", "-0.5"),
    ("-\\frac{1}{3}", "-1/3"),
    ("(-3)", "-3"),
    ("+4", "4"),
    ("\\$5", "5"),
    ("5 cm", "5"),
    ("12 \\text{ apples}", "12"),
    ("\\sqrt{2}", "1.41421356"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("\\boxed{42}", "42"),
    ("No", "no"),
    ("17/3", "\\frac{17}{3}"),
]
EQUIVALENT_WITH_MATH_VERIFY = [
    ("[1,2]", "[1, 2]"),  # intervals
    ("(-1, 1]", "(-1,1]"),
    ("\\{1,2\\}", "\\{2,1\\}"),  # sets
    ("2, 3", "3, 2"),
    ("x^2+2x+1", "(x+1)^2"),  # expressions
    ("y^2+x^2", "x^2+y^2"),
    ("2^(n-1)", "2^{n-1}"),
    ("1000000", "10^6"),
    ("\\frac{\\sqrt{3}}{2}", "\\sqrt{3}/2"),
]
NOT_EQUIVALENT = [
    ("2", "3"),
    ("1/3", "0.33"),
    ("0.333", "1/3"),
    ("12", "12.0001"),
    ("-2", "2"),
    ("\\frac{1}{2}", "2"),
    ("20%", "0.02"),
    ("x=4", "3"),
    ("1,000", "1.000"),
    ("\\sqrt{2}", "1.4142"),
    ("(1,2)", "[1,2]"),
    ("abc", "1"),
    ("{{{", "1"),
    ("1/0", "0"),
    ("9^9^9^9", "5"),
]
CHECKERS = [
    pytest.param(
        "auto",
        marks=pytest.mark.skipif(
            not math_verify_available(), reason="math-verify is not installed: pip install 'trace-gym[math]'"
        ),
    ),
    "numeric",
]


@pytest.fixture(scope="module", params=CHECKERS)
def graded(request: pytest.FixtureRequest) -> Iterator[MathPythonEnv]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        environment = MathPythonEnv(num_tasks=1, sandbox_kwargs=PROCESS, checker=request.param)
    yield environment
    environment.close()


def _reward(env: MathPythonEnv, predicted: str, reference: str) -> float:
    env.reset(seed=0, options={"task": _task(reference)})
    _, reward, terminated, _, info = env.step(f"<answer>{predicted}</answer>")
    assert terminated and info["success"] == (reward == 1.0)
    return reward


def test_equivalent_answers_earn_the_reward(graded: MathPythonEnv) -> None:
    wrong = [(p, r) for p, r in EQUIVALENT if _reward(graded, p, r) != 1.0]
    assert wrong == []


def test_non_equivalent_answers_do_not(graded: MathPythonEnv) -> None:
    wrong = [(p, r) for p, r in NOT_EQUIVALENT if _reward(graded, p, r) != 0.0]
    assert wrong == []


def test_math_verify_adds_sets_intervals_and_expressions(graded: MathPythonEnv) -> None:
    rewards = [_reward(graded, p, r) for p, r in EQUIVALENT_WITH_MATH_VERIFY]
    if graded.config.checker == "numeric":
        assert rewards == [0.0] * len(rewards)  # the fallback reads single numbers only
    else:
        assert rewards == [1.0] * len(rewards)


# ----- configuration ----------------------------------------------------------------------
def test_tasks_and_sources() -> None:
    tasks = [Task("a", "What is 1 + 1?", "2"), Task("b", "What is 2 + 2?", 4)]
    assert MathPythonEnv(tasks).task_ids == ["a", "b"]
    assert MathPythonEnv(num_tasks=3, difficulty=0.5, seed=4).task_ids[0] == "procedural/d0.50/s4/0"
    champ = pytest.importorskip("champ_dataset", reason="pip install champ-dataset")
    assert champ is not None
    assert len(MathPythonEnv(source="champ").tasks) == 270


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"source": "gsm9k"}, "Unknown task source 'gsm9k'; the sources are \\['procedural', 'champ'\\]"),
        ({"sandbox": "vm"}, "sandbox must be 'process' or 'docker', got 'vm'"),
        ({"checker": "exact"}, "checker must be one of \\['auto', 'math-verify', 'numeric'\\]"),
        ({"difficulty": 2.0}, "difficulty must be a number in \\[0, 1\\]"),
        ({"max_output_chars": 10}, "max_output_chars must be >= 100"),
        ({"max_turns": 0}, "max_turns must be >= 1"),
    ],
)
def test_bad_config_raises_a_config_error(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        MathPythonEnv(**kwargs)


def test_tasks_and_source_together_or_tasks_without_answers_are_refused() -> None:
    with pytest.raises(ConfigError, match="either tasks or source"):
        MathPythonEnv([Task("a", "q", "1")], source="procedural")
    with pytest.raises(ConfigError, match="needs a non-empty reference answer"):
        MathPythonEnv([Task("a", "q")])


def test_unknown_sandbox_kwargs_fail_at_first_reset() -> None:
    env = MathPythonEnv(num_tasks=1, sandbox_kwargs={"isolation": "chroot"})
    with pytest.raises(ConfigError, match="isolation must be one of"):
        env.reset(seed=0)


# ----- the embedded model -----------------------------------------------------------------
@pytest.mark.slow
def test_smollm2_runs_through_the_env() -> None:
    pytest.importorskip("transformers", reason="pip install 'trace-gym[hf]'")
    from trace_gym import GenerationRequest
    from trace_gym.policies.hf import HFPolicy
    from trace_gym.policies.smollm2 import load_smollm2

    model, tokenizer = load_smollm2()
    policy = HFPolicy(model, tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        env = MathPythonEnv(num_tasks=2, sandbox_kwargs=PROCESS, max_turns=2)
    try:
        env.reset(seed=0)
        done = False
        while not done:
            request = GenerationRequest(
                tuple(env.transcript), max_new_tokens=48, stop=env.stop_sequences, tools=env.tools, seed=0
            )
            turn = policy.generate([request])[0][0]
            _, reward, terminated, truncated, info = env.step(turn.text)
            done = terminated or truncated
        assert reward in (0.0, 1.0) and isinstance(info["success"], bool)
    finally:
        env.close()


def test_forcing_math_verify_without_it_fails_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def no_math_verify(name: str, package: str | None = None) -> Any:
        if name.startswith("math_verify"):
            raise ImportError(name)
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", no_math_verify)
    with pytest.raises(MissingDependencyError, match="checker='math-verify' needs the package 'math-verify'"):
        MathPythonEnv(num_tasks=1, checker="math-verify")
    assert MathPythonEnv(num_tasks=1, checker="auto").config.checker == "auto"


def test_docstring_examples() -> None:
    result = doctest.testmod(importlib.import_module("trace_gym.envs.math_python"))
    assert result.attempted >= 1 and result.failed == 0
