"""UniformSampler: GRPO's allocation, G rollouts for each of M·(1 + N)/G prompts."""

from __future__ import annotations

from collections.abc import Sequence

from trace_gym.budget import Budget, Ledger
from trace_gym.errors import BudgetError, ConfigError
from trace_gym.rollout import Job, RolloutRunner
from trace_gym.samplers.base import SampleBatch, Sampler
from trace_gym.types import Task


class UniformSampler(Sampler):
    """GRPO: the first M·(1 + N)/G candidates get G root rollouts each.

    The candidate pool is already a random draw, so taking its first prompts is a
    uniform choice. All rollouts are counted under the ledger stage "root".

    Args:
        group_size: G, rollouts per prompt.
    """

    name = "uniform"

    def __init__(self, group_size: int = 8) -> None:
        if group_size < 2:
            raise ConfigError(f"group_size must be >= 2 (a group of one has no contrast), got {group_size}.")
        self.group_size = group_size

    def prompts_per_step(self, budget: Budget) -> int:
        """M·(1 + N)/G, checked to be a whole number."""
        if budget.total % self.group_size:
            raise BudgetError(
                f"UniformSampler spends M·(1+N) = {budget.total} rollouts in groups of "
                f"{self.group_size}, which does not divide it. Pick roots and "
                "continuations_per_root so that M·(1+N) is a multiple of group_size."
            )
        return budget.total // self.group_size

    def sample(self, tasks: Sequence[Task], runner: RolloutRunner, budget: Budget) -> SampleBatch:
        """G rollouts for each of the first M·(1 + N)/G tasks."""
        k = self.prompts_per_step(budget)
        if k > len(tasks):
            raise BudgetError(
                f"UniformSampler needs {k} prompts (M·(1+N)/G = {budget.total}/{self.group_size}) "
                f"but the pool has {len(tasks)}. Raise candidates or lower the budget."
            )
        ledger = Ledger()
        chosen = list(tasks[:k])
        trees = runner.run([Job(task, self.group_size, stage="root") for task in chosen], ledger)
        return SampleBatch(trees, ledger, {"roots": {t.id: self.group_size for t in chosen}})
