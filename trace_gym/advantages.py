"""Advantages on rollout trees: flat GRPO, Tree-GRPO and TreeRPO (DESIGN section 10).

Pure functions. Conventions shared by every estimator:

- The normalisation of one group of rewards r_1..r_G is GRPO's (Shao et al., DeepSeekMath,
  arXiv 2402.03300, section 4.1.2), written as TRL computes it:

      Â_i = (r_i - mean(r)) / (std(r) + ε),   std with Bessel's correction, ε = 1e-4,

  or Â_i = r_i - mean(r) when `scale=False` (Dr. GRPO, arXiv 2503.20783).
- A group of one has no contrast: its advantage is 0, not its raw reward.
- A NaN reward (an unscorable rollout) is left out of its group's mean and std and gets
  advantage 0, as TRL does for completions no reward function could score. No NaN or
  infinity ever comes out.
- On trees, a leaf's reward is its `node.reward` (terminal rewards, DESIGN section 4); the
  per-node arrays are indexed by node id, and the root (the prompt, not a turn) gets 0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike

from trace_gym.errors import ConfigError
from trace_gym.tree import RolloutTree

EPS = 1e-4
"""ε of the GRPO normalisation (TRL's value)."""


class TreeEstimator(Protocol):
    """Per tree, one advantage per node id (0 at the root)."""

    def __call__(
        self, trees: Sequence[RolloutTree], *, scale: bool = True, eps: float = EPS
    ) -> list[np.ndarray]:
        """Advantages of every node of every tree (see the module docstring)."""


__all__ = [
    "EPS",
    "ESTIMATORS",
    "TreeEstimator",
    "group_advantages",
    "grpo_advantages",
    "grpo_tree_advantages",
    "tree_grpo_advantages",
    "treerpo_advantages",
]


def group_advantages(rewards: ArrayLike, *, scale: bool = True, eps: float = EPS) -> np.ndarray:
    """GRPO's normalisation of one group: Â_i = (r_i - mean r) / (std r + ε).

    Args:
        rewards: The group's rewards, shape (G,); NaN marks an unscorable member.
        scale: Divide by std + ε (GRPO); False keeps r_i - mean r (Dr. GRPO).
        eps: ε.

    Returns:
        Shape (G,), finite; zeros for a group with fewer than two scorable members.

    >>> group_advantages([1.0, 0.0]).round(3).tolist()
    [0.707, -0.707]
    >>> group_advantages([1.0]).tolist()
    [0.0]
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ConfigError(f"group_advantages takes a 1-D array of rewards, got shape {r.shape}.")
    out = np.zeros_like(r)
    ok = np.isfinite(r)
    n = int(ok.sum())
    if n < 2 or np.ptp(r[ok]) == 0:  # no contrast (and no rounding noise from the mean)
        return out
    centred = r[ok] - r[ok].mean()
    if scale:
        centred = centred / (np.sqrt((centred**2).sum() / (n - 1)) + eps)
    out[ok] = centred
    return out


def grpo_advantages(
    rewards: ArrayLike, groups: ArrayLike | None = None, *, scale: bool = True, eps: float = EPS
) -> np.ndarray:
    """Flat GRPO: each reward normalised within its group (`group_advantages`).

    Args:
        rewards: Shape (B,).
        groups: Shape (B,), any hashable labels (e.g. task ids); None puts all in one group.
        scale: See `group_advantages`.
        eps: See `group_advantages`.

    >>> grpo_advantages([1.0, 0.0, 1.0, 1.0], ["a", "a", "b", "b"]).round(3).tolist()
    [0.707, -0.707, 0.0, 0.0]
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ConfigError(f"grpo_advantages takes a 1-D array of rewards, got shape {r.shape}.")
    labels = [0] * len(r) if groups is None else list(np.asarray(groups, dtype=object))
    if len(labels) != len(r):
        raise ConfigError(f"groups has {len(labels)} labels for {len(r)} rewards; give one label per reward.")
    members: dict[object, list[int]] = defaultdict(list)
    for i, label in enumerate(labels):
        members[label].append(i)
    out = np.zeros_like(r)
    for index in members.values():
        out[index] = group_advantages(r[index], scale=scale, eps=eps)
    return out


def _leaf_rewards(tree: RolloutTree) -> tuple[np.ndarray, np.ndarray]:
    """The tree's leaf ids and their rewards, in id order."""
    leaves = list(tree.leaves())
    return np.array([n.id for n in leaves], dtype=np.int64), np.array([n.reward for n in leaves], dtype=float)


def _spread_to_turns(tree: RolloutTree, leaf_ids: np.ndarray, leaf_adv: np.ndarray) -> np.ndarray:
    """Per node: the mean advantage of the leaves below it (0 at the root)."""
    total = np.zeros(len(tree.nodes))
    count = np.zeros(len(tree.nodes))
    total[leaf_ids] = leaf_adv
    count[leaf_ids] = 1.0
    for node in reversed(tree.nodes):
        if node.parent is not None:
            total[node.parent.id] += total[node.id]
            count[node.parent.id] += count[node.id]
    out = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
    out[0] = 0.0
    return out


def grpo_tree_advantages(
    trees: Sequence[RolloutTree], *, scale: bool = True, eps: float = EPS
) -> list[np.ndarray]:
    """Trajectory-level GRPO on trees: each leaf normalised over all leaves of its prompt.

    A leaf's advantage is `group_advantages` over every leaf of the same task (across
    the given trees); a turn shared by several trajectories gets the mean advantage of
    the leaves below it (GRPO trains each trajectory's tokens with its advantage; a
    shared turn, trained once, takes their mean).

    Returns:
        Per tree, shape (len(tree.nodes),), indexed by node id.
    """
    by_task: dict[str, list[int]] = defaultdict(list)
    for t, tree in enumerate(trees):
        by_task[tree.task.id].append(t)
    out: list[np.ndarray] = [np.zeros(len(tree.nodes)) for tree in trees]
    for members in by_task.values():
        parts = [_leaf_rewards(trees[t]) for t in members]
        adv = group_advantages(np.concatenate([r for _, r in parts]), scale=scale, eps=eps)
        start = 0
        for t, (ids, r) in zip(members, parts, strict=True):
            out[t] = _spread_to_turns(trees[t], ids, adv[start : start + len(r)])
            start += len(r)
    return out


def _branch_node(tree: RolloutTree, leaf_id: int, count: np.ndarray) -> int | None:
    """The leaf's nearest ancestor below the root with two or more leaves under it, if any."""
    node = tree.nodes[leaf_id].parent
    while node is not None and node.parent is not None:
        if count[node.id] >= 2:
            return node.id
        node = node.parent
    return None


def tree_grpo_advantages(
    trees: Sequence[RolloutTree], *, scale: bool = True, eps: float = EPS
) -> list[np.ndarray]:
    """Tree-GRPO (Ji et al., "Tree Search for LLM Agent Reinforcement Learning", arXiv 2509.21240).

    For a leaf (trajectory) i of prompt x with reward r_i, the advantage is the sum of an
    inter-tree and an intra-tree term (the paper's Â = Â_global + Â_local):

        Â_i = (r_i - mean R_x) / (std R_x + ε)  +  (r_i - mean R_b(i)) / (std R_b(i) + ε)

    where R_x holds the rewards of every leaf of prompt x (across all given trees of x)
    and R_b(i) those of the leaves below b(i), the leaf's branching node: its nearest
    ancestor below the root with at least two leaves under it. When the only branch
    point above a leaf is the root, R_b(i) would be R_x again, so the intra-tree term is
    0 (the inter-tree term already compares the leaf with them); this choice makes a
    depth-1 tree (every leaf a child of the root) give exactly GRPO.

    Per-turn advantage (the choice documented here): an internal turn shared by several
    trajectories gets the mean of the advantages of the leaves below it. Training each
    trajectory with its leaf advantage applies the sum of those to the shared tokens;
    the trainer trains each shared turn once, so the mean keeps the advantage on the
    scale of one trajectory. A leaf's own turn gets the leaf's advantage.

    Returns:
        Per tree, shape (len(tree.nodes),), indexed by node id.
    """
    out = []
    for tree in trees:
        ids, rewards = _leaf_rewards(tree)
        count, _, _ = tree.leaf_stats()
        inter = _prompt_term(trees, tree, scale=scale, eps=eps)
        intra = np.zeros(len(ids))
        below: dict[int, list[int]] = defaultdict(list)
        for k, leaf in enumerate(ids):
            b = _branch_node(tree, int(leaf), count)
            if b is not None:
                below[b].append(k)
        position = {int(leaf): k for k, leaf in enumerate(ids)}
        for b, members in below.items():
            group = [position[leaf.id] for leaf in tree.leaves(tree.nodes[b])]  # every leaf below b
            adv = dict(zip(group, group_advantages(rewards[group], scale=scale, eps=eps), strict=True))
            intra[members] = [adv[k] for k in members]
        out.append(_spread_to_turns(tree, ids, inter + intra))
    return out


def _prompt_term(trees: Sequence[RolloutTree], tree: RolloutTree, *, scale: bool, eps: float) -> np.ndarray:
    """`tree`'s leaves normalised with every leaf of the trees of the same task."""
    same = [t for t in trees if t.task.id == tree.task.id]
    rewards = [_leaf_rewards(t)[1] for t in same]
    adv = group_advantages(np.concatenate(rewards), scale=scale, eps=eps)
    start = 0
    for t, r in zip(same, rewards, strict=True):
        if t is tree:
            return adv[start : start + len(r)]
        start += len(r)
    raise AssertionError("unreachable: tree is one of trees")


def treerpo_advantages(
    trees: Sequence[RolloutTree], *, scale: bool = True, eps: float = EPS
) -> list[np.ndarray]:
    """TreeRPO (Yang et al., "TreeRPO: Tree Relative Policy Optimization", arXiv 2506.05183).

    Every turn n is scored against its siblings (the children of its parent, itself
    included): with V(n) = mean reward of the leaves below n,

        Â(n) = (V(n) - mean_{s ∈ sib(n)} V(s)) / (std_{s ∈ sib(n)} V(s) + ε)

    (without the division when `scale=False`). A turn without siblings gets 0; a leaf's
    V is its own reward. On a depth-1 tree the siblings are the prompt's rollouts, so this
    is GRPO. Each tree stands alone (siblings share a parent node).

    Returns:
        Per tree, shape (len(tree.nodes),), indexed by node id.
    """
    out = []
    for tree in trees:
        count, _, _ = tree.leaf_stats()
        nan_total = _nan_leaf_totals(tree)
        value = np.full(len(tree.nodes), np.nan)
        scorable = count - nan_total[1]
        np.divide(nan_total[0], scorable, out=value, where=scorable > 0)
        adv = np.zeros(len(tree.nodes))
        for node in tree.nodes:
            if node.children:
                kids = [c.id for c in node.children]
                adv[kids] = group_advantages(value[kids], scale=scale, eps=eps)
        out.append(adv)
    return out


def _nan_leaf_totals(tree: RolloutTree) -> tuple[np.ndarray, np.ndarray]:
    """Per node: (sum of finite leaf rewards below, number of non-finite leaf rewards below)."""
    total = np.zeros(len(tree.nodes))
    bad = np.zeros(len(tree.nodes))
    for node in reversed(tree.nodes):
        if node.done:
            if np.isfinite(node.reward):
                total[node.id] += node.reward
            else:
                bad[node.id] += 1
        if node.parent is not None:
            total[node.parent.id] += total[node.id]
            bad[node.parent.id] += bad[node.id]
    return total, bad


ESTIMATORS: dict[str, TreeEstimator] = {
    "tree_grpo": tree_grpo_advantages,
    "treerpo": treerpo_advantages,
    "grpo": grpo_tree_advantages,
}
"""The estimators a config names; each is a function, chosen once by name."""
