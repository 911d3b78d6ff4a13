"""SyntheticTree-v0: an honest simulator of agentic rollouts for allocation studies."""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import betaincinv

from trace_gym.env import BranchableEnv, Outcome
from trace_gym.errors import ConfigError
from trace_gym.seeding import mix, stream
from trace_gym.types import Message, Task, message

POSITIVE_WORDS = (
    "progress",
    "verified",
    "consistent",
    "promising",
    "clean",
    "solid",
    "on-track",
    "clear",
)
NEGATIVE_WORDS = (
    "stuck",
    "contradiction",
    "error",
    "dubious",
    "messy",
    "shaky",
    "off-track",
    "unclear",
)
SYSTEM_PROMPT = (
    "You solve a multi-step task. Each turn, call the tool `advance` exactly once: "
    '<tool_call>{"name": "advance", "arguments": {"draw": <number in [0, 1]>}}</tool_call>. '
    "The tool's output reports signals about how the attempt is going."
)
ADVANCE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "advance",
        "description": "Take the next step of the task.",
        "parameters": {
            "type": "object",
            "properties": {"draw": {"type": "number", "minimum": 0, "maximum": 1}},
            "required": ["draw"],
        },
    },
}
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_CANONICAL = re.compile(
    r'<tool_call>\{"name": "advance", "arguments": \{"draw": (0\.\d+|1\.0+|0|1)\}\}</tool_call>'
)


@dataclass(frozen=True)
class SyntheticConfig:
    """Parameters of SyntheticTree-v0 (all are `gymnasium.make` kwargs).

    The defaults are calibrated so that uniform sampling with 8 rollouts per prompt
    has an effective ratio of about 0.30, inside the 0.27-0.35 the paper reports for
    GRPO: with V_0 ~ Beta(a, b), E[1 - V_0^8 - (1 - V_0)^8] = 0.316 for a = 0.15,
    b = 0.19 (see `expected_effective_ratio`); the default 1,000-task set draws 0.302,
    and 8 simulated rollouts on each of its tasks give 0.301.
    """

    num_tasks: int = 1000
    """Tasks in the env's task set."""
    task_seed: int = 0
    """Seed of the task set (V_0, episode lengths and hint words)."""
    alpha: float = 0.15
    """Beta(alpha, beta) prior of the tasks' success probabilities V_0 (U-shaped when < 1)."""
    beta: float = 0.19
    """See alpha."""
    kappa: float = 2.0
    """Concentration of the step V_{t+1} ~ Beta(kappa V_t, kappa (1 - V_t)); smaller moves faster."""
    min_steps: int = 3
    """Fewest `advance` calls an episode needs."""
    max_steps: int = 6
    """Most `advance` calls an episode needs."""
    extra_turns: int = 2
    """Turns allowed beyond max_steps for malformed actions before truncation."""
    hint_words: int = 6
    """Words of evidence about V_0 in the prompt."""
    signal_words: int = 3
    """Words of evidence about V_t in each tool output."""

    def __post_init__(self) -> None:
        if self.num_tasks < 1:
            raise ConfigError(f"num_tasks must be >= 1, got {self.num_tasks}.")
        if self.alpha <= 0 or self.beta <= 0:
            raise ConfigError(f"alpha and beta must be > 0, got {self.alpha}, {self.beta}.")
        if self.kappa <= 0:
            raise ConfigError(f"kappa must be > 0, got {self.kappa}.")
        if not 1 <= self.min_steps <= self.max_steps:
            raise ConfigError(f"Need 1 <= min_steps <= max_steps, got {self.min_steps} and {self.max_steps}.")
        if self.extra_turns < 0 or self.hint_words < 0 or self.signal_words < 0:
            raise ConfigError("extra_turns, hint_words and signal_words must be >= 0.")

    def expected_effective_ratio(self, group_size: int = 8) -> float:
        """E[1 - V^G - (1 - V)^G] under V ~ Beta(alpha, beta): the uniform effective ratio."""
        from scipy.special import betaln

        a, b, g = self.alpha, self.beta, group_size
        base = betaln(a, b)
        return float(1 - math.exp(betaln(a + g, b) - base) - math.exp(betaln(a, b + g) - base))


def _evidence(value: float, count: int, key: int) -> list[str]:
    """`count` words, each positive with probability `value`, drawn from hash stream `key`.

    One 64-bit hash serves three words: each takes 20 bits, a 17-bit uniform that picks
    the positive or negative vocabulary and 3 bits that pick the word in it.
    """
    words = []
    h = 0
    threshold = value * (1 << 17)
    for j in range(count):
        if j % 3 == 0:
            h = stream(key, j)
        chunk, h = h & 0xFFFFF, h >> 20
        vocab = POSITIVE_WORDS if (chunk >> 3) < threshold else NEGATIVE_WORDS
        words.append(vocab[chunk & 7])
    return words


@functools.lru_cache(maxsize=8)
def make_tasks(config: SyntheticConfig) -> tuple[Task, ...]:
    """The env's task set: task i has V_0 ~ Beta(alpha, beta) and a length in [min, max] steps."""
    rng = np.random.default_rng(config.task_seed)
    v0 = rng.beta(config.alpha, config.beta, size=config.num_tasks)
    lengths = rng.integers(config.min_steps, config.max_steps + 1, size=config.num_tasks)
    tasks = []
    for i in range(config.num_tasks):
        hints = " ".join(_evidence(float(v0[i]), config.hint_words, mix(config.task_seed, i)))
        prompt = (
            message("system", SYSTEM_PROMPT),
            message("user", f"Task {i}: reach the goal in {lengths[i]} steps. Hints: {hints}."),
        )
        meta = {"v0": float(v0[i]), "steps": int(lengths[i])}
        tasks.append(Task(f"synthetic-{i}", prompt, answer=None, metadata=meta))
    return tuple(tasks)


def _parse_draw(action: str) -> float | str:
    """The draw in an `advance` call, or an error message explaining what is wrong."""
    canonical = _CANONICAL.fullmatch(action.strip())
    if canonical:
        return float(canonical.group(1))
    calls = _TOOL_CALL.findall(action)
    if len(calls) != 1:
        return f"expected exactly one <tool_call>...</tool_call>, found {len(calls)}"
    try:
        call = json.loads(calls[0])
    except json.JSONDecodeError as exc:
        return f"the tool call is not valid JSON ({exc.msg} at position {exc.pos})"
    if not isinstance(call, dict) or call.get("name") != "advance":
        name = call.get("name") if isinstance(call, dict) else None
        return f"unknown tool {name!r}; the only tool is 'advance'"
    args = call.get("arguments")
    draw = args.get("draw") if isinstance(args, dict) else None
    if isinstance(draw, bool) or not isinstance(draw, (int, float)) or not 0 <= draw <= 1:
        return f"arguments.draw must be a number in [0, 1], got {draw!r}"
    return float(draw)


def _advance(v: float, kappa: float, u: float) -> float:
    """V_{t+1} = F^{-1}(u) for Beta(kappa V_t, kappa (1 - V_t)); 0 and 1 are absorbing."""
    if v <= 0.0 or v >= 1.0:
        return v
    return float(betaincinv(kappa * v, kappa * (1.0 - v), u))


class SyntheticTreeEnv(BranchableEnv):
    """A multi-step task whose success probability moves as a martingale.

    Each task has a success probability V_0 drawn from a U-shaped Beta(alpha, beta)
    and a length L. Each valid turn moves it, V_{t+1} ~ Beta(kappa V_t, kappa (1 - V_t)),
    through the uniform draw u the policy puts in its action: V_{t+1} = F^{-1}(u). The
    L-th call ends the episode with reward 1[u < V_{L-1}], so V_t is exactly the
    probability of success from the state after turn t (given uniform draws), and the
    env is deterministic given actions: all randomness lives in the policy, as with an
    LLM. `info["value"]` exposes V_t for the oracle predictor.

    ## Observation
    Text. After reset: the task, its length and hint words that are each positive with
    probability V_0. After a turn: the tool output with signal words that are each
    positive with probability V_t, so a predictor has evidence that sharpens with depth.

    ## Action
    The assistant's turn: one Hermes tool call
    `<tool_call>{"name": "advance", "arguments": {"draw": u}}</tool_call>`, u in [0, 1].
    Anything else gives an error observation (role "user") and uses up a turn.

    ## Reward
    1.0 when the final call succeeds, else 0.0; `info["success"]` is the outcome.

    ## Episode end
    Terminated after L valid calls; truncated (reward 0) after `max_steps + extra_turns`
    turns.

    ## Version history
    - v0: initial version.
    """

    tools = (ADVANCE_TOOL,)
    stop_sequences = ("</tool_call>",)
    steps_block = False

    def __init__(self, render_mode: str | None = None, **kwargs: Any) -> None:
        self.config = SyntheticConfig(**kwargs)
        super().__init__(
            make_tasks(self.config),
            max_turns=self.config.max_steps + self.config.extra_turns,
            render_mode=render_mode,
        )
        self._value = 0.5
        self._steps = 0

    def check_task(self, task: Task) -> None:
        """Only tasks with metadata `v0` in [0, 1] and `steps` >= 1 can be posed."""
        v0, steps = task.metadata.get("v0"), task.metadata.get("steps")
        if not isinstance(v0, float) or not 0 <= v0 <= 1 or not isinstance(steps, int) or steps < 1:
            raise ConfigError(
                f"A SyntheticTree task needs metadata {{'v0': float in [0, 1], 'steps': int >= 1}}, "
                f"got {dict(task.metadata)!r}. Use the env's own tasks (env.unwrapped.tasks)."
            )

    def _start(self, task: Task) -> tuple[list[Message], dict[str, Any]]:
        self._value = float(task.metadata["v0"])
        self._steps = 0
        return task.messages(), {"value": self._value}

    def _act(self, action: str) -> Outcome:
        draw = _parse_draw(action)
        if isinstance(draw, str):
            feedback = f"Error: {draw}. Call the tool as {ADVANCE_EXAMPLE}."
            return Outcome(
                [message("user", feedback)],
                info={"value": self._value, "tool_calls": 0, "error": draw},
            )
        assert self._task is not None
        length = int(self._task.metadata["steps"])
        self._steps += 1
        if self._steps >= length:
            success = draw < self._value
            self._value = 1.0 if success else 0.0
            text = f"Step {self._steps}/{length}: goal {'reached' if success else 'missed'}."
            info = {"value": self._value, "tool_calls": 1}
            return Outcome([{"role": "tool", "content": text}], float(success), terminated=True, info=info)
        self._value = _advance(self._value, self.config.kappa, draw)
        key = int(draw * (1 << 53)) ^ (self._steps << 56)
        signals = " ".join(_evidence(self._value, self.config.signal_words, key))
        text = f"Step {self._steps}/{length} done. Signals: {signals}."
        return Outcome([{"role": "tool", "content": text}], info={"value": self._value, "tool_calls": 1})

    def _get_state(self) -> tuple[float, int]:
        return (self._value, self._steps)

    def _set_state(self, state: tuple[float, int]) -> None:
        self._value, self._steps = state

    def example_action(self, rng: np.random.Generator) -> str:
        """A well-formed `advance` call with a uniform draw."""
        return advance_call(int(rng.integers(10**9)))


ADVANCE_EXAMPLE = '<tool_call>{"name": "advance", "arguments": {"draw": 0.5}}</tool_call>'


def advance_call(k: int) -> str:
    """The canonical action with draw u = k / 10^9 (exact in decimal)."""
    return f'<tool_call>{{"name": "advance", "arguments": {{"draw": 0.{k:09d}}}}}</tool_call>'
