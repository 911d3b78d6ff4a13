"""What a sampling step may spend (`Budget`) and what it spent (`Ledger`), DESIGN section 6."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from trace_gym.errors import BudgetError
from trace_gym.tree import Node, RolloutTree


@dataclass(frozen=True)
class Budget:
    """The rollout budget of one sampling step; every sampler spends exactly M·(1 + N).

    Attributes:
        roots: M, bare rollouts from task roots per step (Stage 1).
        continuations_per_root: N, continuations per root rollout (Stage 2 spends M·N).
        max_per_prompt: Mmax, the most root rollouts one prompt may get.
        candidates: Prompts in the candidate pool each step.
        min_group: The fewest root rollouts an active prompt gets (a group of one has no
            contrast).
    """

    roots: int
    continuations_per_root: int
    max_per_prompt: int
    candidates: int
    min_group: int = 2

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise BudgetError(f"Budget.{f.name} must be an int, got {value!r}.")
        m, n, m_max = self.roots, self.continuations_per_root, self.max_per_prompt
        pool, g = self.candidates, self.min_group
        if g < 1:
            raise BudgetError(f"min_group must be >= 1, got {g}.")
        if n < 0:
            raise BudgetError(f"continuations_per_root (N) must be >= 0, got {n}.")
        if pool < 1:
            raise BudgetError(f"candidates must be >= 1, got {pool}.")
        if m_max < g:
            raise BudgetError(
                f"max_per_prompt (Mmax={m_max}) must be >= min_group ({g}); raise max_per_prompt."
            )
        if m < g:
            raise BudgetError(f"roots (M={m}) must be >= min_group ({g}): one group at least.")
        if m > pool * m_max:
            raise BudgetError(
                f"roots (M={m}) cannot be spent on {pool} candidates with at most {m_max} "
                f"rollouts each (at most {pool * m_max}). Lower roots, or raise candidates or "
                "max_per_prompt."
            )
        if not any(k * g <= m <= k * m_max for k in range(1, pool + 1)):
            raise BudgetError(
                f"roots (M={m}) is not a sum of group sizes in [{g}, {m_max}] over at most "
                f"{pool} prompts; pick M between k·{g} and k·{m_max} for some k <= {pool}."
            )

    @property
    def continuations(self) -> int:
        """M·N, the Stage 2 budget."""
        return self.roots * self.continuations_per_root

    @property
    def total(self) -> int:
        """M·(1 + N), the rollouts every sampler spends per step."""
        return self.roots * (1 + self.continuations_per_root)


@dataclass
class StageCost:
    """What one stage spent."""

    rollouts: int = 0
    """Trajectories completed (leaves), failed ones included."""
    turns: int = 0
    """Assistant turns generated (nodes), failed ones included."""
    prompt_tokens: int = 0
    """Tokens of history the turns conditioned on, summed over turns (no cache discount)."""
    generated_tokens: int = 0
    """Tokens the policy generated."""
    tool_calls: int = 0
    """Tool calls the envs executed."""
    failures: int = 0
    """Rollouts that ended in a failure (generation, env step or tool)."""
    wall_time: float = 0.0
    """Seconds spent, measured around the stage's runner calls."""

    def add(self, other: StageCost) -> None:
        """Add `other`'s counts to this one."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def counts(self) -> dict[str, int]:
        """Everything but wall time (the part recomputable from trees)."""
        return {k: v for k, v in asdict(self).items() if k != "wall_time"}


class Ledger:
    """Costs per stage (e.g. "root", "continuation"), kept by the runner as it goes."""

    def __init__(self) -> None:
        self.stages: dict[str, StageCost] = {}

    def stage(self, name: str) -> StageCost:
        """The (mutable) cost record of stage `name`, created on first use."""
        if name not in self.stages:
            self.stages[name] = StageCost()
        return self.stages[name]

    def total(self) -> StageCost:
        """All stages added up."""
        out = StageCost()
        for cost in self.stages.values():
            out.add(cost)
        return out

    def merge(self, other: Ledger) -> None:
        """Add another ledger's stages into this one."""
        for name, cost in other.stages.items():
            self.stage(name).add(cost)

    def counts(self) -> dict[str, dict[str, int]]:
        """Per stage, every count but wall time."""
        return {name: cost.counts() for name, cost in sorted(self.stages.items())}

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """A JSON-serialisable form."""
        return {name: asdict(cost) for name, cost in sorted(self.stages.items())}

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, Any]]) -> Ledger:
        """Rebuild a ledger from `to_dict` output."""
        ledger = cls()
        for name, cost in data.items():
            ledger.stages[name] = StageCost(**cost)
        return ledger

    @classmethod
    def from_trees(cls, trees: Iterable[RolloutTree]) -> Ledger:
        """Recount a ledger (wall time excluded) from the trees' nodes."""
        ledger = cls()
        for tree in trees:
            for node in tree.nodes:
                ledger.count(node)
        return ledger

    def count(self, node: Node) -> None:
        """Add one node's cost under its stage.

        A node is a turn (except the root, which is the prompt) and, where a trajectory
        ends, a rollout (a root ends one only when its reset failed).
        """
        if node.parent is None and not node.done:
            return
        cost = self.stage(node.stage)
        if node.parent is not None:
            cost.turns += 1
            cost.prompt_tokens += node.prompt_tokens
            cost.generated_tokens += node.completion_tokens
            cost.tool_calls += node.tool_calls
        if node.done:
            cost.rollouts += 1
            cost.failures += node.failed

    def __repr__(self) -> str:
        return f"Ledger({self.to_dict()})"
