import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_gym import RolloutTree, Task
from trace_gym.advantages import (
    EPS,
    ESTIMATORS,
    group_advantages,
    grpo_advantages,
    grpo_tree_advantages,
    tree_grpo_advantages,
    treerpo_advantages,
)
from trace_gym.errors import ConfigError

Shape = Any  # a float (a leaf's reward) or a list of shapes (a turn with children)


def build(shape: list[Shape], task_id: str = "t", order: Any = list) -> RolloutTree:
    """A tree whose root has `shape`'s children; each node's action names its path.

    `order` rearranges each node's (index, child) pairs before they are added, so the
    same labelled tree can be built with its siblings in another order.
    """
    tree = RolloutTree(Task(task_id, "prompt"))

    def grow(parent, children, path):
        for k, child in order(enumerate(children)):
            label = f"{path}/{k}"
            if isinstance(child, list):
                grow(tree.add_child(parent, action=label), child, label)
            else:
                tree.add_child(parent, action=label, reward=float(child), terminated=True)

    grow(tree.root, shape, "")
    return tree


def by_label(tree: RolloutTree, adv: np.ndarray) -> dict[str, float]:
    return {n.action: float(adv[n.id]) for n in tree.nodes[1:]}


# ----- one group ---------------------------------------------------------------------
def test_group_of_one_gets_zero_and_equal_rewards_give_zero():
    assert group_advantages([1.0]).tolist() == [0.0]
    assert group_advantages([0.7, 0.7, 0.7]).tolist() == [0.0, 0.0, 0.0]
    assert group_advantages([]).tolist() == []


def test_group_matches_the_grpo_formula_and_dr_grpo():
    r = np.array([1.0, 0.0, 0.0, 1.0, 1.0])
    expected = (r - r.mean()) / (r.std(ddof=1) + EPS)
    np.testing.assert_allclose(group_advantages(r), expected)
    np.testing.assert_allclose(group_advantages(r, scale=False), r - r.mean())


def test_nan_rewards_are_left_out_and_get_zero():
    adv = group_advantages([1.0, math.nan, 0.0])
    assert adv[1] == 0.0 and np.isfinite(adv).all()
    np.testing.assert_allclose(adv[[0, 2]], group_advantages([1.0, 0.0]))
    assert group_advantages([math.nan, 1.0]).tolist() == [0.0, 0.0]


def test_flat_grpo_normalises_within_each_group():
    adv = grpo_advantages([1.0, 0.0, 1.0, 1.0, 0.5], ["a", "a", "b", "b", "c"])
    np.testing.assert_allclose(adv[:2], group_advantages([1.0, 0.0]))
    assert adv[2:].tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ConfigError, match="one label per reward"):
        grpo_advantages([1.0, 0.0], ["a"])
    with pytest.raises(ConfigError, match="1-D array"):
        grpo_advantages([[1.0]])


# ----- reduction to GRPO -------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ESTIMATORS))
@pytest.mark.parametrize("scale", [True, False])
def test_every_estimator_is_grpo_on_depth_one_trees(name, scale):
    rng = np.random.default_rng(0)
    for size in (1, 2, 3, 8):
        rewards = rng.integers(0, 2, size).astype(float)
        rewards[0] = 1.0 - rewards[-1] if size > 1 else rewards[0]
        tree = build(list(rewards))
        [adv] = ESTIMATORS[name]([tree], scale=scale)
        expected = grpo_advantages(rewards, scale=scale)
        np.testing.assert_allclose(adv[1:], expected, atol=1e-12)
        assert adv[0] == 0.0


# ----- hand-computed values ----------------------------------------------------------
#   root ─ a ─ a1 (r=1)
#        │   └ a2 (r=0)
#        └ b (r=0)
SMALL: list[Shape] = [[1.0, 0.0], 0.0]


def test_tree_grpo_by_hand():
    tree = build(SMALL)
    [adv] = tree_grpo_advantages([tree], scale=False)
    # inter: rewards (1, 0, 0), mean 1/3; intra below a: (1, 0), mean 1/2; b branches only at the root
    got = by_label(tree, adv)
    assert got == pytest.approx({"/0/0": 2 / 3 + 1 / 2, "/0/1": -1 / 3 - 1 / 2, "/1": -1 / 3, "/0": 1 / 6})
    [scaled] = tree_grpo_advantages([tree])
    std_all, std_a = math.sqrt(1 / 3), math.sqrt(1 / 2)
    a1 = (2 / 3) / (std_all + EPS) + 0.5 / (std_a + EPS)
    a2 = (-1 / 3) / (std_all + EPS) - 0.5 / (std_a + EPS)
    assert by_label(tree, scaled) == pytest.approx(
        {"/0/0": a1, "/0/1": a2, "/1": (-1 / 3) / (std_all + EPS), "/0": (a1 + a2) / 2}
    )


def test_treerpo_by_hand():
    tree = build(SMALL)
    [adv] = treerpo_advantages([tree], scale=False)
    # V(a) = 1/2, V(b) = 0: siblings (a, b) have mean 1/4; (a1, a2) have mean 1/2
    assert by_label(tree, adv) == pytest.approx({"/0": 0.25, "/1": -0.25, "/0/0": 0.5, "/0/1": -0.5})
    [scaled] = treerpo_advantages([tree])
    s = math.sqrt(2 * 0.25**2) + EPS
    assert by_label(tree, scaled)["/0"] == pytest.approx(0.25 / s)


def test_grpo_on_a_tree_by_hand():
    tree = build(SMALL)
    [adv] = grpo_tree_advantages([tree], scale=False)
    assert by_label(tree, adv) == pytest.approx({"/0/0": 2 / 3, "/0/1": -1 / 3, "/1": -1 / 3, "/0": 1 / 6})


def test_an_only_child_gets_zero_under_treerpo():
    tree = build([[[1.0, 0.0]]])  # root ─ a ─ b ─ (1, 0)
    [adv] = treerpo_advantages([tree])
    got = by_label(tree, adv)
    assert got["/0"] == got["/0/0"] == 0.0 and got["/0/0/0"] > 0 > got["/0/0/1"]


def test_trees_of_one_prompt_share_the_inter_tree_group():
    first, second = build([1.0, 1.0], "x"), build([0.0, 0.0], "x")
    other = build([1.0, 1.0], "y")
    a, b, c = tree_grpo_advantages([first, second, other])
    assert (a[1:] > 0).all() and (b[1:] < 0).all() and (c == 0).all()
    np.testing.assert_allclose(a[1:], grpo_advantages([1.0, 1.0, 0.0, 0.0])[:2])


# ----- random trees against a slow reference -----------------------------------------
def leaves_of(node) -> list[Any]:
    return [node] if node.done else [leaf for c in node.children for leaf in leaves_of(c)]


def finite_mean_std(values: list[float]) -> tuple[float, float, int]:
    ok = [v for v in values if math.isfinite(v)]
    if len(ok) < 2:
        return 0.0, 0.0, len(ok)
    mean = sum(ok) / len(ok)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in ok) / (len(ok) - 1)), len(ok)


def normalised(value: float, group: list[float], scale: bool) -> float:
    mean, std, n = finite_mean_std(group)
    if n < 2 or not math.isfinite(value):
        return 0.0
    return (value - mean) / (std + EPS) if scale else value - mean


def reference(trees: list[RolloutTree], name: str, scale: bool) -> list[dict[int, float]]:
    out = []
    for tree in trees:
        prompt_leaves = [
            leaf.reward for t in trees if t.task.id == tree.task.id for leaf in leaves_of(t.root)
        ]
        leaf_adv = {}
        for leaf in leaves_of(tree.root):
            if name == "treerpo":
                continue
            adv = normalised(leaf.reward, prompt_leaves, scale)
            if name == "tree_grpo":
                node = leaf.parent
                while node.parent is not None and len(leaves_of(node)) < 2:
                    node = node.parent
                if node.parent is not None:
                    adv += normalised(leaf.reward, [x.reward for x in leaves_of(node)], scale)
            leaf_adv[leaf.id] = adv
        result = {}
        for node in tree.nodes[1:]:
            if name == "treerpo":

                def value(n):
                    rewards = [x.reward for x in leaves_of(n) if math.isfinite(x.reward)]
                    return sum(rewards) / len(rewards) if rewards else math.nan

                result[node.id] = normalised(value(node), [value(s) for s in node.parent.children], scale)  # type: ignore[union-attr]
            else:
                below = [leaf_adv[x.id] for x in leaves_of(node)]
                result[node.id] = sum(below) / len(below)
        out.append(result)
    return out


def shapes(max_leaves: int = 10):
    reward = st.sampled_from([0.0, 1.0, 0.25, math.nan])
    inner = st.recursive(reward, lambda kids: st.lists(kids, min_size=1, max_size=3), max_leaves=max_leaves)
    return st.lists(inner, min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(shapes(), shapes(), st.booleans(), st.sampled_from(sorted(ESTIMATORS)))
def test_random_trees_match_the_reference(shape_a, shape_b, scale, name):
    trees = [build(shape_a, "p"), build(shape_b, "p"), build(shape_b, "q")]
    got = ESTIMATORS[name](trees, scale=scale)
    for adv, expected in zip(got, reference(trees, name, scale), strict=True):
        assert np.isfinite(adv).all() and adv[0] == 0.0
        assert {k: adv[k] for k in expected} == pytest.approx(expected, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(shapes(), st.sampled_from(sorted(ESTIMATORS)), st.randoms(use_true_random=False))
def test_permuting_siblings_changes_nothing(shape, name, rnd):
    def shuffled(children):
        children = list(children)
        rnd.shuffle(children)
        return children

    labelled = build(shape)
    tree = build(shape, order=shuffled)  # the same labels, siblings in another order
    [a] = ESTIMATORS[name]([labelled])
    [b] = ESTIMATORS[name]([tree])
    assert by_label(labelled, a) == pytest.approx(by_label(tree, b), abs=1e-12)


def test_docstring_examples_hold():
    import doctest

    from trace_gym import advantages

    result = doctest.testmod(advantages)
    assert result.attempted > 0 and result.failed == 0
