"""Tests for trace_gym/budget.py: Budget validation, the Ledger and its recount from trees."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pytest

from trace_gym.budget import Budget, Ledger, StageCost
from trace_gym.errors import BudgetError, ConfigError
from trace_gym.tree import RolloutTree
from trace_gym.types import Task, message


# ----- Budget -------------------------------------------------------------------------------
def test_budget_total_and_continuations() -> None:
    budget = Budget(roots=16, continuations_per_root=3, max_per_prompt=8, candidates=4)
    assert budget.continuations == 48
    assert budget.total == 64
    assert budget.min_group == 2


def test_budget_without_continuations() -> None:
    budget = Budget(roots=8, continuations_per_root=0, max_per_prompt=8, candidates=1)
    assert (budget.continuations, budget.total) == (0, 8)


@pytest.mark.parametrize(
    ("roots", "m_max", "candidates", "min_group"),
    [
        (2, 2, 1, 2),  # one group of the minimum size
        (16, 8, 2, 2),  # exactly candidates x Mmax
        (5, 3, 2, 2),  # 2 + 3
        (7, 3, 3, 2),  # 2 + 2 + 3
        (1, 1, 1, 1),
    ],
)
def test_budget_accepts_representable_roots(roots: int, m_max: int, candidates: int, min_group: int) -> None:
    Budget(roots, 1, m_max, candidates, min_group)


def test_budget_error_is_a_config_error() -> None:
    assert issubclass(BudgetError, ConfigError)


def test_budget_roots_above_candidates_times_mmax() -> None:
    with pytest.raises(
        BudgetError,
        match=r"roots \(M=17\) cannot be spent on 2 candidates with at most 8 rollouts each "
        r"\(at most 16\)\. Lower roots, or raise candidates or max_per_prompt\.",
    ):
        Budget(roots=17, continuations_per_root=1, max_per_prompt=8, candidates=2)


def test_budget_mmax_below_min_group() -> None:
    with pytest.raises(
        BudgetError,
        match=r"max_per_prompt \(Mmax=1\) must be >= min_group \(2\); raise max_per_prompt\.",
    ):
        Budget(roots=4, continuations_per_root=1, max_per_prompt=1, candidates=8)


def test_budget_roots_below_min_group() -> None:
    with pytest.raises(BudgetError, match=r"roots \(M=1\) must be >= min_group \(2\): one group at least\."):
        Budget(roots=1, continuations_per_root=1, max_per_prompt=8, candidates=8)


def test_budget_roots_not_a_sum_of_group_sizes() -> None:
    # With groups of exactly 2, an odd M cannot be spent.
    with pytest.raises(
        BudgetError,
        match=r"roots \(M=3\) is not a sum of group sizes in \[2, 2\] over at most 4 prompts; "
        r"pick M between k·2 and k·2 for some k <= 4\.",
    ):
        Budget(roots=3, continuations_per_root=1, max_per_prompt=2, candidates=4)


def test_budget_roots_gap_between_group_counts() -> None:
    # k=1 covers [5, 6], k=2 covers [10, 12]: 7, 8, 9 cannot be spent.
    Budget(6, 0, 6, 3, min_group=5)
    Budget(10, 0, 6, 3, min_group=5)
    for roots in (7, 8, 9):
        with pytest.raises(
            BudgetError, match=rf"roots \(M={roots}\) is not a sum of group sizes in \[5, 6\]"
        ):
            Budget(roots, 0, 6, 3, min_group=5)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"min_group": 0}, r"min_group must be >= 1, got 0\."),
        ({"continuations_per_root": -1}, r"continuations_per_root \(N\) must be >= 0, got -1\."),
        ({"candidates": 0}, r"candidates must be >= 1, got 0\."),
    ],
)
def test_budget_bounds(kwargs: dict[str, Any], pattern: str) -> None:
    base: dict[str, Any] = {"roots": 8, "continuations_per_root": 1, "max_per_prompt": 8, "candidates": 4}
    with pytest.raises(BudgetError, match=pattern):
        Budget(**{**base, **kwargs})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("roots", 8.0),
        ("roots", "8"),
        ("continuations_per_root", True),
        ("max_per_prompt", None),
        ("candidates", 4.5),
        ("min_group", False),
    ],
)
def test_budget_fields_must_be_ints(name: str, value: Any) -> None:
    base: dict[str, Any] = {"roots": 8, "continuations_per_root": 1, "max_per_prompt": 8, "candidates": 4}
    with pytest.raises(BudgetError, match=rf"Budget\.{name} must be an int, got {value!r}\."):
        Budget(**{**base, name: value})


def test_budget_is_frozen() -> None:
    budget = Budget(8, 1, 8, 4)
    with pytest.raises(AttributeError):
        budget.roots = 4  # type: ignore[misc]


# ----- StageCost and Ledger -----------------------------------------------------------------
def test_stage_cost_add_and_counts() -> None:
    a = StageCost(
        rollouts=2, turns=5, prompt_tokens=100, generated_tokens=40, tool_calls=3, failures=1, wall_time=0.5
    )
    a.add(StageCost(rollouts=1, turns=2, prompt_tokens=10, generated_tokens=4, tool_calls=1, wall_time=0.25))
    assert asdict(a) == {
        "rollouts": 3,
        "turns": 7,
        "prompt_tokens": 110,
        "generated_tokens": 44,
        "tool_calls": 4,
        "failures": 1,
        "wall_time": 0.75,
    }
    assert "wall_time" not in a.counts()
    assert a.counts()["turns"] == 7


def test_ledger_stage_is_created_once_and_mutable() -> None:
    ledger = Ledger()
    assert ledger.stages == {}
    cost = ledger.stage("root")
    assert cost == StageCost()
    cost.rollouts += 3
    assert ledger.stage("root") is cost
    assert ledger.stage("root").rollouts == 3
    assert list(ledger.stages) == ["root"]


def make_ledger() -> Ledger:
    ledger = Ledger()
    root = StageCost(rollouts=8, turns=30, prompt_tokens=900, generated_tokens=200, tool_calls=28)
    root.failures, root.wall_time = 1, 1.5
    ledger.stage("root").add(root)
    continuation = StageCost(rollouts=4, turns=9, prompt_tokens=500, generated_tokens=60, tool_calls=9)
    continuation.wall_time = 0.5
    ledger.stage("continuation").add(continuation)
    return ledger


def test_ledger_total() -> None:
    total = make_ledger().total()
    assert asdict(total) == {
        "rollouts": 12,
        "turns": 39,
        "prompt_tokens": 1400,
        "generated_tokens": 260,
        "tool_calls": 37,
        "failures": 1,
        "wall_time": 2.0,
    }
    assert Ledger().total() == StageCost()


def test_ledger_merge() -> None:
    ledger = make_ledger()
    other = Ledger()
    other.stage("root").add(StageCost(rollouts=2, turns=4))
    other.stage("extra").add(StageCost(rollouts=1, turns=1, failures=1))
    ledger.merge(other)
    counts = ledger.counts()
    assert list(counts) == ["continuation", "extra", "root"]
    assert counts["root"]["rollouts"] == 10
    assert counts["root"]["turns"] == 34
    assert counts["continuation"] == make_ledger().counts()["continuation"]
    assert counts["extra"]["failures"] == 1
    # merging does not alias the other ledger's records
    ledger.stage("extra").rollouts += 5
    assert other.stage("extra").rollouts == 1


def test_ledger_dict_round_trip() -> None:
    ledger = make_ledger()
    data = ledger.to_dict()
    assert list(data) == ["continuation", "root"]
    assert data["root"]["wall_time"] == 1.5
    again = Ledger.from_dict(json.loads(json.dumps(data)))
    assert again.to_dict() == data
    assert again.counts() == ledger.counts()
    assert again.total() == ledger.total()
    assert "Ledger(" in repr(again)


# ----- Ledger.from_trees --------------------------------------------------------------------
def hand_built_trees() -> list[RolloutTree]:
    """Two trees: a root group with a failure and a continuation branch, and a failed reset."""
    tree = RolloutTree(Task("t-1", "go"))
    root = tree.root
    root.messages, root.stage = (message("user", "go"),), "root"
    a = tree.add_child(root, action="a", stage="root", prompt_tokens=10, completion_tokens=3, tool_calls=1)
    tree.add_child(a, action="a2", stage="root", terminated=True, reward=1.0, success=True,
                   prompt_tokens=20, completion_tokens=4, tool_calls=1)  # fmt: skip
    tree.add_child(root, action="b", stage="root", failed=True, error="env step failed: x",
                   prompt_tokens=10, completion_tokens=5)  # fmt: skip
    tree.add_child(root, action="", stage="root", failed=True, finish_reason="error",
                   error="generation failed: boom")  # fmt: skip
    c = tree.add_child(
        a, action="c", stage="continuation", prompt_tokens=20, completion_tokens=2, tool_calls=2
    )
    tree.add_child(c, action="c2", stage="continuation", truncated=True,
                   prompt_tokens=30, completion_tokens=6, tool_calls=1)  # fmt: skip

    broken = RolloutTree(Task("t-2", "go"))
    broken.root.stage = "root"
    broken.root.failed, broken.root.error = True, "reset failed: RuntimeError: no"
    return [tree, broken]


def test_ledger_from_trees_by_hand() -> None:
    counts = Ledger.from_trees(hand_built_trees()).counts()
    assert counts == {
        "continuation": {
            "rollouts": 1,
            "turns": 2,
            "prompt_tokens": 50,
            "generated_tokens": 8,
            "tool_calls": 3,
            "failures": 0,
        },
        "root": {
            # leaves a2, b, the failed generation, and the failed reset of t-2
            "rollouts": 4,
            "turns": 4,
            "prompt_tokens": 40,
            "generated_tokens": 12,
            "tool_calls": 2,
            "failures": 3,
        },
    }


def test_ledger_from_trees_ignores_a_bare_root_and_has_no_wall_time() -> None:
    tree = RolloutTree(Task("t", "x"))
    assert Ledger.from_trees([tree]).counts() == {}
    assert Ledger.from_trees(hand_built_trees()).total().wall_time == 0.0
    assert Ledger.from_trees([]).counts() == {}
