"""What a sampling step bought: effective prompts and contrast, per rollout and per token."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from trace_gym.budget import Ledger
from trace_gym.errors import ConfigError
from trace_gym.tree import RolloutTree

if TYPE_CHECKING:  # the samplers import metrics' neighbours; only the type is needed here
    from trace_gym.samplers.base import SampleBatch


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


def _calibration_inputs(
    predictions: ArrayLike, targets: ArrayLike, weights: ArrayLike | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Predictions, targets and weights as equal-length 1-D float64 arrays (weights default to 1)."""
    p = np.asarray(predictions, dtype=np.float64).reshape(-1)
    y = np.asarray(targets, dtype=np.float64).reshape(-1)
    w = np.ones_like(p) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    if not p.shape == y.shape == w.shape:
        raise ConfigError(
            f"predictions, targets and weights must have one value per example; got lengths "
            f"{p.size}, {y.size} and {w.size}."
        )
    if np.any(w < 0) or np.isnan(w).any():
        raise ConfigError("weights must be >= 0 (leaf counts); got a negative or NaN weight.")
    return p, y, w


def brier_score(predictions: ArrayLike, targets: ArrayLike, weights: ArrayLike | None = None) -> float:
    """Weighted mean squared error Σ w_i (p_i − y_i)² / Σ w_i (Brier 1950).

    Targets may be soft (a subtree's mean reward). NaN when there are no examples or
    all weights are 0.

    >>> brier_score([0.8, 0.4], [1.0, 0.0])
    0.1
    """
    p, y, w = _calibration_inputs(predictions, targets, weights)
    total = w.sum()
    return float(np.dot(w, (p - y) ** 2) / total) if total > 0 else float("nan")


def expected_calibration_error(
    predictions: ArrayLike, targets: ArrayLike, weights: ArrayLike | None = None, bins: int = 10
) -> float:
    """ECE = Σ_b (W_b / W) |ȳ_b − p̄_b| over equal-width bins of the predictions.

    Prediction p falls in bin min(⌊p·bins⌋, bins − 1); W_b is the bin's total weight,
    ȳ_b and p̄_b its weighted mean target and prediction (Naeini et al. 2015). Targets
    may be soft. NaN when there are no examples or all weights are 0.

    >>> expected_calibration_error([0.25, 0.25, 0.75, 0.75], [0.0, 1.0, 1.0, 1.0], bins=2)
    0.25
    """
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ConfigError(f"bins must be an int >= 1, got {bins!r}.")
    p, y, w = _calibration_inputs(predictions, targets, weights)
    outside = np.flatnonzero(~((p >= 0) & (p <= 1)))
    if outside.size:
        i = int(outside[0])
        raise ConfigError(f"ECE bins predictions in [0, 1]; prediction {i} is {float(p[i])!r}.")
    total = w.sum()
    if not total > 0:
        return float("nan")
    index = np.minimum((p * bins).astype(np.int64), bins - 1)
    gap = np.bincount(index, weights=w * (y - p), minlength=bins)  # W_b (ȳ_b − p̄_b)
    return float(np.abs(gap).sum() / total)


def prediction_calibration(batch: SampleBatch) -> dict[str, float]:
    """Brier score and ECE of a sampler's predictions against the realised subtree means.

    Each prediction that points at a node of the batch's trees (a prompt that got
    rollouts, or a prefix) is compared with V̂(node), the mean reward of the leaves
    under it at the end of the step, weighted by their count. Predictions for skipped
    prompts have nothing realised and are left out. NaN when nothing is comparable.
    """
    trees = {tree.task.id: tree for tree in batch.trees}
    stats = {task_id: tree.leaf_stats() for task_id, tree in trees.items()}
    predicted, realised, weights = [], [], []
    for p in batch.predictions:
        if p.node_id is None or p.task_id not in stats:
            continue
        count, _, total = stats[p.task_id]
        if count[p.node_id]:
            predicted.append(p.value)
            realised.append(total[p.node_id] / count[p.node_id])
            weights.append(count[p.node_id])
    if not predicted:
        return {"brier": math.nan, "ece": math.nan}
    return {
        "brier": brier_score(predicted, realised, weights),
        "ece": expected_calibration_error(predicted, realised, weights),
    }
