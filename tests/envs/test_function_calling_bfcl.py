"""External validation of FunctionCalling-v0 against BFCL's ground truth and checker.

Every one of the 800 entries is played through the env as a policy would play it: per
user turn, one action with the turn's ground-truth calls as Hermes tool calls, then a
reply without tool calls. BFCL's own checker must pass every replay, and must fail a
replay from which one call is dropped or in which one call is corrupted.

Measured (bfcl-eval 2026.3.23): 800/800 replays pass; dropping the last call fails all
800 entries; corrupting it fails 792 (the 8 listed below); dropping any single one of the
4,625 ground-truth calls fails 4,622 (the 3 listed below).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("bfcl_eval", reason="needs bfcl-eval: pip install --no-deps bfcl-eval filelock mpmath")

from trace_gym.envs import _bfcl
from trace_gym.envs.function_calling import CATEGORIES, FunctionCallingEnv, hermes_call

Call = tuple[str, dict[str, Any]]

REPLAY_FAILURES: dict[str, str] = {}
"""Entries whose ground-truth replay cannot pass, with the reason: none."""

LAST_CALL_CORRUPTION_PASSES: dict[str, str] = {
    **{
        f"multi_turn_{category}_38": (
            "the last call is ls(a=True) and the directory holds no hidden entry, so the corrupted "
            "ls(a=False) lists the same: BFCL's state and response checks cannot tell them apart"
        )
        for category in CATEGORIES
    },
    **{
        f"multi_turn_{category}_63": (
            "the last call is estimate_drive_feasibility_by_mileage(distance=980.0), which "
            "already answers {'canDrive': false}; the corrupted 9807.0 miles gives the same "
            "answer and the call changes no state"
        )
        for category in CATEGORIES
    },
}
"""Entries where corrupting the last ground-truth call still passes BFCL's checker, and why."""

ANY_CALL_DROP_PASSES: dict[tuple[str, int, int], str] = {
    (entry_id, turn, 0): (
        "get_watchlist() returns {'watchlist': ['NVDA', 'QUAS']}, the same text that "
        "add_to_watchlist returned in turn 0; BFCL's response check looks for a turn's "
        "ground-truth results among all results so far, and get_watchlist changes no state"
    )
    for entry_id, turn in (
        ("multi_turn_base_113", 1),
        ("multi_turn_miss_func_113", 2),
        ("multi_turn_miss_param_113", 2),
    )
}
"""(entry, user turn, call index) whose dropping BFCL's checker cannot see, and why."""


@pytest.fixture(scope="module")
def env() -> FunctionCallingEnv:
    return FunctionCallingEnv()


def ground_truth(entry_id: str) -> list[list[Call]]:
    entry = _bfcl.find_entry(entry_id)
    assert entry is not None
    return [[_bfcl.ground_truth_call(c, entry) for c in turn] for turn in entry.ground_truth]


def play(env: FunctionCallingEnv, entry_id: str, turns: list[list[Call]]) -> dict[str, Any]:
    """Play the calls turn by turn as Hermes tool calls; the final step's info."""
    env.reset(options={"task_id": entry_id})
    info: dict[str, Any] = {}
    for calls in turns:
        if calls:
            _, _, terminated, truncated, info = env.step("".join(hermes_call(n, a) for n, a in calls))
            assert not (terminated or truncated)
        _, reward, terminated, truncated, info = env.step("That is all for this request.")
    assert terminated and not truncated
    assert info["success"] is (reward == 1.0)
    return info


def corrupt(value: Any) -> Any:
    """A different value of the same JSON type."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value * 10 + 7
    if isinstance(value, str):
        return value + "_x"
    if isinstance(value, list):
        return [*value, corrupt(value[0])] if value else ["x"]
    if isinstance(value, dict):
        return {**value, "x": 1}
    return "x"


def corrupted(call: Call) -> Call:
    name, arguments = call
    if not arguments:
        return f"{name}_x", arguments
    return name, {k: corrupt(v) for k, v in arguments.items()}


def last_call(turns: list[list[Call]]) -> tuple[int, int]:
    turn = max(i for i, calls in enumerate(turns) if calls)
    return turn, len(turns[turn]) - 1


def test_every_ground_truth_replay_passes_bfcls_checker(env: FunctionCallingEnv) -> None:
    failures = {}
    for entry_id in env.task_ids:
        info = play(env, entry_id, ground_truth(entry_id))
        if not info["success"]:
            failures[entry_id] = f"{info['error_type']}: {info['error_message']}"
    assert len(env.task_ids) == 800
    assert failures == REPLAY_FAILURES


def test_dropping_or_corrupting_the_last_call_fails(env: FunctionCallingEnv) -> None:
    dropped_passes, corrupted_passes = [], []
    for entry_id in env.task_ids:
        turns = ground_truth(entry_id)
        turn, index = last_call(turns)
        without = [list(calls) for calls in turns]
        del without[turn][index]
        if play(env, entry_id, without)["success"]:
            dropped_passes.append(entry_id)
        changed = [list(calls) for calls in turns]
        changed[turn][index] = corrupted(changed[turn][index])
        if play(env, entry_id, changed)["success"]:
            corrupted_passes.append(entry_id)
    assert dropped_passes == []
    assert sorted(corrupted_passes) == sorted(LAST_CALL_CORRUPTION_PASSES)


@pytest.mark.slow
def test_dropping_any_single_call_fails(env: FunctionCallingEnv) -> None:
    passes, total = [], 0
    for entry_id in env.task_ids:
        turns = ground_truth(entry_id)
        for turn, calls in enumerate(turns):
            for index in range(len(calls)):
                total += 1
                without = [list(c) for c in turns]
                del without[turn][index]
                if play(env, entry_id, without)["success"]:
                    passes.append((entry_id, turn, index))
    assert total == 4625
    assert sorted(passes) == sorted(ANY_CALL_DROP_PASSES)
