"""The branchable-environment contract (DESIGN section 4).

A `BranchableEnv` is a `gymnasium.Env[str, str]` whose whole state can be taken
as a `Snapshot` (an immutable, picklable value) and restored into any instance
made from the same env id, so any prefix of a trajectory can be branched.

Subclasses implement four hooks and inherit the rest (task selection, the
transcript, the turn limit, RNG capture, rendering)::

    class Echo(BranchableEnv):
        def _start(self, task):            # initial messages and info
            return task.messages(), {}
        def _act(self, action):            # one turn
            return Outcome([message("user", action)], reward=1.0, terminated=True)
        def _get_state(self):              # the subclass's own state, immutable
            return None
        def _set_state(self, state):
            pass
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.error import ResetNeeded

from trace_gym.errors import ConfigError, SnapshotError, UnknownTaskError, WrapperStateError
from trace_gym.types import Message, Task

DEFAULT_STOP_SEQUENCES: tuple[str, ...] = ("</tool_call>", "</answer>")


class AnyText(spaces.Text):
    """A `Text` space that contains any Unicode string up to `max_length` characters.

    Gymnasium's `Text` only contains strings over its charset; an agent's turn or a
    tool's output can hold any character. Samples are drawn from printable ASCII,
    which makes `action_space.sample()` a source of arbitrary (mostly malformed) actions.
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | None = None) -> None:
        super().__init__(max_length, min_length=min_length, charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        """Whether `x` is a str of allowed length (any characters)."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"AnyText({self.min_length}, {self.max_length})"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The complete state of a branchable env at one moment: an immutable, picklable value.

    Attributes:
        env_id: The id of the env it was taken from (its spec id, or its class path).
        state: The env's state; opaque to everyone but the env.
        wrappers: States of the Gymnasium wrappers around the env, outermost first,
            as `(wrapper class name, state)` pairs; empty when taken from the bare env.
    """

    env_id: str
    state: Any
    wrappers: tuple[tuple[str, Any], ...] = ()


@dataclass(slots=True)
class Outcome:
    """What one turn did: returned by `BranchableEnv._act`.

    Attributes:
        messages: The observation as chat messages appended after the assistant turn
            (tool results as role "tool", env feedback as role "user"). The observation
            returned by `step` is the last one's content.
        reward: The turn's reward (terminal and verifiable in shipped envs).
        terminated: Whether the episode reached a terminal state.
        success: The boolean outcome; defaults to `terminated and reward > 0`.
        info: Extra information for `step`'s info dict.
    """

    messages: list[Message]
    reward: float = 0.0
    terminated: bool = False
    success: bool | None = None
    info: dict[str, Any] = field(default_factory=dict)


_RngState = tuple[Any, ...]


def _rng_state(rng: np.random.Generator) -> _RngState:
    state = rng.bit_generator.state
    inner = state["state"]
    if state["bit_generator"] == "PCG64":
        return (inner["state"], inner["inc"], state["has_uint32"], state["uinteger"])
    return ("dict", repr(state), state)


def _set_rng_state(rng: np.random.Generator, compact: _RngState) -> None:
    if compact[0] == "dict":
        rng.bit_generator.state = compact[2]
        return
    rng.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": compact[0], "inc": compact[1]},
        "has_uint32": compact[2],
        "uinteger": compact[3],
    }


class BranchableEnv(gymnasium.Env[str, str]):
    """A text environment whose state can be snapshotted and restored (DESIGN section 4).

    Observations and actions are str. `reset(options=...)` selects the task with
    `{"task": Task}`, `{"task_id": str}` or `{"index": int}`; without one the env draws
    a task with `self.np_random`. `step(action)` takes the assistant's whole turn text;
    a malformed action yields an error observation, never an exception.

    Attributes:
        max_turns: The env's own turn limit (`truncated=True` when hit).
        tools: The env's tools as OpenAI-format function schemas.
        stop_sequences: Where a generated turn ends; passed to every policy backend.
        steps_block: Whether `step` may wait on I/O (a tool, a sandbox, a server); the
            runner steps such envs in a thread pool and CPU-only ones inline.
        tasks: The env's task source.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 1}  # type: ignore[misc]
    tools: tuple[Mapping[str, Any], ...] = ()
    stop_sequences: tuple[str, ...] = DEFAULT_STOP_SEQUENCES
    steps_block: bool = True

    def __init__(
        self,
        tasks: Sequence[Task],
        *,
        max_turns: int,
        render_mode: str | None = None,
        max_text_length: int = 1_000_000,
    ) -> None:
        if max_turns < 1:
            raise ConfigError(f"max_turns must be >= 1, got {max_turns}.")
        if not tasks:
            raise ConfigError(f"{type(self).__name__} needs at least one task, got none.")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(
                f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}."
            )
        self.tasks: Sequence[Task] = tasks
        self.max_turns = max_turns
        self.render_mode = render_mode
        self.observation_space = AnyText(max_text_length)
        self.action_space = AnyText(max_text_length)
        self._task_index: dict[str, int] | None = None
        self._task: Task | None = None
        self._transcript: tuple[Message, ...] = ()
        self._turn = 0
        self._done = False
        self._rng_used = True
        self._rng_cache: _RngState | None = None

    # ----- hooks for subclasses -------------------------------------------------------
    def _start(self, task: Task) -> tuple[list[Message], dict[str, Any]]:
        """Begin an episode of `task`: the initial messages and the reset info."""
        raise NotImplementedError

    def _act(self, action: str) -> Outcome:
        """Apply one assistant turn; never raise on a malformed action."""
        raise NotImplementedError

    def _get_state(self) -> Any:
        """The subclass's own state as an immutable, picklable value."""
        raise NotImplementedError

    def _set_state(self, state: Any) -> None:
        """Restore what `_get_state` returned."""
        raise NotImplementedError

    def check_task(self, task: Task) -> None:
        """Raise `ConfigError` when `task` cannot be posed by this env (override to check)."""

    def example_action(self, rng: np.random.Generator) -> str:
        """A well-formed action for the current state (used by tests and smoke runs).

        Override it: the contract kit plays these to reach deep states. The default is a
        short random printable text, which most envs will treat as malformed.
        """
        return "".join(rng.choice(list(string.printable), size=int(rng.integers(1, 65))))

    # ----- the Gymnasium API ----------------------------------------------------------
    @property
    def np_random(self) -> np.random.Generator:
        """The env's RNG; every access marks its state as possibly changed."""
        self._rng_used = True
        return super().np_random

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        self._rng_used = True
        self._np_random = value
        self._np_random_seed = -1

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode; `options` selects the task (see the class docstring)."""
        super().reset(seed=seed)
        self._rng_used = True
        task = self._select_task(options)
        messages, info = self._start(task)
        self._task = task
        self._transcript = tuple(messages)
        self._turn = 0
        self._done = False
        info.setdefault("task_id", task.id)
        return self._transcript[-1]["content"], info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one assistant turn and return the newest observation."""
        if self._task is None:
            raise ResetNeeded("Cannot call step() before reset() or restore().")
        if self._done:
            raise ResetNeeded(
                "The episode is over (terminated or truncated); call reset() or restore() before step()."
            )
        if not isinstance(action, str):
            raise TypeError(f"An action is the assistant's turn as str, got {type(action).__name__}.")
        outcome = self._act(action)
        self._turn += 1
        terminated = bool(outcome.terminated)
        truncated = not terminated and self._turn >= self.max_turns
        self._done = terminated or truncated
        self._transcript = (
            *self._transcript,
            {"role": "assistant", "content": action},
            *outcome.messages,
        )
        info = outcome.info
        success = outcome.success if outcome.success is not None else (terminated and outcome.reward > 0)
        info["success"] = bool(success)
        info["turn"] = self._turn
        return self._transcript[-1]["content"], float(outcome.reward), terminated, truncated, info

    def render(self) -> str | None:
        """With render_mode "ansi", the transcript as text."""
        if self.render_mode != "ansi":
            return None
        return "\n".join(f"[{m['role']}] {m['content']}" for m in self._transcript)

    # ----- the branching API ----------------------------------------------------------
    @property
    def transcript(self) -> list[Message]:
        """The full message list so far (a fresh copy): what the policy conditions on."""
        return [{"role": m["role"], "content": m["content"]} for m in self._transcript]

    def messages_since(self, index: int) -> list[Message]:
        """Copies of the transcript's messages from position `index` on."""
        return [{"role": m["role"], "content": m["content"]} for m in self._transcript[index:]]

    @property
    def transcript_length(self) -> int:
        """Number of messages in the transcript."""
        return len(self._transcript)

    @property
    def task(self) -> Task | None:
        """The task of the current episode (None before the first reset)."""
        return self._task

    @property
    def turn(self) -> int:
        """Turns taken in the current episode."""
        return self._turn

    @property
    def env_id(self) -> str:
        """The id snapshots are tagged with: the spec id, else the class path."""
        if self.spec is not None:
            return self.spec.id
        return f"{type(self).__module__}.{type(self).__qualname__}"

    def snapshot(self) -> Snapshot:
        """The env's state now, as an immutable value (DESIGN section 4)."""
        return Snapshot(self.env_id, self._capture())

    def _capture(self) -> tuple[Any, ...]:
        """The state tuple a snapshot holds (the base's fields, then the subclass's)."""
        if self._task is None:
            raise SnapshotError("Cannot snapshot an env before reset(): there is no state yet.")
        if self._rng_used or self._rng_cache is None:
            self._rng_cache = _rng_state(self.np_random)
            self._rng_used = False
        return (self._task, self._transcript, self._turn, self._done, self._rng_cache, self._get_state())

    def restore(self, snapshot: Snapshot) -> None:
        """Return the env to the moment `snapshot` was taken; the snapshot is unchanged."""
        if not isinstance(snapshot, Snapshot):
            raise SnapshotError(
                f"restore() expects a trace_gym.Snapshot, got {type(snapshot).__name__}. "
                "Take one with env.snapshot() or trace_gym.snapshot(env)."
            )
        if snapshot.env_id != self.env_id:
            raise SnapshotError(
                f"Cannot restore a snapshot of {snapshot.env_id!r} into {self.env_id!r}: a "
                "snapshot restores only into an env made from the same env id and kwargs."
            )
        task, transcript, turn, done, rng, env_state = snapshot.state
        self._set_state(env_state)
        self._task, self._transcript, self._turn, self._done = task, transcript, turn, done
        if self._rng_used or rng is not self._rng_cache:
            _set_rng_state(self.np_random, rng)
            self._rng_cache = rng
            self._rng_used = False

    # ----- tasks ----------------------------------------------------------------------
    @property
    def task_ids(self) -> list[str]:
        """The ids of every task this env can pose, in order."""
        return [t.id for t in self.tasks]

    def _select_task(self, options: Mapping[str, Any] | None) -> Task:
        options = dict(options or {})
        unknown = set(options) - {"task", "task_id", "index"}
        if unknown or len(options) > 1:
            raise ConfigError(
                f"reset(options=...) takes one of 'task', 'task_id' or 'index', got "
                f"{sorted(options)}. Example: env.reset(options={{'task_id': "
                f"{self.tasks[0].id!r}}})."
            )
        if "task" in options:
            task = options["task"]
            if not isinstance(task, Task):
                raise ConfigError(f"options['task'] must be a trace_gym.Task, got {task!r}.")
            self.check_task(task)
            return task
        if "task_id" in options:
            return self.tasks[self._index_of(options["task_id"])]
        if "index" in options:
            index = options["index"]
            if not isinstance(index, (int, np.integer)) or not 0 <= index < len(self.tasks):
                raise UnknownTaskError(
                    f"Task index {index!r} is out of range: {self.env_id} has "
                    f"{len(self.tasks)} tasks (indices 0..{len(self.tasks) - 1}). "
                    "List them with `env.unwrapped.task_ids` or `trace-gym tasks ENV_ID`."
                )
            return self.tasks[int(index)]
        return self.tasks[int(self.np_random.integers(len(self.tasks)))]

    def _index_of(self, task_id: str) -> int:
        if self._task_index is None:
            self._task_index = {t.id: i for i, t in enumerate(self.tasks)}
        try:
            return self._task_index[task_id]
        except KeyError:
            examples = ", ".join(repr(t.id) for t in self.tasks[:3])
            raise UnknownTaskError(
                f"Unknown task id {task_id!r} for {self.env_id} ({len(self.tasks)} tasks, e.g. "
                f"{examples}). List them with `env.unwrapped.task_ids` or "
                "`trace-gym tasks ENV_ID`."
            ) from None


# ----- snapshots through Gymnasium wrappers -------------------------------------------
W = TypeVar("W", bound=gymnasium.Wrapper[Any, Any, Any, Any])


@dataclass(frozen=True)
class _WrapperHandler:
    get: Callable[[Any], Any]
    set: Callable[[Any, Any], None]
    default: Callable[[Any, BranchableEnv], Any]


_WRAPPER_HANDLERS: dict[type, _WrapperHandler] = {}


def register_wrapper_state(
    wrapper_type: type[W],
    get_state: Callable[[W], Any] | None = None,
    set_state: Callable[[W, Any], None] | None = None,
    default_state: Callable[[W, BranchableEnv], Any] | None = None,
) -> None:
    """Teach `snapshot`/`restore` how to capture a wrapper's state.

    Args:
        wrapper_type: The wrapper class (matched exactly, not by subclass).
        get_state: Returns the wrapper's state as an immutable value; None for a
            wrapper with no state that affects behaviour.
        set_state: Puts such a value back.
        default_state: The state to set when restoring a snapshot taken from the bare
            env (given the wrapper and the restored bare env); defaults to leaving it.
    """
    if (get_state is None) != (set_state is None):
        raise ConfigError("register_wrapper_state needs both get_state and set_state, or neither.")

    def _none(_: Any) -> Any:
        return None

    def _skip(_: Any, __: Any) -> None:
        return None

    _WRAPPER_HANDLERS[wrapper_type] = _WrapperHandler(
        get=get_state or _none,
        set=set_state or _skip,
        default=default_state or (lambda w, _env: (get_state or _none)(w)),
    )


def _set_attr(name: str) -> Callable[[Any, Any], None]:
    return lambda w, v: setattr(w, name, v)


def _passive_checks_done(wrapper: Any, _state: Any) -> None:
    # The checker compares a step with the reset before it; a restored env had no reset
    # here, so its one-off checks are marked done (they ran where the snapshot was taken).
    wrapper.checked_reset = wrapper.checked_step = wrapper.checked_data_reuse = True
    wrapper._previous_data = None


register_wrapper_state(gymnasium.wrappers.PassiveEnvChecker, lambda w: None, _passive_checks_done)
register_wrapper_state(
    gymnasium.wrappers.OrderEnforcing,
    lambda w: w._has_reset,
    _set_attr("_has_reset"),
    lambda w, env: True,
)
register_wrapper_state(
    gymnasium.wrappers.TimeLimit,
    lambda w: w._elapsed_steps,
    _set_attr("_elapsed_steps"),
    lambda w, env: env.turn,
)


def _wrapper_chain(env: gymnasium.Env[Any, Any]) -> tuple[list[Any], BranchableEnv]:
    chain: list[Any] = []
    inner: Any = env
    while isinstance(inner, gymnasium.Wrapper):
        chain.append(inner)
        inner = inner.env
    if not isinstance(inner, BranchableEnv):
        raise SnapshotError(
            f"Expected a trace_gym.BranchableEnv (possibly wrapped), got "
            f"{type(inner).__name__}. Only branchable envs can be snapshotted."
        )
    for wrapper in chain:
        if type(wrapper) not in _WRAPPER_HANDLERS:
            raise WrapperStateError(
                f"Cannot capture the state of wrapper {type(wrapper).__name__}: trace_gym knows "
                f"{sorted(t.__name__ for t in _WRAPPER_HANDLERS)}. Remove the wrapper, or "
                "register it with trace_gym.register_wrapper_state(WrapperClass, get_state, "
                "set_state) (no functions for a wrapper without state)."
            )
    return chain, inner


class Brancher:
    """Snapshots and restores one (possibly wrapped) env, its wrapper chain resolved once.

    `trace_gym.snapshot(env)` and `trace_gym.restore(env, s)` build one per call; code
    that branches the same env many times (the runner) keeps one per env.
    """

    def __init__(self, env: gymnasium.Env[Any, Any]) -> None:
        self.env = env
        chain, self.base = _wrapper_chain(env)
        self._wrappers = [(w, _WRAPPER_HANDLERS[type(w)]) for w in chain]
        self._names = tuple(type(w).__name__ for w in chain)
        self._getters = tuple((type(w).__name__, h.get, w) for w, h in self._wrappers)

    def snapshot(self) -> Snapshot:
        """Snapshot the env and its wrappers."""
        states = tuple([(name, get(wrapper)) for name, get, wrapper in self._getters])
        return Snapshot(self.base.env_id, self.base._capture(), states)

    def restore(self, snap: Snapshot) -> None:
        """Restore `snap` into the env and its wrappers."""
        saved = tuple(name for name, _ in snap.wrappers)
        if snap.wrappers and self._wrappers and saved != self._names:
            raise SnapshotError(
                f"The snapshot was taken through wrappers {list(saved)} but the env has "
                f"{list(self._names)}; restore into an env made the same way (same "
                "gymnasium.make call)."
            )
        self.base.restore(snap)
        for i, (wrapper, handler) in enumerate(self._wrappers):
            state = snap.wrappers[i][1] if snap.wrappers else handler.default(wrapper, self.base)
            handler.set(wrapper, state)


def snapshot(env: gymnasium.Env[Any, Any]) -> Snapshot:
    """Snapshot a branchable env through the wrappers `gymnasium.make` adds."""
    return Brancher(env).snapshot()


def restore(env: gymnasium.Env[Any, Any], snap: Snapshot) -> None:
    """Restore `snap` into a (possibly wrapped) branchable env, wrappers included."""
    Brancher(env).restore(snap)
