"""TreePOSampler: uniform roots, then continuations from prefixes chosen uniformly at random."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trace_gym.budget import Budget, Ledger
from trace_gym.errors import BudgetError
from trace_gym.rollout import RolloutRunner
from trace_gym.samplers.base import (
    SampleBatch,
    Sampler,
    check_pool,
    group_count,
    random_prefix_counts,
    run_continuations,
    run_roots,
)
from trace_gym.samplers.uniform import check_group_size
from trace_gym.types import Task


class TreePOSampler(Sampler):
    """Tree rollouts with random branching, on the same prompts as GRPO.

    The first k = M·(1 + N)/G candidates (GRPO's prompts) each get G leaves: M/k bare
    rollouts, then M·N/k continuations from visited prefixes (turns that are neither the
    root nor a leaf) chosen uniformly at random. Same prompts and leaves per prompt as
    uniform; only the tree shape differs.

    Args:
        group_size: G, leaves per prompt.
        seed: Seeds the choice of prefixes.
    """

    name = "treepo"

    def __init__(self, group_size: int = 8, seed: int = 0) -> None:
        check_group_size(group_size)
        self.group_size = group_size
        self.rng = np.random.default_rng(seed)

    def sample(self, tasks: Sequence[Task], runner: RolloutRunner, budget: Budget) -> SampleBatch:
        """Uniform roots, then M·N continuations from random prefixes."""
        k = group_count(budget, budget.total, self.group_size, "TreePOSampler")
        check_pool(tasks, k, "TreePOSampler")
        if budget.roots % k:
            raise BudgetError(
                f"TreePOSampler gives each of its {k} prompts M/k root rollouts, but M="
                f"{budget.roots} is not a multiple of {k}; pick N so that (1+N) divides "
                f"group_size ({self.group_size}) or change M."
            )
        ledger = Ledger()
        trees, roots = run_roots(runner, tasks[:k], [budget.roots // k] * k, ledger)
        per_tree = [budget.continuations // k] * len(trees)
        prefixes = run_continuations(runner, random_prefix_counts(trees, per_tree, self.rng), ledger)
        return SampleBatch(trees, ledger, {"roots": roots, "prefixes": prefixes})

    def state_dict(self) -> dict[str, Any]:
        """The prefix-choice RNG's state."""
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the RNG's state."""
        self.rng.bit_generator.state = state["rng"]
