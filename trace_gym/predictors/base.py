"""The `Predictor` interface and the training examples every predictor learns from (DESIGN section 8).

A predictor estimates v, the probability that a rollout continued from an anchor
succeeds. An anchor is a prompt before any rollout (a `Task`) or a node of a tree:
its root H_0 or a prefix H_t. Training targets come from the sampled trees (PAPER,
step 10): V̂(y) = mean terminal reward of the leaves under y, weighted by their count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.tree import Node, RolloutTree
from trace_gym.types import Message, Task

Anchor = Task | Node
"""What a predictor scores: a prompt before any rollout, or a node of a tree."""


@runtime_checkable
class Predictor(Protocol):
    """Predicts success probabilities of anchors and learns from sampled trees."""

    def predict(self, anchors: Sequence[Anchor]) -> np.ndarray:
        """Float64 success probabilities in [0, 1], one per anchor."""
        ...

    def fit(self, trees: Sequence[RolloutTree]) -> dict[str, float]:
        """Update from one step's trees; return metrics (e.g. "examples", "loss", "brier")."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The learned state (NumPy arrays and plain types), for checkpoints."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned; the predictor then predicts identically."""
        ...


@dataclass(frozen=True)
class Example:
    """One training example: an anchor and its empirical success rate.

    Attributes:
        anchor: The node (a root H_0 or a prefix H_t).
        target: V̂(anchor), the mean terminal reward of the leaves under it (in [0, 1]
            for 0/1 rewards; soft for internal nodes).
        weight: The number of leaves under it, times `prefix_weight` for non-root nodes.
        is_root: Whether the anchor is its tree's root.
    """

    anchor: Node
    target: float
    weight: float
    is_root: bool


def training_examples(
    trees: Sequence[RolloutTree], *, prefix_weight: float = 1.0, include_leaves: bool = False
) -> list[Example]:
    """The examples a step's trees give a predictor.

    One example per root and per non-root internal node (done leaves too when
    `include_leaves`), with target V̂(y) = Σ_{leaves l under y} r_l / n_y and weight
    n_y (times `prefix_weight` when y is not a root), where n_y counts the leaves
    under y. Nodes with no leaf below them are skipped.

    Args:
        trees: The trees of one (or more) sampling steps.
        prefix_weight: Multiplies the weight of every non-root example (0 keeps only roots).
        include_leaves: Also emit one example per leaf (its target is its own reward).

    Returns:
        The examples, tree by tree, in node id order.
    """
    if not prefix_weight >= 0:
        raise ConfigError(f"prefix_weight must be >= 0, got {prefix_weight}; use 0 to train on roots only.")
    examples = []
    for tree in trees:
        count, _, total = tree.leaf_stats()
        for node in tree.nodes:
            is_root = node.parent is None
            n = int(count[node.id])
            if n == 0 or (node.done and not is_root and not include_leaves):
                continue
            weight = float(n) if is_root else n * prefix_weight
            examples.append(Example(node, float(total[node.id] / n), weight, is_root))
    return examples


def anchor_turns(anchor: Anchor) -> list[tuple[str, str]]:
    """The (role, content) pairs of `anchor_messages`, without building message dicts."""
    if isinstance(anchor, Task):
        return [(m["role"], m["content"]) for m in anchor.messages()]
    path = anchor.path()
    turns: list[tuple[str, str]] = []
    root = path[0]
    if not root.messages and root.tree is not None:
        turns.extend((m["role"], m["content"]) for m in root.tree.task.messages())
    for node in path:
        if node.parent is not None:
            turns.append(("assistant", node.action))
        turns.extend((m["role"], m["content"]) for m in node.messages)
    return turns


def anchor_messages(anchor: Anchor) -> list[Message]:
    """The conversation an anchor stands for: a task's prompt, or a node's history H_t.

    A tree built by hand has a root without messages; its prompt is then taken from
    the tree's task, so H_0 reads the same whether the runner or a test built it.
    """
    return [{"role": role, "content": content} for role, content in anchor_turns(anchor)]


def anchor_text(anchor: Anchor) -> str:
    """The conversation text of an anchor, one "role: content" line per message.

    >>> anchor_text(Task("t", "Add 2 and 3."))
    'user: Add 2 and 3.'
    """
    return "\n".join(f"{role}: {content}" for role, content in anchor_turns(anchor))


def anchor_depth(anchor: Anchor) -> int:
    """Turns taken from the prompt: 0 for a task or a root, t for a prefix H_t."""
    return 0 if isinstance(anchor, Task) else anchor.depth


def anchor_task(anchor: Anchor) -> Task:
    """The task an anchor belongs to."""
    if isinstance(anchor, Task):
        return anchor
    if anchor.tree is None:
        raise ConfigError(f"Node {anchor.id} belongs to no RolloutTree, so its task is unknown.")
    return anchor.tree.task


def check_probabilities(p: np.ndarray, source: str) -> np.ndarray:
    """`p` as a 1-D float64 array, checked to hold probabilities in [0, 1].

    Samplers run every predictor's output through this, so a broken predictor fails
    loudly instead of steering the allocation with NaN.

    Args:
        p: The predictions.
        source: Who produced them, for the error message (e.g. "FeaturePredictor.predict").

    Raises:
        ConfigError: `p` is not 1-D, or names the first entry that is NaN or outside [0, 1].
    """
    arr = np.asarray(p, dtype=np.float64)
    if arr.ndim != 1:
        raise ConfigError(f"{source} must return a 1-D array (one value per anchor), got shape {arr.shape}.")
    bad = np.flatnonzero(~((arr >= 0.0) & (arr <= 1.0)))  # NaN fails both comparisons
    if bad.size:
        i = int(bad[0])
        raise ConfigError(
            f"{source} returned {float(arr[i])!r} at index {i} ({bad.size} bad of {arr.size}); "
            "success probabilities must be numbers in [0, 1]. Clip the predictor's output, "
            "or refit it if it diverged."
        )
    return arr
