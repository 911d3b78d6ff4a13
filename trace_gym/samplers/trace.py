"""TraceSampler: TRACE's two-stage rollout allocation (Zou et al., arXiv 2606.11119)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from trace_gym.allocation import allocate_prefixes, allocate_roots
from trace_gym.budget import Budget, Ledger
from trace_gym.errors import ConfigError
from trace_gym.predictors.base import Predictor
from trace_gym.rollout import RolloutRunner
from trace_gym.samplers.base import (
    SampleBatch,
    Sampler,
    branch_points,
    check_pool,
    fit_or_explain,
    observed_reward,
    predict_or_explain,
    prefix_predictions,
    random_prefix_counts,
    root_predictions,
    run_continuations,
    run_roots,
)
from trace_gym.tree import Node, RolloutTree
from trace_gym.types import Task

Scope = Literal["per_prompt", "global"]


class TraceSampler(Sampler):
    """Spend rollouts where a predictor says both success and failure are likely.

    One step (the paper's algorithm):

    1. Predict each candidate's success probability v_i.
    2. Stage 1: m = allocate_roots(v, M, Mmax, min_group), maximising
       Σ_i 1 - v_i^m_i - (1 - v_i)^m_i; run m_i bare rollouts of each prompt.
    3. Collect every visited prefix H_ijt (turns that are neither the root nor a leaf)
       and the reward r_ij of the rollout it lies on; predict each prefix's v.
    4. Stage 2: K = allocate_prefixes(v, r, budget), maximising
       Σ 1 - [r v + (1 - r)(1 - v)]^K, with budget m_i·N per prompt
       (`scope="per_prompt"`, the paper) or M·N pooled across prompts
       (`scope="global"`); run K continuations from each prefix.
    5. Fit the predictor on the trees (targets: subtree success rates).

    A prompt whose rollouts left no prefix passes its Stage 2 share to the pool of all
    prefixes; when no rollout of the step left one, the prompts' roots are the prefixes
    (continuations from a root are further rollouts of that prompt). If the predictor
    raises, that stage falls back to uniform choices (equal values in Stage 1, random
    prefixes in Stage 2) and the batch records why.

    Args:
        predictor: Predicts success probabilities of prompts and prefixes.
        scope: "per_prompt" or "global" Stage 2 budgets.
        fit: Whether to fit the predictor on each step's trees.
        name: The sampler's name in comparisons (e.g. "trace_oracle").
        seed: Seeds the random prefixes of a fallback.
    """

    def __init__(
        self,
        predictor: Predictor,
        scope: Scope = "per_prompt",
        fit: bool = True,
        name: str = "trace",
        seed: int = 0,
    ) -> None:
        if scope not in ("per_prompt", "global"):
            raise ConfigError(f"scope must be 'per_prompt' or 'global', got {scope!r}.")
        self.predictor = predictor
        self.scope = scope
        self.fit = fit
        self.name = name
        self.rng = np.random.default_rng(seed)

    def sample(self, tasks: Sequence[Task], runner: RolloutRunner, budget: Budget) -> SampleBatch:
        """Stage 1 on predicted root values, Stage 2 on predicted prefix values, then fit."""
        check_pool(tasks, 1, "TraceSampler")
        ledger = Ledger()
        v, fallback = predict_or_explain(self.predictor, tasks, "candidate prompts")
        m = allocate_roots(
            v if v is not None else np.full(len(tasks), 0.5),
            budget.roots,
            budget.max_per_prompt,
            budget.min_group,
        )
        trees, roots = run_roots(runner, tasks, [int(x) for x in m], ledger)
        batch = SampleBatch(trees, ledger, {"roots": roots}, fallback=fallback)
        if v is not None:
            batch.predictions = root_predictions(tasks, v, roots)
        counts, why = self._stage2(trees, [int(x) for x in m if x > 0], budget, batch)
        batch.fallback = batch.fallback or why
        batch.allocations["prefixes"] = run_continuations(runner, counts, ledger)
        if self.fit:
            batch.predictor_metrics, error = fit_or_explain(self.predictor, trees)
            batch.fallback = batch.fallback or error
        return batch

    def _stage2(
        self, trees: list[RolloutTree], m: list[int], budget: Budget, batch: SampleBatch
    ) -> tuple[dict[Node, int], str | None]:
        """Continuation counts per prefix, or random ones (and why) if prediction fails."""
        n = budget.continuations_per_root
        shares = [mi * n for mi in m]
        if not sum(shares):
            return {}, None
        pools = branch_points(trees)
        prefixes = [node for pool in pools for node in pool]
        v, why = predict_or_explain(self.predictor, prefixes, "visited prefixes")
        if v is None:
            return random_prefix_counts(trees, shares, self.rng), why
        batch.predictions.extend(prefix_predictions(prefixes, v))
        r = np.array([observed_reward(node) for node in prefixes])
        if self.scope == "global":
            return _allocate(prefixes, v, r, sum(shares)), None
        counts: dict[Node, int] = {}
        start, leftover = 0, 0
        for pool, share in zip(pools, shares, strict=True):
            end = start + len(pool)
            if pool:
                counts.update(_allocate(pool, v[start:end], r[start:end], share))
            else:
                leftover += share
            start = end
        for node, k in _allocate(prefixes, v, r, leftover).items():
            counts[node] = counts.get(node, 0) + k
        return counts, None

    def state_dict(self) -> dict[str, Any]:
        """The predictor's state and the fallback RNG's."""
        return {"predictor": self.predictor.state_dict(), "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore both."""
        self.predictor.load_state_dict(state["predictor"])
        self.rng.bit_generator.state = state["rng"]


def _allocate(prefixes: Sequence[Node], v: np.ndarray, r: np.ndarray, budget: int) -> dict[Node, int]:
    if budget == 0:
        return {}
    k = allocate_prefixes(v, r, budget)
    return {node: int(c) for node, c in zip(prefixes, k, strict=True) if c > 0}
