"""The `Sampler` interface: how a sampling step spends its rollout budget (DESIGN section 8)."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trace_gym.budget import Budget, Ledger
from trace_gym.errors import BudgetError, ConfigError
from trace_gym.predictors.base import Anchor, Predictor, check_probabilities
from trace_gym.rollout import Job, RolloutRunner
from trace_gym.tree import Node, RolloutTree
from trace_gym.types import Task

ROOT_STAGE = "root"
CONTINUATION_STAGE = "continuation"


@dataclass(frozen=True)
class Prediction:
    """One success probability a sampler predicted and acted on.

    Attributes:
        task_id: The prompt's task id.
        node_id: The anchor's node id in the prompt's tree (0 for the root), or None for a
            candidate prompt that got no rollouts (nothing realised to compare with).
        stage: "root" (Stage 1, a candidate prompt) or "prefix" (Stage 2, a visited prefix).
        value: The predicted probability.
    """

    task_id: str
    node_id: int | None
    stage: str
    value: float


@dataclass
class SampleBatch:
    """What one sampling step produced.

    Attributes:
        trees: One rollout tree per sampled prompt, in candidate order.
        ledger: What the step spent, by stage ("root", "continuation").
        allocations: The sampler's decisions: "roots" maps task id to m_i, "prefixes"
            maps "task_id/node_id" to K.
        predictions: The predictions the decisions used.
        predictor_metrics: What `predictor.fit` returned, if the sampler learns.
        fallback: Why the sampler fell back to uniform choices this step (None if it did not).
    """

    trees: list[RolloutTree]
    ledger: Ledger
    allocations: dict[str, dict[str, int]] = field(default_factory=dict)
    predictions: list[Prediction] = field(default_factory=list)
    predictor_metrics: dict[str, float] = field(default_factory=dict)
    fallback: str | None = None


class Sampler(abc.ABC):
    """Decides where a step's M·(1 + N) rollouts go, from a pool of candidate prompts.

    Every sampler spends exactly `budget.total` rollouts per step (a reset that fails
    ends its whole job in one failed leaf), counted by the runner in one ledger.
    """

    name: str = "sampler"

    @abc.abstractmethod
    def sample(self, tasks: Sequence[Task], runner: RolloutRunner, budget: Budget) -> SampleBatch:
        """Spend exactly `budget.total` rollouts on `tasks` and return the trees."""

    def state_dict(self) -> dict[str, Any]:
        """The sampler's learned state, for checkpoints (empty when it learns nothing)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: B027 (optional hook)
        """Restore what `state_dict` returned (nothing to restore by default)."""


def check_pool(tasks: Sequence[Task], needed: int, sampler: str) -> None:
    """Refuse an empty pool, or one with fewer than `needed` prompts."""
    if not tasks:
        raise BudgetError(f"{sampler} got an empty candidate pool; pass at least one task.")
    if needed > len(tasks):
        raise BudgetError(
            f"{sampler} needs {needed} prompts but the pool has {len(tasks)}. Raise candidates "
            "or lower the budget."
        )


def group_count(budget: Budget, rollouts: int, group_size: int, sampler: str) -> int:
    """`rollouts // group_size`, refusing a remainder."""
    if rollouts % group_size:
        raise BudgetError(
            f"{sampler} spends {rollouts} rollouts in groups of {group_size}, which does not "
            f"divide it (M={budget.roots}, N={budget.continuations_per_root}). Pick a group "
            "size that divides it, or change the budget."
        )
    return rollouts // group_size


def run_roots(
    runner: RolloutRunner, tasks: Sequence[Task], counts: Sequence[int], ledger: Ledger
) -> tuple[list[RolloutTree], dict[str, int]]:
    """Stage 1: `counts[i]` bare rollouts of `tasks[i]` (skipping zeros), as new trees."""
    chosen = [(task, int(m)) for task, m in zip(tasks, counts, strict=True) if m > 0]
    trees = runner.run([Job(task, m, stage=ROOT_STAGE) for task, m in chosen], ledger)
    return trees, {task.id: m for task, m in chosen}


def visited_prefixes(tree: RolloutTree) -> list[Node]:
    """H_ijt: every turn node a continuation can branch from (not the root, not a leaf)."""
    return [n for n in tree.nodes[1:] if not n.done and n.snapshot is not None]


def branch_points(trees: Sequence[RolloutTree]) -> list[list[Node]]:
    """Each tree's visited prefixes; the roots when no tree has one.

    When every rollout of a step ended after one turn (a single-turn env, or a multi-turn
    env answered at once), the only prefix left is each prompt's empty one: continuations
    from a root are further full rollouts of that prompt, so a Stage 2 budget is still
    spent, and spent on the prompts.
    """
    pools = [visited_prefixes(t) for t in trees]
    if any(pools):
        return pools
    return [[t.root] if t.root.snapshot is not None and not t.root.done else [] for t in trees]


def observed_reward(node: Node) -> float:
    """r: the mean reward of the leaves below `node` (after Stage 1: its one rollout's reward)."""
    tree = node.tree
    assert tree is not None
    leaves = list(tree.leaves(node))
    return float(np.mean([leaf.reward for leaf in leaves])) if leaves else 0.0


def run_continuations(runner: RolloutRunner, counts: Mapping[Node, int], ledger: Ledger) -> dict[str, int]:
    """Stage 2: `counts[node]` continuations from each prefix; returns them keyed "task/node"."""
    chosen = [(node, int(k)) for node, k in counts.items() if k > 0]
    runner.run([Job(node, k, stage=CONTINUATION_STAGE) for node, k in chosen], ledger)
    return {prefix_key(node): k for node, k in chosen}


def prefix_key(node: Node) -> str:
    """The key "task_id/node_id", how allocations name a prefix."""
    assert node.tree is not None
    return f"{node.tree.task.id}/{node.id}"


def random_prefix_counts(
    trees: Sequence[RolloutTree], per_tree: Sequence[int], rng: np.random.Generator
) -> dict[Node, int]:
    """Spend `per_tree[i]` continuations on prefixes of `trees[i]` chosen uniformly at random.

    A tree with no prefix (every rollout ended after one turn) passes its share to the
    trees that have some, so the budget is still spent exactly; when no tree has one, the
    roots are the prefixes (`branch_points`).
    """
    counts: dict[Node, int] = {}
    leftover = 0
    pools = branch_points(trees)
    for pool, k in zip(pools, per_tree, strict=True):
        if not pool:
            leftover += k
            continue
        for j in rng.integers(len(pool), size=k):
            counts[pool[j]] = counts.get(pool[j], 0) + 1
    everything = [n for pool in pools for n in pool]
    if leftover and not everything:
        raise BudgetError(
            f"No prefix to spend {leftover} continuations on: no rollout left a prefix and no root "
            "has a snapshot to branch from. Use continuations_per_root=0 with this env."
        )
    for j in rng.integers(len(everything), size=leftover) if leftover else []:
        counts[everything[j]] = counts.get(everything[j], 0) + 1
    return counts


def predict_or_explain(
    predictor: Predictor, anchors: Sequence[Anchor], what: str
) -> tuple[np.ndarray | None, str | None]:
    """The predictor's probabilities for `anchors`, or None and why it failed.

    A predictor that raises makes the caller fall back to uniform choices for the step.
    One that returns the wrong shape, NaN or values outside [0, 1] is a bug in it, and
    raises `ConfigError` naming the value.
    """
    if not anchors:
        return np.zeros(0), None
    try:
        raw = predictor.predict(anchors)
    except Exception as exc:  # a failing predictor must not lose the step
        return None, f"{type(predictor).__name__}.predict failed on {what}: {type(exc).__name__}: {exc}"
    values = np.asarray(raw, dtype=np.float64)
    if values.shape != (len(anchors),):
        raise ConfigError(
            f"{type(predictor).__name__}.predict returned shape {values.shape} for "
            f"{len(anchors)} {what}; it must return one probability per anchor."
        )
    return check_probabilities(values, f"{type(predictor).__name__}.predict on {what}"), None


def fit_or_explain(predictor: Predictor, trees: Sequence[RolloutTree]) -> tuple[dict[str, float], str | None]:
    """`predictor.fit(trees)`'s metrics, or empty metrics and why it failed."""
    try:
        return dict(predictor.fit(trees)), None
    except Exception as exc:  # the step's trees are still good data
        return {}, f"{type(predictor).__name__}.fit failed: {type(exc).__name__}: {exc}"


def root_predictions(
    tasks: Sequence[Task], values: np.ndarray, chosen: Mapping[str, int]
) -> list[Prediction]:
    """Stage 1 predictions; chosen prompts point at their tree's root (node 0)."""
    return [
        Prediction(t.id, 0 if t.id in chosen else None, "root", float(v))
        for t, v in zip(tasks, values, strict=True)
    ]


def prefix_predictions(prefixes: Sequence[Node], values: np.ndarray) -> list[Prediction]:
    """Stage 2 predictions, one per visited prefix."""
    out = []
    for node, v in zip(prefixes, values, strict=True):
        assert node.tree is not None
        out.append(Prediction(node.tree.task.id, node.id, "prefix", float(v)))
    return out
