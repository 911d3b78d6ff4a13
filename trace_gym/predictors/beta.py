"""BetaPredictor: a per-task Beta posterior over the root success probability."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.metrics import brier_score, expected_calibration_error
from trace_gym.predictors.base import Anchor, anchor_task, check_probabilities
from trace_gym.tree import RolloutTree


class BetaPredictor:
    """v_i = E[Beta(a + s_i, b + f_i)] = (a + s_i) / (a + b + s_i + f_i), per task.

    s_i and f_i count the successful and failed root-level leaves of task i: the bare
    rollouts, whose stage is the root's. Continuations are left out because a sampler
    chose their prefixes, which biases their outcomes. Each `fit` is one step: every
    task's counts are first multiplied by `decay` (forgetting an older policy), then
    the step's outcomes are added. A prefix inherits its task's value, and a task never
    seen gets the prior mean a / (a + b). It cannot generalise across tasks.

    Args:
        prior_a: a, the prior's pseudo-successes (> 0).
        prior_b: b, the prior's pseudo-failures (> 0).
        decay: Factor in (0, 1] applied to old counts at each `fit` (1 keeps them all).
    """

    def __init__(self, prior_a: float = 1.0, prior_b: float = 1.0, decay: float = 1.0) -> None:
        if not (prior_a > 0 and prior_b > 0):
            raise ConfigError(f"prior_a and prior_b must be > 0, got {prior_a} and {prior_b}.")
        if not 0 < decay <= 1:
            raise ConfigError(f"decay must be in (0, 1], got {decay}; use 1 to never forget.")
        self.prior_a = float(prior_a)
        self.prior_b = float(prior_b)
        self.decay = float(decay)
        self.successes: dict[str, float] = {}
        self.failures: dict[str, float] = {}

    def posterior(self, task_id: str) -> tuple[float, float]:
        """The Beta parameters (a + s_i, b + f_i) of a task."""
        return (
            self.prior_a + self.successes.get(task_id, 0.0),
            self.prior_b + self.failures.get(task_id, 0.0),
        )

    def predict(self, anchors: Sequence[Anchor]) -> np.ndarray:
        """The posterior mean of each anchor's task."""
        out = np.empty(len(anchors), dtype=np.float64)
        for i, anchor in enumerate(anchors):
            a, b = self.posterior(anchor_task(anchor).id)
            out[i] = a / (a + b)
        return check_probabilities(out, "BetaPredictor.predict")

    def fit(self, trees: Sequence[RolloutTree]) -> dict[str, float]:
        """Decay old counts, then add each tree's root-level outcomes.

        Returns:
            "examples" (root-level leaves added), and "brier" and "ece" of the predictions
            made before this update against the trees' root success rates, weighted by
            their leaf counts.
        """
        outcomes = [(tree.task.id, _root_level_outcomes(tree)) for tree in trees]
        before = self.predict([tree.task for tree in trees])
        rates = np.array([np.mean(o) if o else np.nan for _, o in outcomes])
        counts = np.array([len(o) for _, o in outcomes], dtype=np.float64)
        seen = counts > 0
        if self.decay < 1:
            for table in (self.successes, self.failures):
                for key in table:
                    table[key] *= self.decay
        for task_id, results in outcomes:
            wins = float(sum(results))
            self.successes[task_id] = self.successes.get(task_id, 0.0) + wins
            self.failures[task_id] = self.failures.get(task_id, 0.0) + len(results) - wins
        return {
            "examples": float(counts.sum()),
            "brier": brier_score(before[seen], rates[seen], counts[seen]),
            "ece": expected_calibration_error(before[seen], rates[seen], counts[seen]),
        }

    def state_dict(self) -> dict[str, Any]:
        """The prior, decay and per-task counts (task ids as a list, counts as arrays)."""
        ids = sorted(self.successes)
        return {
            "prior_a": self.prior_a,
            "prior_b": self.prior_b,
            "decay": self.decay,
            "task_ids": ids,
            "successes": np.array([self.successes[i] for i in ids], dtype=np.float64),
            "failures": np.array([self.failures[i] for i in ids], dtype=np.float64),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the prior, decay and counts `state_dict` returned."""
        ids = [str(i) for i in state["task_ids"]]
        wins = np.asarray(state["successes"], dtype=np.float64)
        losses = np.asarray(state["failures"], dtype=np.float64)
        if not len(ids) == wins.size == losses.size:
            raise ConfigError(
                f"BetaPredictor state has {len(ids)} task ids but {wins.size} success and "
                f"{losses.size} failure counts; pass a dict from BetaPredictor.state_dict()."
            )
        self.prior_a = float(state["prior_a"])
        self.prior_b = float(state["prior_b"])
        self.decay = float(state["decay"])
        self.successes = dict(zip(ids, wins.tolist(), strict=True))
        self.failures = dict(zip(ids, losses.tolist(), strict=True))


def _root_level_outcomes(tree: RolloutTree) -> list[bool]:
    """`leaf.success` of each bare rollout: leaves generated in the root's stage."""
    stage = tree.root.stage
    return [leaf.success for leaf in tree.leaves() if leaf.stage == stage]
