"""A two-turn env with a tool whose reward a random model hits half the time.

Turn 1 is any text; the tool answers with a fixed observation. Turn 2 ends the episode
with reward 1 when the turn's text has an even number of characters. A random tiny
model gets mixed groups, so its advantages are not all zero.
"""

from __future__ import annotations

from typing import Any

import gymnasium

from trace_gym import BranchableEnv, Outcome, Task
from trace_gym.types import Message

ENV_ID = "trace_gym_test/ParityTool-v0"
OBSERVATION = "Noted. Now reply again; an even number of characters wins."
TOOL = {
    "type": "function",
    "function": {"name": "note", "parameters": {"type": "object", "properties": {}}},
}


class ParityToolEnv(BranchableEnv):
    tools = (TOOL,)
    stop_sequences = ("</tool_call>",)
    steps_block = False

    def __init__(self, render_mode: str | None = None, num_tasks: int = 8) -> None:
        tasks = [Task(f"parity-{i}", f"Task {i}: write something, twice.") for i in range(num_tasks)]
        super().__init__(tasks, max_turns=2, render_mode=render_mode)
        self._turns = 0

    def _start(self, task: Task) -> tuple[list[Message], dict[str, Any]]:
        self._turns = 0
        return task.messages(), {}

    def _act(self, action: str) -> Outcome:
        self._turns += 1
        if self._turns == 1:
            return Outcome([{"role": "tool", "content": OBSERVATION}], info={"tool_calls": 1})
        win = len(action) % 2 == 0
        return Outcome([{"role": "user", "content": "done"}], float(win), terminated=True)

    def _get_state(self) -> int:
        return self._turns

    def _set_state(self, state: int) -> None:
        self._turns = state


def register() -> None:
    if ENV_ID not in gymnasium.registry:
        gymnasium.register(ENV_ID, entry_point=f"{__name__}:ParityToolEnv", disable_env_checker=True)
