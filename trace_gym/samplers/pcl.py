"""PCLSampler: a prompt curriculum that keeps the candidates predicted closest to τ."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trace_gym.budget import Budget, Ledger
from trace_gym.errors import ConfigError
from trace_gym.predictors.base import Predictor
from trace_gym.rollout import RolloutRunner
from trace_gym.samplers.base import (
    SampleBatch,
    Sampler,
    check_pool,
    fit_or_explain,
    group_count,
    predict_or_explain,
    root_predictions,
    run_roots,
)
from trace_gym.samplers.uniform import check_group_size
from trace_gym.types import Task


class PCLSampler(Sampler):
    """Prompt curriculum learning: keep the candidates predicted closest to τ.

    G rollouts for each of the k = M·(1 + N)/G candidates whose predicted success
    probability is closest to τ (ties: pool order). After sampling, the predictor is
    fitted on the step's trees. If it fails to predict, the step takes the pool's first
    k prompts (uniform) and records why.

    Args:
        predictor: Predicts each candidate's success probability.
        group_size: G, rollouts per prompt.
        tau: The target success probability τ (0.5 maximises 1 - v^G - (1 - v)^G).
        fit: Whether to fit the predictor on each step's trees.
    """

    name = "pcl"

    def __init__(self, predictor: Predictor, group_size: int = 8, tau: float = 0.5, fit: bool = True) -> None:
        check_group_size(group_size)
        if not 0 <= tau <= 1:
            raise ConfigError(f"tau must be a probability in [0, 1], got {tau}.")
        self.predictor = predictor
        self.group_size = group_size
        self.tau = tau
        self.fit = fit

    def sample(self, tasks: Sequence[Task], runner: RolloutRunner, budget: Budget) -> SampleBatch:
        """Predict every candidate, keep the k closest to τ, G rollouts each, then fit."""
        k = group_count(budget, budget.total, self.group_size, "PCLSampler")
        check_pool(tasks, k, "PCLSampler")
        values, fallback = predict_or_explain(self.predictor, tasks, "candidate prompts")
        if values is None:
            chosen = np.arange(k)
            values = np.full(len(tasks), np.nan)
        else:
            chosen = np.sort(np.argsort(np.abs(values - self.tau), kind="stable")[:k])
        ledger = Ledger()
        picked = [tasks[int(i)] for i in chosen]
        trees, roots = run_roots(runner, picked, [self.group_size] * k, ledger)
        batch = SampleBatch(trees, ledger, {"roots": roots}, fallback=fallback)
        if values is not None and fallback is None:
            batch.predictions = root_predictions(tasks, values, roots)
        if self.fit:
            batch.predictor_metrics, error = fit_or_explain(self.predictor, trees)
            batch.fallback = batch.fallback or error
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The predictor's state."""
        return {"predictor": self.predictor.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the predictor's state."""
        self.predictor.load_state_dict(state["predictor"])
