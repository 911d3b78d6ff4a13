"""The `Sampler` interface: how a sampling step spends its rollout budget (DESIGN section 8)."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trace_gym.budget import Budget, Ledger
from trace_gym.rollout import RolloutRunner
from trace_gym.tree import RolloutTree
from trace_gym.types import Task


@dataclass
class SampleBatch:
    """What one sampling step produced.

    Attributes:
        trees: One rollout tree per sampled prompt.
        ledger: What the step spent, by stage.
        allocations: The sampler's decisions, e.g. {"roots": {task_id: m_i}}.
        predictions: Predicted success probabilities the decisions used, by anchor key.
    """

    trees: list[RolloutTree]
    ledger: Ledger
    allocations: dict[str, Any] = field(default_factory=dict)
    predictions: dict[str, float] = field(default_factory=dict)


class Sampler(abc.ABC):
    """Decides where a step's M·(1 + N) rollouts go, from a pool of candidate prompts."""

    name: str = "sampler"

    @abc.abstractmethod
    def sample(self, tasks: Sequence[Task], runner: RolloutRunner, budget: Budget) -> SampleBatch:
        """Spend exactly `budget.total` rollouts on `tasks` and return the trees."""

    def state_dict(self) -> dict[str, Any]:
        """The sampler's learned state, for checkpoints (empty when it learns nothing)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 (optional hook)
        """Restore what `state_dict` returned (nothing to restore by default)."""
