"""FunctionCalling-v0: BFCL v4 multi-turn tasks over stateful API simulators, scored by BFCL."""

from __future__ import annotations

import functools
import json
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trace_gym.env import BranchableEnv, Outcome
from trace_gym.envs import _bfcl
from trace_gym.envs._bfcl import CATEGORIES, INSTALL_COMMAND, Entry
from trace_gym.errors import ConfigError
from trace_gym.tools.parsers import ToolCall, parse_turn
from trace_gym.types import Message, Task, message

__all__ = [
    "CATEGORIES",
    "INSTALL_COMMAND",
    "SYSTEM_PROMPT",
    "FunctionCallingEnv",
    "ground_truth_actions",
    "hermes_call",
]

SYSTEM_PROMPT = (
    "You are an assistant that completes the user's requests by calling functions. To call "
    "a function, write "
    '<tool_call>{"name": <function name>, "arguments": <JSON object of arguments>}</tool_call>; '
    "a reply may hold several such blocks, which run in order. Each call's result comes "
    "back as a tool message. When you have done all you can for the current request, "
    "reply without any tool call: the user then sends the next request."
)
END_MESSAGE = "The conversation is over."

_Decoded = tuple[tuple[tuple[str, ...], ...], ...]


def hermes_call(name: str, arguments: Mapping[str, Any]) -> str:
    """One Hermes tool-call block.

    >>> hermes_call("cd", {"folder": "document"})
    '<tool_call>{"name": "cd", "arguments": {"folder": "document"}}</tool_call>'
    """
    return f"<tool_call>{json.dumps({'name': name, 'arguments': dict(arguments)})}</tool_call>"


def ground_truth_actions(task_id: str) -> list[str]:
    """The actions that replay BFCL's ground truth of an entry, as a policy would send them.

    Per user turn: one action holding all of the turn's ground-truth calls (when it has
    any), then a reply without tool calls that ends the turn.
    """
    entry = _entry_or_error(task_id)
    actions: list[str] = []
    for calls in entry.ground_truth:
        if calls:
            actions.append("".join(hermes_call(*_bfcl.ground_truth_call(c, entry)) for c in calls))
        actions.append("Done.")
    return actions


def _entry_or_error(task_id: str) -> Entry:
    entry = _bfcl.find_entry(task_id)
    if entry is None:
        raise ConfigError(
            f"{task_id!r} is not a BFCL multi-turn entry id; ids look like 'multi_turn_base_0', "
            f"with a category in {list(CATEGORIES)} and an index in 0..199."
        )
    return entry


def _task(entry: Entry) -> Task:
    prompt = (message("system", SYSTEM_PROMPT), *entry.turns[0])
    metadata = {
        "category": entry.category,
        "involved_classes": list(entry.involved_classes),
        "user_turns": len(entry.turns),
    }
    return Task(entry.id, prompt, answer=entry.ground_truth, metadata=metadata)


def _tasks(categories: Sequence[str]) -> tuple[Task, ...]:
    return tuple(task for category in categories for task in _category_tasks(category))


@functools.cache
def _category_tasks(category: str) -> tuple[Task, ...]:
    """The tasks of one category (frozen, so envs share them)."""
    return tuple(_task(entry) for entry in _bfcl.load_category(category))


def _valid_categories(categories: str | Sequence[str]) -> tuple[str, ...]:
    chosen = (categories,) if isinstance(categories, str) else tuple(categories)
    unknown = [c for c in chosen if c not in CATEGORIES]
    if unknown or not chosen:
        raise ConfigError(
            f"categories must be a non-empty subset of {list(CATEGORIES)}, got {list(chosen)!r}. "
            "Example: gymnasium.make('trace_gym/FunctionCalling-v0', categories=['base'])."
        )
    return tuple(dict.fromkeys(chosen))


class FunctionCallingEnv(BranchableEnv):
    """BFCL v4 multi-turn: several user requests served by calling stateful API simulators.

    The tasks are the 800 entries of the Berkeley Function Calling Leaderboard's
    multi-turn categories `base`, `long_context`, `miss_func` and `miss_param` (from the
    `bfcl-eval` package; choose with `categories=`, pick one with
    `reset(options={"task_id": "multi_turn_base_0"})`). Each episode gets its own
    instances of the API classes the entry involves (GorillaFileSystem, TwitterAPI,
    MessageAPI, TicketAPI, TradingBot, TravelAPI, VehicleControlAPI, MathAPI), loaded with
    the entry's initial configuration as BFCL loads them; nothing is shared between envs,
    episodes or branches.

    ## Observation
    Text. After reset: the first user request (the transcript starts with a system
    message that explains the tool-call format). After an action with tool calls: one
    role "tool" message per call, in order, holding the call's result as BFCL renders it
    (a str as is, a dict as JSON) or an error; the observation is the last of them.
    After a reply without tool calls: the next user request, or, after the last one,
    "The conversation is over.".

    `tools` lists the functions of the current user turn as OpenAI tool schemas, built
    from BFCL's function docs as BFCL's `convert_to_tool` builds them. In `miss_func`
    entries some functions are held out until the turn BFCL names: that turn's user
    message is BFCL's "I have updated some more functions you can choose from. What about
    now?" followed by the new functions' schemas, and `tools` includes them from then on.
    As in BFCL, every public method of an involved class can be called, listed or not.

    ## Action
    The assistant's turn: zero or more Hermes tool calls
    `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, run in order against
    the instances with BFCL's semantics: the arguments are passed as BFCL passes a
    decoded call, and the result is rendered as BFCL renders it. An unknown function, a
    block that is not valid JSON (or lacks a name, or whose arguments are not an
    object), an argument name that is not an identifier or a non-finite number gives an
    error message ("Error: ...") and is not run; a function that rejects its arguments
    (a wrong type, a missing or unexpected argument) answers with its own error text
    ("Error during execution: ..." or the error it returns), as in BFCL. An action
    without any tool-call block ends the agent's part of the current user turn.

    ## Reward
    At the end of the last user turn, BFCL's own `multi_turn_checker` decides: it replays
    the calls the agent made (per user turn, per step) and BFCL's ground truth on fresh
    instances and compares the instances' states and the calls' results after every
    turn. Reward 1.0 when it passes, else 0.0; `info["success"]` is its verdict and, on
    failure, `info["error_type"]`, `info["error_message"]` and `info["error_details"]`
    carry its explanation. Intermediate steps give 0.0.

    ## Episode end
    Terminated after the reply that ends the last user turn (scored), or when the agent
    takes more than `max_steps_per_turn` actions with tool-call blocks (well-formed or
    not) within one user turn (reward 0, `info["error_type"] ==
    "multi_turn:force_terminated"`: BFCL's force-quit, whose limit is 20). Truncated
    after `max_turns` actions in all (default 200; the entries have at most 8 user
    turns).

    ## Version history
    - v0: initial version (bfcl-eval 2026.3.23).

    Args:
        categories: The categories whose entries are the tasks (all four by default).
        max_steps_per_turn: Actions with tool calls allowed per user turn (BFCL: 20).
        max_turns: Actions allowed per episode in all.
        render_mode: None or "ansi".
    """

    stop_sequences = ()
    steps_block = False

    def __init__(
        self,
        categories: str | Sequence[str] = CATEGORIES,
        *,
        max_steps_per_turn: int = 20,
        max_turns: int = 200,
        render_mode: str | None = None,
    ) -> None:
        self.categories = _valid_categories(categories)
        if max_steps_per_turn < 1:
            raise ConfigError(f"max_steps_per_turn must be >= 1, got {max_steps_per_turn}.")
        super().__init__(_tasks(self.categories), max_turns=max_turns, render_mode=render_mode)
        self.max_steps_per_turn = max_steps_per_turn
        self.tools = ()
        self._entry: Entry | None = None
        self._instances: dict[str, Any] = {}
        self._pickled: dict[str, bytes] = {}
        self._owners: dict[str, str] = {}
        self._user_turn = 0
        self._steps = 0
        self._decoded: _Decoded = ()

    # ----- tasks ----------------------------------------------------------------------
    def check_task(self, task: Task) -> None:
        """Only BFCL multi-turn entries (by id) can be posed."""
        _entry_or_error(task.id)

    @property
    def entry(self) -> Entry | None:
        """The BFCL entry of the current episode."""
        return self._entry

    @property
    def user_turn(self) -> int:
        """The index of the current user turn."""
        return self._user_turn

    # ----- episode --------------------------------------------------------------------
    def _start(self, task: Task) -> tuple[list[Message], dict[str, Any]]:
        entry = _entry_or_error(task.id)
        self._begin(entry, _bfcl.make_instances(entry), {}, 0, 0, ((),))
        info = {"category": entry.category, "user_turn": 0, "user_turns": len(entry.turns)}
        return task.messages(), info

    def _begin(
        self,
        entry: Entry,
        instances: dict[str, Any],
        pickled: dict[str, bytes],
        user_turn: int,
        steps: int,
        decoded: _Decoded,
    ) -> None:
        if self._entry is not entry:
            self._entry = entry
            self._owners = _bfcl.method_owners(entry.involved_classes)
        self._instances, self._pickled = instances, pickled
        self._user_turn, self._steps, self._decoded = user_turn, steps, decoded
        self.tools = _openai_tools(entry, user_turn)

    def _act(self, action: str) -> Outcome:
        assert self._entry is not None
        parsed = parse_turn(action)
        if not parsed.calls and not parsed.errors:
            return self._end_user_turn()
        self._steps += 1
        messages: list[Message] = []
        executed: list[str] = []
        for call in parsed.calls:
            text, decoded = self._run(call)
            messages.append(message("tool", text))
            if decoded is not None:
                executed.append(decoded)
        messages.extend(message("tool", f"Error: {error}.") for error in parsed.errors)
        if executed:
            *done, current = self._decoded
            self._decoded = (*done, (*current, tuple(executed)))
        info: dict[str, Any] = {"user_turn": self._user_turn, "tool_calls": len(parsed.calls)}
        if self._steps > self.max_steps_per_turn:
            info.update(
                error_type="multi_turn:force_terminated",
                error_message=(
                    f"More than {self.max_steps_per_turn} tool-call actions in user turn "
                    f"{self._user_turn}; the episode was force-terminated, as BFCL does."
                ),
            )
            messages.append(message("user", END_MESSAGE))
            return Outcome(messages, 0.0, terminated=True, success=False, info=info)
        return Outcome(messages, info=info)

    def _run(self, call: ToolCall) -> tuple[str, str | None]:
        """The observation of one call, and its BFCL call string when it ran."""
        owner = self._owners.get(call.name)
        if owner is None:
            names = ", ".join(str(t["function"]["name"]) for t in self.tools)
            return f"Error: unknown function {call.name!r}; the functions are: {names}.", None
        problem = _bfcl.argument_error(call.name, call.arguments)
        if problem is not None:
            return f"Error: {problem}.", None
        decoded = _bfcl.call_string(call.name, call.arguments)  # before the call can mutate them
        self._pickled.pop(owner, None)
        return _bfcl.execute(self._instances[owner], call.name, call.arguments), decoded

    def _end_user_turn(self) -> Outcome:
        entry = self._entry
        assert entry is not None
        if self._user_turn + 1 < len(entry.turns):
            self._user_turn += 1
            self._steps = 0
            self._decoded = (*self._decoded, ())
            self.tools = _openai_tools(entry, self._user_turn)
            step_info = {"user_turn": self._user_turn, "tool_calls": 0}
            return Outcome(_user_messages(entry, self._user_turn), info=step_info)
        verdict = _bfcl.check(entry, self._decoded)
        success = bool(verdict.get("valid"))
        info: dict[str, Any] = {"user_turn": self._user_turn, "tool_calls": 0, "decoded_calls": self._decoded}
        if not success:
            info["error_type"] = verdict.get("error_type")
            info["error_message"] = verdict.get("error_message")
            info["error_details"] = {k: v for k, v in verdict.items() if k not in ("valid", "error_type")}
        end = [message("user", END_MESSAGE)]
        return Outcome(end, float(success), terminated=True, success=success, info=info)

    # ----- snapshots ------------------------------------------------------------------
    def _get_state(self) -> tuple[str, int, int, _Decoded, tuple[tuple[str, bytes], ...]]:
        """The entry id, turn position, calls made and pickled instances.

        Each instance is pickled once and the bytes are reused by later snapshots until a
        call runs on it (pickling copies BFCL's classes about five times faster than
        `copy.deepcopy`).
        """
        assert self._entry is not None
        blobs = []
        for name, instance in self._instances.items():
            blob = self._pickled.get(name)
            if blob is None:
                blob = self._pickled[name] = pickle.dumps(instance, protocol=pickle.HIGHEST_PROTOCOL)
            blobs.append((name, blob))
        return (self._entry.id, self._user_turn, self._steps, self._decoded, tuple(blobs))

    def _set_state(self, state: tuple[str, int, int, _Decoded, tuple[tuple[str, bytes], ...]]) -> None:
        entry_id, user_turn, steps, decoded, blobs = state
        entry = _entry_or_error(entry_id)
        instances = {name: pickle.loads(blob) for name, blob in blobs}
        self._begin(entry, instances, dict(blobs), user_turn, steps, decoded)

    # ----- scripted play --------------------------------------------------------------
    def example_action(self, rng: np.random.Generator) -> str:
        """The next ground-truth calls of the current user turn (1 to 3 of them), else a reply.

        With probability 0.15 it replies early (ending the user turn), which, like the
        ground truth, walks the episode through every user turn.
        """
        entry = self._entry
        if entry is None or self._user_turn >= len(entry.ground_truth):
            return "Done."
        calls = entry.ground_truth[self._user_turn]
        made = sum(len(step) for step in self._decoded[-1]) if self._decoded else 0
        if made >= len(calls) or rng.random() < 0.15:
            return "Done."
        count = int(rng.integers(1, 4))
        chosen = calls[made : made + count]
        return "".join(hermes_call(*_bfcl.ground_truth_call(c, entry)) for c in chosen)


_TOOL_CACHE: dict[tuple[str, int], tuple[Mapping[str, Any], ...]] = {}


def _openai_tools(entry: Entry, user_turn: int) -> tuple[Mapping[str, Any], ...]:
    """The entry's tools in user turn `user_turn` (converted once per entry and reveal)."""
    last_reveal = max((t for t in entry.revealed if t <= user_turn), default=-1)
    key = (entry.id, last_reveal)
    tools = _TOOL_CACHE.get(key)
    if tools is None:
        tools = _TOOL_CACHE[key] = tuple(_bfcl.openai_tool(doc) for doc in entry.docs_at(user_turn))
    return tools


def _user_messages(entry: Entry, user_turn: int) -> list[Message]:
    """The messages that open user turn `user_turn` (BFCL's reveal message when it has none)."""
    turn = list(entry.turns[user_turn])
    if turn:
        return turn
    new = [_bfcl.openai_tool(doc) for doc in entry.revealed.get(user_turn, ())]
    text = _bfcl.reveal_prompt()
    if new:
        text += "\n\nNew functions:\n" + "\n".join(json.dumps(t) for t in new)
    return [message("user", text)]
