"""Training on rollout trees: `TreeGRPOTrainer` and `TreeGRPOConfig` (need the `train` extra)."""

from typing import TYPE_CHECKING

from trace_gym.trainers.rows import rows_to_dataset, turn_rows

if TYPE_CHECKING:
    from trace_gym.trainers.tree_grpo import TreeGRPOConfig, TreeGRPOTrainer

__all__ = ["TreeGRPOConfig", "TreeGRPOTrainer", "rows_to_dataset", "turn_rows"]


def __getattr__(name: str) -> object:
    # The trainer needs trl and torch; import it only when asked for, so the core stays light.
    if name in ("TreeGRPOConfig", "TreeGRPOTrainer"):
        from trace_gym.trainers import tree_grpo

        return getattr(tree_grpo, name)
    raise AttributeError(f"module 'trace_gym.trainers' has no attribute {name!r}")
