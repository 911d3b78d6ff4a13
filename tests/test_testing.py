"""The contract kit passes on correct envs and names the broken property on broken ones."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import gymnasium
import numpy as np
import pytest

from trace_gym import BranchableEnv, ConfigError, ContractViolation, Outcome, Task, message
from trace_gym.envs.synthetic import SyntheticTreeEnv
from trace_gym.testing import MALFORMED_ACTIONS, check_branchable_env, run_actions
from trace_gym.types import Message

TASKS = tuple(
    Task(f"tally-{i}", f"Reach {6 + i}: say 'add K' (K in 1..3) or 'roll'.", answer=6 + i) for i in range(4)
)
_MOVE = re.compile(r"add ([1-3])|roll")


class TallyEnv(BranchableEnv):
    """Count up to a target (a small, correct env that the broken ones below vary).

    ## Observation
    The running total and the number of moves so far.

    ## Action
    "add K" with K in 1..3, or "roll" (adds a draw from 1..3 made with `np_random`).

    ## Reward
    1.0 when the total lands exactly on the target, else 0.0.

    ## Episode end
    Terminated once the total reaches the target; truncated after 8 turns.

    ## Version history
    - v0: initial version.
    """

    def __init__(self, render_mode: str | None = None) -> None:
        super().__init__(TASKS, max_turns=8, render_mode=render_mode, max_text_length=1000)
        self._total = 0
        self._moves: tuple[str, ...] = ()

    def _start(self, task: Task) -> tuple[list[Message], dict[str, Any]]:
        self._total = int(self.np_random.integers(0, 3))
        self._moves = ()
        return task.messages(), {"total": self._total}

    def _act(self, action: str) -> Outcome:
        move = _MOVE.fullmatch(action.strip())
        if move is None:
            return Outcome([message("user", "Error: say 'add K' with K in 1..3, or 'roll'.")])
        self._total += int(move.group(1)) if move.group(1) else self._roll()
        self._moves = (*self._moves, move.group(0))
        assert self.task is not None
        target = int(self.task.answer)
        reward = float(self._total == target)
        return Outcome([message("tool", self._report())], reward, terminated=self._total >= target)

    def _roll(self) -> int:
        return int(self.np_random.integers(1, 4))

    def _report(self) -> str:
        return f"total {self._total} after {len(self._moves)} moves"

    def _get_state(self) -> Any:
        return (self._total, self._moves)

    def _set_state(self, state: Any) -> None:
        self._total, self._moves = state

    def example_action(self, rng: np.random.Generator) -> str:
        """'roll' or 'add K'."""
        return "roll" if rng.random() < 0.5 else f"add {int(rng.integers(1, 4))}"


class ListStateEnv(TallyEnv):
    """Broken: hands out its own move log, a list later steps append to, as snapshot state."""

    def _start(self, task: Task) -> tuple[list[Message], dict[str, Any]]:
        self._log: list[str] = []
        return super()._start(task)

    def _act(self, action: str) -> Outcome:
        self._log.append(action)
        return super()._act(action)

    def _get_state(self) -> Any:
        return (super()._get_state(), self._log)

    def _set_state(self, state: Any) -> None:
        base, self._log = state
        super()._set_state(base)


class ForgetfulEnv(TallyEnv):
    """Broken: `_set_state` restores the total but forgets the moves."""

    def _set_state(self, state: Any) -> None:
        self._total = state[0]


class FragileEnv(TallyEnv):
    """Broken: also takes tool calls, and parses their JSON without handling errors."""

    def _act(self, action: str) -> Outcome:
        if action.startswith("<tool_call>"):
            call = json.loads(action.removeprefix("<tool_call>").removesuffix("</tool_call>"))
            action = f"add {call['arguments']['n']}"
        return super()._act(action)


class LengthLimitEnv(TallyEnv):
    """Broken: raises on long input instead of answering with an error observation."""

    def _act(self, action: str) -> Outcome:
        if len(action) > 5000:
            raise ValueError(f"action too long ({len(action)} characters)")
        return super()._act(action)


_CALLS = itertools.count()


class CallCounterEnv(TallyEnv):
    """Broken: numbers its reports with a process-wide counter, so runs never repeat."""

    def _report(self) -> str:
        return f"{super()._report()} (call #{next(_CALLS)})"


class StoredRngEnv(TallyEnv):
    """Broken: draws from a generator it stored at reset, bypassing `self.np_random`."""

    def _start(self, task: Task) -> tuple[list[Message], dict[str, Any]]:
        self._rng = self.np_random
        return super()._start(task)

    def _roll(self) -> int:
        return int(self._rng.integers(1, 4))


class NoFpsEnv(TallyEnv):
    """Broken under gymnasium.make: declares render modes without a render fps."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}  # type: ignore[misc]


@pytest.fixture
def registered() -> Iterator[None]:
    """Register the test envs under `trace_gym_test/`, and remove them afterwards."""
    ids: dict[str, Callable[..., TallyEnv]] = {
        "trace_gym_test/Tally-v0": TallyEnv,
        "trace_gym_test/NoFps-v0": NoFpsEnv,
    }
    for env_id, cls in ids.items():
        gymnasium.register(env_id, entry_point=lambda cls=cls, **kwargs: cls(**kwargs))
    yield
    for env_id in ids:
        del gymnasium.registry[env_id]


# ----- passing envs -------------------------------------------------------------------
def test_kit_passes_on_bare_synthetic_tree() -> None:
    report = check_branchable_env(SyntheticTreeEnv(), make_env=SyntheticTreeEnv)
    assert sorted(report.episode_lengths) == [0, 1, 2]
    assert all(n >= 1 for n in report.episode_lengths.values())
    assert report.restores > 0
    assert report.malformed_actions >= 2 * (len(MALFORMED_ACTIONS) + 1)


def test_kit_passes_on_synthetic_tree_through_gymnasium_make() -> None:
    report = check_branchable_env(gymnasium.make("trace_gym/SyntheticTree-v0"))
    assert report.restores > 0


def test_kit_passes_on_a_correct_custom_env_bare_and_made(registered: None) -> None:
    bare = check_branchable_env(TallyEnv(), make_env=TallyEnv)
    made = check_branchable_env(gymnasium.make("trace_gym_test/Tally-v0"))
    assert bare.episode_lengths == made.episode_lengths
    assert bare.steps == made.steps


def test_kit_is_deterministic() -> None:
    first = check_branchable_env(TallyEnv(), make_env=TallyEnv)
    second = check_branchable_env(TallyEnv(), make_env=TallyEnv)
    assert (first.episode_lengths, first.steps, first.restores, first.malformed_actions) == (
        second.episode_lengths,
        second.steps,
        second.restores,
        second.malformed_actions,
    )


def test_depths_limit_the_restores() -> None:
    every = check_branchable_env(TallyEnv(), make_env=TallyEnv, seeds=(0,))
    some = check_branchable_env(TallyEnv(), make_env=TallyEnv, seeds=(0,), depths=(0, 2))
    assert 0 < some.restores < every.restores


def test_run_actions_stops_at_the_episode_end() -> None:
    env = TallyEnv()
    env.reset(seed=0, options={"index": 0})
    records = run_actions(env, ["add 3"] * 10)
    assert records[-1].terminated
    assert len(records) < 10
    assert [r.observation for r in records[:2]] == [
        records[0].transcript[-1][1],
        records[1].transcript[-1][1],
    ]


# ----- broken envs: each fails with its property named ---------------------------------
def test_kit_names_isolation_when_state_is_a_mutable_object() -> None:
    with pytest.raises(
        ContractViolation,
        match=r"^isolation broke at step 0: the snapshot of step 0 changed after the env "
        r"stepped on to step \d+ \(its pickle differs; .*\[seed 0, action none",
    ) as caught:
        check_branchable_env(ListStateEnv(), make_env=ListStateEnv)
    assert caught.value.property == "isolation"
    assert caught.value.step == 0


def test_kit_names_fidelity_when_set_state_forgets_part_of_the_state() -> None:
    with pytest.raises(
        ContractViolation,
        match=r"^fidelity broke at step 1: after restoring the snapshot of step 0 into the "
        r"same env, which had moved on: observation differs: expected 'total \d+ after 1 "
        r"moves', got 'total \d+ after \d+ moves' \[seed 0, action '",
    ):
        check_branchable_env(ForgetfulEnv(), make_env=ForgetfulEnv)


def test_kit_names_malformed_action_when_act_raises_on_broken_json() -> None:
    with pytest.raises(
        ContractViolation,
        match=r"^malformed action broke at step 1: step\(\) raised JSONDecodeError: .* on "
        r"arbitrary text \(a malformed action must give an error observation\) "
        r"\[seed 0, action '<tool_call>\{'\]$",
    ) as caught:
        check_branchable_env(FragileEnv(), make_env=FragileEnv)
    assert isinstance(caught.value.__cause__, json.JSONDecodeError)


def test_kit_clips_a_long_action_in_its_message() -> None:
    with pytest.raises(
        ContractViolation, match=r"^malformed action broke at step 1: step\(\) raised ValueError"
    ) as caught:
        check_branchable_env(LengthLimitEnv(), make_env=LengthLimitEnv)
    shown = re.search(r"action ('x+\.\.\.)\]$", str(caught.value))
    assert shown is not None
    assert len(shown.group(1)) == 80


def test_kit_names_determinism_when_output_depends_on_global_state() -> None:
    with pytest.raises(
        ContractViolation,
        match=r"^determinism broke at step \d+: a second run from reset\(seed=0\) with the "
        r"same actions gave different outputs .*: observation differs: expected 'total \d+ "
        r"after \d+ moves \(call #\d+\)', got",
    ):
        check_branchable_env(CallCounterEnv(), make_env=CallCounterEnv)


def test_kit_names_fidelity_when_rng_draws_bypass_np_random() -> None:
    with pytest.raises(
        ContractViolation,
        match=r"^fidelity broke at step \d+: .*the RNG state \(env.unwrapped.np_random\) "
        r"differs: expected .*, got .*Draw randomness from self.np_random",
    ):
        check_branchable_env(StoredRngEnv(), make_env=StoredRngEnv)


def test_kit_turns_a_check_env_warning_into_a_failure(registered: None) -> None:
    with pytest.raises(
        ContractViolation,
        match=r"^gymnasium.check_env broke: check_env warned: WARN: No render fps was declared",
    ):
        check_branchable_env(gymnasium.make("trace_gym_test/NoFps-v0"))


# ----- arguments ----------------------------------------------------------------------
def test_kit_asks_for_make_env_when_the_env_has_no_spec() -> None:
    with pytest.raises(ConfigError, match=r"TallyEnv has no spec .* Pass make_env"):
        check_branchable_env(TallyEnv())


def test_kit_refuses_an_env_that_is_not_branchable() -> None:
    with pytest.raises(ConfigError, match=r"Expected a trace_gym\.BranchableEnv .* got CartPoleEnv"):
        check_branchable_env(gymnasium.make("CartPole-v1"))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seeds": ()}, "seeds must be a non-empty sequence of ints, got ()"),
        ({"episode_actions": 0}, "episode_actions must be >= 1, got 0"),
        ({"depths": (0, 13)}, r"depths must be .* in \[0, episode_actions=12\], got \[0, 13\]"),
        ({"random_action_rate": 1.5}, r"random_action_rate must be in \[0, 1\], got 1.5"),
    ],
)
def test_kit_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        check_branchable_env(TallyEnv(), make_env=TallyEnv, **kwargs)
