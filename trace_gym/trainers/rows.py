"""Rollout trees to training rows: one row per generated turn (DESIGN section 10).

A row is what a GRPO loss needs for one turn: the token ids the policy conditioned on
(the chat-templated history before the turn, observations included) as the prompt, the
token ids it generated as the completion, and one advantage. Observation tokens only
ever appear inside prompts, so no loss falls on them; a turn shared by several leaves
is one node, so it is one row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from trace_gym.errors import ConfigError, MissingDependencyError
from trace_gym.tree import RolloutTree, trees_to_rows

if TYPE_CHECKING:
    from datasets import Dataset  # type: ignore[import-untyped]

__all__ = ["rows_to_dataset", "turn_rows"]


def turn_rows(trees: Sequence[RolloutTree], advantages: Sequence[np.ndarray]) -> list[dict[str, Any]]:
    """`trees_to_rows` plus each turn's `advantage` and `finish_reason`, token ids required.

    Args:
        trees: The step's trees.
        advantages: Per tree, one advantage per node id (what a `TreeEstimator` returns).

    Returns:
        One row per generated turn (failed generations have no tokens and give no row), in
        tree order then node id order. `prompt_token_ids` are the ids the policy recorded
        for the turn's prompt (its chat-templated history), `completion_token_ids` the ids
        it generated, never a re-tokenisation of the text.

    Raises:
        ConfigError: a turn has no token ids (the policy does not report them; use
            `HFPolicy`, `VLLMPolicy` or a backend that returns token ids), or an advantage
            array does not match its tree.
    """
    if len(advantages) != len(trees):
        raise ConfigError(
            f"Got {len(advantages)} advantage arrays for {len(trees)} trees; give one per tree."
        )
    rows = []
    for tree, adv in zip(trees, advantages, strict=True):
        if np.shape(adv) != (len(tree.nodes),):
            raise ConfigError(
                f"The advantages of tree {tree.task.id!r} have shape {np.shape(adv)}; expected one per node "
                f"({len(tree.nodes)},)."
            )
        for row in trees_to_rows([tree]):
            node = tree.nodes[row["node_id"]]
            if not row["completion_token_ids"] or row["prompt_token_ids"] is None:
                raise ConfigError(
                    f"Turn {node.id} of task {tree.task.id!r} has no token ids: the policy did not report "
                    "them, so the turn cannot be trained on exactly as sampled. Generate with HFPolicy or "
                    "VLLMPolicy (or a backend that returns prompt and completion token ids)."
                )
            value = float(adv[node.id])
            row["advantage"] = value if np.isfinite(value) else 0.0
            row["finish_reason"] = node.finish_reason
            rows.append(row)
    return rows


def rows_to_dataset(rows: Sequence[dict[str, Any]]) -> Dataset:
    """The rows as a `datasets.Dataset` (token ids as int lists, logprobs as float lists)."""
    try:
        from datasets import Dataset
    except ImportError:
        raise MissingDependencyError("datasets", "train", "Exporting training rows") from None
    columns: dict[str, list[Any]] = {key: [] for key in rows[0]} if rows else {}
    for row in rows:
        for key in columns:
            value = row[key]
            columns[key].append(list(value) if isinstance(value, tuple) else value)
    return Dataset.from_dict(columns)
