"""MathPython-v0: math problems solved with a stateful Python interpreter as a tool."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from os import PathLike
from typing import Any

import numpy as np

from trace_gym.env import BranchableEnv, Outcome
from trace_gym.errors import ConfigError, MissingDependencyError, SnapshotError
from trace_gym.tasks import SOURCES, load_tasks
from trace_gym.tasks.procedural import format_answer
from trace_gym.tools.answers import CHECKERS, Checker, answers_match, math_verify_available
from trace_gym.tools.parsers import ToolCall, extract_boxed, parse_turn
from trace_gym.tools.sandbox import CellResult, PythonSandbox, make_sandbox
from trace_gym.types import Message, Task, message

SYSTEM_PROMPT = (
    "Solve the math problem. You may run Python code with the python tool, for example:\n"
    '<tool_call>{"name": "python", "arguments": {"code": "print(2 + 3)"}}</tool_call>\n'
    "The tool replies with what the code prints; variables persist between calls.\n"
    "When you know the result, write only the final answer like this: <answer>5</answer>"
)
PYTHON_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "python",
        "description": (
            "Run Python code in a persistent interpreter (variables, imports and functions persist "
            "between calls) and return what it prints, then the error if any."
        ),
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python code; print() what you need."}},
            "required": ["code"],
        },
    },
}
PYTHON_EXAMPLE = '<tool_call>{"name": "python", "arguments": {"code": "print(2 + 3)"}}</tool_call>'
NO_OUTPUT = "(no output; use print() to show a value)"
_ANSWER_PHRASE = re.compile(
    r"(?:^|\n)[^\n]*?(?:####|\b(?:final answer|answer) (?:is|=)\s*:?|\b(?:final answer|answer)\s*:)"
    r"[ \t]*\$?([^\n]*?)\$?[ \t]*\.?[ \t]*(?=\n|$)",
    re.IGNORECASE,
)
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
SHOW_VARIABLES = "print(sorted((k, v) for k, v in globals().items() if k[:1] == 'v' and k[1:].isdigit()))"


@dataclass(frozen=True)
class MathPythonConfig:
    """Parameters of MathPython-v0 (all are `gymnasium.make` kwargs, besides `tasks`)."""

    source: str | PathLike[str] | None = None
    """"procedural", "champ" or a task file path (default "procedural"); not with `tasks`."""
    difficulty: float = 0.0
    """Difficulty in [0, 1] of the procedural source (0: one addition of numbers up to 10)."""
    num_tasks: int | None = None
    """Tasks to generate (procedural, default 100), or a seeded subset of a fixed source."""
    seed: int = 0
    """Seed of the generated tasks or of the subset."""
    max_turns: int = 8
    """Turn limit; the episode is truncated (reward 0) when it is reached."""
    sandbox: str = "process"
    """Backend of the python tool: "process" (ProcessSandbox) or "docker" (DockerSandbox)."""
    sandbox_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the sandbox: limits, timeout, isolation, image (see trace_gym.tools.sandbox)."""
    max_output_chars: int = 2000
    """Longest tool output shown to the policy; longer output is cut and the cut is stated."""
    max_calls_per_turn: int = 4
    """Most tool calls run in one turn; further calls get an error observation."""
    checker: Checker = "auto"
    """Answer checker: "auto", "math-verify" or "numeric" (see trace_gym.tools.answers)."""
    answer_phrases: bool = True
    """Also read "The answer is X" and "#### X" (the last one) in a turn without tool calls,
    tags or boxes as a final answer, so small models that ignore the tags have a chance."""
    last_number: bool = False
    """Also read the last number of a turn without tool calls, tags, boxes or answer phrases
    as its final answer (the lenient GSM8K-style reading). Off by default: any turn that
    mentions a number then ends the episode, so the tool is rarely reached."""

    def __post_init__(self) -> None:
        if self.sandbox not in ("process", "docker"):
            raise ConfigError(f"sandbox must be 'process' or 'docker', got {self.sandbox!r}.")
        if not isinstance(self.sandbox_kwargs, Mapping):
            raise ConfigError(f"sandbox_kwargs must be a dict, got {type(self.sandbox_kwargs).__name__}.")
        if self.max_output_chars < 100:
            raise ConfigError(f"max_output_chars must be >= 100, got {self.max_output_chars}.")
        if self.max_calls_per_turn < 1:
            raise ConfigError(f"max_calls_per_turn must be >= 1, got {self.max_calls_per_turn}.")
        if self.checker not in CHECKERS:
            raise ConfigError(f"checker must be one of {list(CHECKERS)}, got {self.checker!r}.")
        if self.checker == "math-verify" and not math_verify_available():
            raise MissingDependencyError("math-verify", "math", "checker='math-verify'")


def reference_text(answer: Any) -> str:
    """A task's reference answer as text (a Fraction as "7/2")."""
    return format_answer(answer) if isinstance(answer, Fraction) else str(answer)


def phrase_answer(text: str) -> str | None:
    r"""The X of the last "The answer is X", "Final answer: X" or "#### X" line, else None.

    >>> phrase_answer("3 + 6 = 9\n#### 9\nThe answer is: 9 pencils.")
    '9 pencils'
    """
    matches = _ANSWER_PHRASE.findall(text)
    return matches[-1].strip() if matches else None


def last_number(text: str) -> str | None:
    """The last number written in `text` (thousands commas dropped), else None.

    >>> last_number("Ben has 5 + 4 = 9 books, or 1,024/2 pages.")
    '1024/2'
    """
    matches = _NUMBER.findall(text)
    return matches[-1].replace(",", "") if matches else None


def python_call(code: str) -> str:
    """The Hermes tool call that runs `code`."""
    return f"<tool_call>{json.dumps({'name': 'python', 'arguments': {'code': code}})}</tool_call>"


def truncate(text: str, limit: int) -> str:
    """`text`, cut to `limit` characters with a note saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[output truncated: showing {limit} of {len(text)} characters]"


def format_result(result: CellResult, limit: int) -> str:
    """A cell's result as the tool message, cut to `limit` characters.

    Stdout, then stderr (a traceback), then "Error: ..." unless stderr already ends with it.
    """
    parts = [part.rstrip("\n") for part in (result.stdout, result.stderr) if part.strip()]
    if result.error is not None and not result.stderr.rstrip().endswith(result.error):
        parts.append(f"Error: {result.error}")
    return truncate("\n".join(parts), limit) if parts else NO_OUTPUT


class MathPythonEnv(BranchableEnv):
    r"""A math problem, a Python interpreter as a tool, and a verifiable final answer.

    A task is a problem and a reference answer (procedural word problems, the 270
    CHAMP problems, or any file or dataset; see `trace_gym.tasks`). Each episode has
    its own sandboxed, persistent Python interpreter (`sandbox="process"` or
    `"docker"`), so variables set by one call are there in the next. A snapshot holds
    the interpreter's cell log, so a branch restores by forking a live checkpoint or
    by replaying the log, in this instance or any other made with the same kwargs.

    ## Observation
    Text. After reset: the system prompt (the tool and the answer format) and the
    problem. After a tool call: the tool's output as a role "tool" message: stdout,
    then stderr, then "Error: ..." if the code failed or timed out, cut to
    `max_output_chars` with a note saying so. After a final answer: whether it is
    correct. After a malformed turn: an error message (role "user") saying how to call
    the tool or answer.

    ## Action
    The assistant's turn. Either Hermes tool calls,
    `<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>` (at most
    `max_calls_per_turn` run per turn), or a final answer, `<answer>...</answer>` or
    `\boxed{...}`. An `<answer>` ends the episode even next to a tool call (which is
    then not run); a `\boxed{}` counts only in a turn without tool calls, and so do, with
    `answer_phrases=True` (the default), "The answer is X", "Final answer: X" and
    "#### X" (the last such line; tags and boxes come first), and with
    `last_number=True` (off by default) the turn's last number. A turn with
    neither, bad JSON, an unknown tool, a missing `code` argument or an empty answer
    gets an error observation and the episode goes on.

    ## Reward
    1.0 when the final answer matches the reference (`trace_gym.tools.answers.
    answers_match`: math-verify with a numeric fallback), else 0.0; `info["success"]`
    is the outcome. `info` also carries `tool_calls`, `tool_durations` (seconds),
    `tool_errors`, `parse_errors` and `isolation` (the sandbox's active isolation).

    ## Episode end
    Terminated by a non-empty final answer; truncated (reward 0) after `max_turns`
    turns. `close()` shuts the sandbox down.

    ## Version history
    - v0: initial version.
    """

    tools = (PYTHON_TOOL,)
    stop_sequences = ("</tool_call>", "</answer>")
    steps_block = True

    def __init__(
        self, tasks: Sequence[Task] | None = None, render_mode: str | None = None, **kwargs: Any
    ) -> None:
        self.config = MathPythonConfig(**kwargs)
        if tasks is not None and self.config.source is not None:
            raise ConfigError(
                f"Pass either tasks or source, not both (got {len(tasks)} tasks and source="
                f"{self.config.source!r})."
            )
        if tasks is None:
            config = self.config
            tasks = load_tasks(
                config.source if config.source is not None else SOURCES[0],
                difficulty=config.difficulty,
                num_tasks=config.num_tasks,
                seed=config.seed,
            )
        tasks = tuple(tasks)
        for task in tasks:
            self.check_task(task)
        super().__init__(tasks, max_turns=self.config.max_turns, render_mode=render_mode)
        self._sandbox: PythonSandbox | None = None
        self._closed_mid_episode = False

    # ----- the sandbox ----------------------------------------------------------------
    @property
    def sandbox(self) -> PythonSandbox:
        """The episode's sandbox, started on first use."""
        if self._sandbox is None:
            self._sandbox = make_sandbox(self.config.sandbox, **self.config.sandbox_kwargs)
        return self._sandbox

    @property
    def isolation(self) -> str | None:
        """The sandbox's active isolation (None before it started)."""
        return None if self._sandbox is None else self._sandbox.isolation

    def close(self) -> None:
        """Shut the sandbox down (idempotent); a later reset or restore starts a new one.

        The interpreter's state is gone, so the episode cannot go on: `step` and
        `snapshot` need a `reset` or `restore` first.
        """
        if self._sandbox is not None:
            sandbox, self._sandbox = self._sandbox, None
            sandbox.close()
            if self._task is not None:
                self._done, self._closed_mid_episode = True, True
        super().close()

    # ----- the hooks ------------------------------------------------------------------
    def check_task(self, task: Task) -> None:
        """Only tasks with a reference answer can be posed."""
        if not isinstance(task, Task) or task.answer is None or not reference_text(task.answer).strip():
            raise ConfigError(
                f"A MathPython task needs a non-empty reference answer, got {task!r}. Build tasks with "
                "trace_gym.tasks (load_tasks, tasks_from_file, tasks_from_dataset)."
            )

    def _start(self, task: Task) -> tuple[list[Message], dict[str, Any]]:
        self.sandbox.reset()
        self._closed_mid_episode = False
        messages = task.messages()
        if not messages or messages[0]["role"] != "system":
            messages.insert(0, message("system", SYSTEM_PROMPT))
        return messages, {"isolation": self.sandbox.isolation}

    def _act(self, action: str) -> Outcome:
        turn = parse_turn(action)
        answer = turn.answer
        if answer is None and not turn.calls and not turn.errors:
            answer = extract_boxed(turn.text)
            if answer is None and self.config.answer_phrases:
                answer = phrase_answer(turn.text)
            if answer is None and self.config.last_number:
                answer = last_number(turn.text)
        if answer is not None and answer.strip():
            return self._grade(answer, ignored_calls=len(turn.calls))
        info: dict[str, Any] = {
            "tool_calls": 0,
            "tool_durations": [],
            "tool_errors": [],
            "parse_errors": list(turn.errors),
            "isolation": self.isolation,
        }
        messages = [self._call(call, info) for call in turn.calls[: self.config.max_calls_per_turn]]
        problems = list(turn.errors)
        if len(turn.calls) > self.config.max_calls_per_turn:
            problems.append(
                f"only the first {self.config.max_calls_per_turn} tool calls of a turn run; "
                f"{len(turn.calls) - self.config.max_calls_per_turn} were skipped"
            )
        if answer is not None:
            problems.append("the answer is empty; write the final answer inside <answer>...</answer>")
        if not turn.calls and not problems:
            problems.append("the turn has no tool call and no final answer")
        if problems:
            info["parse_errors"] = problems
            feedback = "Error: " + "; ".join(problems) + "."
            hint = f" Call the tool as {PYTHON_EXAMPLE}, or give the final answer as <answer>...</answer>."
            messages.append(message("user", truncate(feedback, self.config.max_output_chars) + hint))
        return Outcome(messages, info=info)

    def _call(self, call: ToolCall, info: dict[str, Any]) -> Message:
        """Run one tool call; its result (or what is wrong with it) as a role "tool" message."""
        if call.name != "python":
            error = f"unknown tool {call.name[:100]!r}; the only tool is 'python'"
        elif not isinstance(call.arguments.get("code"), str):
            error = "the python tool needs a 'code' argument holding the code as a string"
        else:
            result = self.sandbox.run(call.arguments["code"])
            info["tool_calls"] += 1
            info["tool_durations"].append(result.duration)
            if result.error is not None:
                info["tool_errors"].append(result.error)
            return {"role": "tool", "content": format_result(result, self.config.max_output_chars)}
        info["tool_errors"].append(error)
        return {"role": "tool", "content": f"Error: {error}."}

    def _grade(self, answer: str, *, ignored_calls: int) -> Outcome:
        assert self._task is not None
        correct = answers_match(answer, reference_text(self._task.answer), checker=self.config.checker)
        verdict = "correct" if correct else "not correct"
        shown = truncate(answer, 200)
        info = {"answer": answer, "ignored_calls": ignored_calls, "isolation": self.isolation}
        return Outcome(
            [message("user", f"Final answer: {shown}. It is {verdict}.")],
            reward=float(correct),
            terminated=True,
            info=info,
        )

    def _get_state(self) -> Any:
        if self._closed_mid_episode:
            raise SnapshotError(
                "The env was closed, which stopped its interpreter; call reset() or restore() before "
                "snapshot()."
            )
        return self.sandbox.checkpoint()

    def _set_state(self, state: Any) -> None:
        self.sandbox.restore(state)
        self._closed_mid_episode = False

    def example_action(self, rng: np.random.Generator) -> str:
        """A python call, or (one turn in seven) a final answer that is right half the time.

        The calls set, update or print variables (state that branches share or not), or
        fail with an error; their outputs depend only on the cells run before.
        """
        kind = rng.choice(["set", "update", "show", "fail", "answer"], p=[0.3, 0.25, 0.2, 0.1, 0.15])
        name, value = f"v{int(rng.integers(4))}", int(rng.integers(100))
        if kind == "set":
            return python_call(f"{name} = {value}\nprint('{name} =', {name})")
        if kind == "update":
            return python_call(f"{name} = globals().get('{name}', 0) * 2 + {value}\nprint({name})")
        if kind == "show":
            return python_call(
                "print(sorted((k, v) for k, v in globals().items() if k[:1] == 'v' and k[1:].isdigit()))"
            )
        if kind == "fail":
            return python_call(f"print({name} / 0)")
        assert self._task is not None
        guess = reference_text(self._task.answer) if rng.random() < 0.5 else str(value)
        return (
            f"\\boxed{{{guess}}}" if rng.random() < 0.3 else f"The result is known. <answer>{guess}</answer>"
        )
