"""UniformSampler: GRPO's allocation, G rollouts for each of M·(1 + N)/G prompts."""

from __future__ import annotations

from collections.abc import Sequence

from trace_gym.budget import Budget, Ledger
from trace_gym.errors import ConfigError
from trace_gym.rollout import RolloutRunner
from trace_gym.samplers.base import SampleBatch, Sampler, check_pool, group_count, run_roots
from trace_gym.types import Task


def check_group_size(group_size: int) -> None:
    """A group of one has no contrast."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
        raise ConfigError(
            f"group_size must be an int >= 2 (a group of one has no contrast), got {group_size!r}."
        )


class UniformSampler(Sampler):
    """GRPO: the first M·(1 + N)/G candidates get G root rollouts each.

    The candidate pool is already a random draw, so taking its first prompts is a
    uniform choice. All rollouts are counted under the ledger stage "root".

    Args:
        group_size: G, rollouts per prompt.
    """

    name = "uniform"

    def __init__(self, group_size: int = 8) -> None:
        check_group_size(group_size)
        self.group_size = group_size

    def prompts_per_step(self, budget: Budget) -> int:
        """M·(1 + N)/G, checked to be a whole number."""
        return group_count(budget, budget.total, self.group_size, "UniformSampler")

    def sample(self, tasks: Sequence[Task], runner: RolloutRunner, budget: Budget) -> SampleBatch:
        """G rollouts for each of the first M·(1 + N)/G tasks."""
        k = self.prompts_per_step(budget)
        check_pool(tasks, k, "UniformSampler")
        ledger = Ledger()
        trees, roots = run_roots(runner, tasks[:k], [self.group_size] * k, ledger)
        return SampleBatch(trees, ledger, {"roots": roots})
