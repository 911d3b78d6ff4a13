"""OraclePredictor: the true success probabilities, where an env exposes them (the upper bound)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.metrics import brier_score, expected_calibration_error
from trace_gym.predictors.base import Anchor, check_probabilities, training_examples
from trace_gym.tree import RolloutTree
from trace_gym.types import Task


class OraclePredictor:
    """Reads the true v of each anchor from the env instead of estimating it.

    A task's value is `task.metadata[task_key]` (V_0); a node's is `node.info[info_key]`,
    the env's info after that turn (V_t; a root carries the reset info). SyntheticTree-v0
    exposes both, which makes this the upper bound an allocation can reach with a
    perfect predictor. It learns nothing.

    Args:
        task_key: The task metadata key holding V_0.
        info_key: The node info key holding V_t.
    """

    def __init__(self, task_key: str = "v0", info_key: str = "value") -> None:
        self.task_key = task_key
        self.info_key = info_key

    def predict(self, anchors: Sequence[Anchor]) -> np.ndarray:
        """The true success probability of each anchor."""
        return check_probabilities(
            np.array([self._value(a) for a in anchors], dtype=np.float64), "OraclePredictor.predict"
        )

    def _value(self, anchor: Anchor) -> float:
        if isinstance(anchor, Task):
            where, key, source = f"task {anchor.id!r}", self.task_key, anchor.metadata
        else:
            where, key, source = f"node {anchor.id}", self.info_key, anchor.info
        value = source.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            kind = "metadata" if isinstance(anchor, Task) else "info"
            raise ConfigError(
                f"OraclePredictor needs an env that exposes true success probabilities "
                f"(SyntheticTree-v0 does), but {where} has no number under {kind}[{key!r}] "
                f"(got {value!r}). Use BetaPredictor or FeaturePredictor for other envs."
            )
        return float(value)

    def fit(self, trees: Sequence[RolloutTree]) -> dict[str, float]:
        """Learn nothing; report the oracle's calibration against the trees' empirical targets.

        Returns:
            "examples" (roots and prefixes), "brier" and "ece" (leaf-count weighted).
        """
        examples = training_examples(trees)
        predictions = self.predict([e.anchor for e in examples])
        targets = np.array([e.target for e in examples], dtype=np.float64)
        weights = np.array([e.weight for e in examples], dtype=np.float64)
        return {
            "examples": float(len(examples)),
            "brier": brier_score(predictions, targets, weights),
            "ece": expected_calibration_error(predictions, targets, weights),
        }

    def state_dict(self) -> dict[str, Any]:
        """The keys it reads (it has no learned state)."""
        return {"task_key": self.task_key, "info_key": self.info_key}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the keys it reads."""
        self.task_key = str(state["task_key"])
        self.info_key = str(state["info_key"])
