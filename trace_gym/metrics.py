"""What a sampling step bought: effective prompts and contrast, per rollout and per token."""

from __future__ import annotations

from collections.abc import Sequence

from trace_gym.budget import Ledger
from trace_gym.tree import RolloutTree


def effective_ratio(trees: Sequence[RolloutTree]) -> float:
    """Fraction of sampled prompts whose tree has both a success and a failure leaf."""
    if not trees:
        return float("nan")
    return sum(t.is_effective for t in trees) / len(trees)


def effective_per_rollouts(trees: Sequence[RolloutTree], ledger: Ledger, per: int = 1000) -> float:
    """Effective prompts per `per` rollouts spent (skipping prompts cannot inflate it)."""
    rollouts = ledger.total().rollouts
    return sum(t.is_effective for t in trees) * per / rollouts if rollouts else float("nan")


def effective_per_tokens(trees: Sequence[RolloutTree], ledger: Ledger, per: int = 100_000) -> float:
    """Effective prompts per `per` generated tokens."""
    tokens = ledger.total().generated_tokens
    return sum(t.is_effective for t in trees) * per / tokens if tokens else float("nan")


def contrast_pairs_per_anchor(trees: Sequence[RolloutTree]) -> float:
    """Mean (success leaf, failure leaf) pairs under each anchor (roots and branch points)."""
    pairs = [p for t in trees for p in t.contrast_pairs().values()]
    return sum(pairs) / len(pairs) if pairs else float("nan")
