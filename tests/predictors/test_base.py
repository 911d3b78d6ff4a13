import numpy as np
import pytest

from trace_gym import ConfigError, Job, RolloutRunner, RolloutTree, SimulatedPolicy, Task
from trace_gym.predictors import (
    BetaPredictor,
    FeaturePredictor,
    OraclePredictor,
    Predictor,
    anchor_depth,
    anchor_messages,
    anchor_task,
    anchor_text,
    check_probabilities,
    training_examples,
)


def _leaf(tree, parent, ok, **fields):
    return tree.add_child(parent, action="a", terminated=True, success=ok, reward=float(ok), **fields)


def _hand_tree():
    """root -> a -> {a1 ok, a2 fail}; root -> b ok; root -> c -> c1 -> c11 fail; root -> d (open)."""
    tree = RolloutTree(Task("t", "Solve it."))
    a = tree.add_child(tree.root, action="step a")
    _leaf(tree, a, True)
    _leaf(tree, a, False)
    _leaf(tree, tree.root, True)
    c = tree.add_child(tree.root, action="step c")
    c1 = tree.add_child(c, action="step c1")
    _leaf(tree, c1, False)
    tree.add_child(tree.root, action="step d")  # no leaf below: skipped
    return tree, a, c, c1


def test_targets_are_leaf_means_and_weights_are_leaf_counts():
    tree, a, c, c1 = _hand_tree()
    examples = training_examples([tree])
    got = [(e.anchor, e.target, e.weight, e.is_root) for e in examples]
    assert got == [
        (tree.root, 0.5, 4.0, True),
        (a, 0.5, 2.0, False),
        (c, 0.0, 1.0, False),
        (c1, 0.0, 1.0, False),
    ]
    for e in examples:  # the same as the tree's own statistic
        assert e.target == tree.success_rate(e.anchor)


def test_prefix_weight_scales_only_non_root_examples():
    tree, *_ = _hand_tree()
    weights = [(e.is_root, e.weight) for e in training_examples([tree], prefix_weight=0.25)]
    assert weights == [(True, 4.0), (False, 0.5), (False, 0.25), (False, 0.25)]
    assert [e.is_root for e in training_examples([tree], prefix_weight=0.0)] == [True, False, False, False]


def test_leaves_are_examples_only_when_asked():
    tree, *_ = _hand_tree()
    examples = training_examples([tree], include_leaves=True, prefix_weight=2.0)
    leaves = [e for e in examples if e.anchor.done]
    assert [(e.target, e.weight) for e in leaves] == [(1.0, 2.0), (0.0, 2.0), (1.0, 2.0), (0.0, 2.0)]
    assert len(examples) == 4 + 4


def test_soft_rewards_give_soft_targets_and_trees_keep_their_order():
    first = RolloutTree(Task("x", "p"))
    for reward in (0.25, 1.0):
        first.add_child(first.root, terminated=True, reward=reward)
    second, *_ = _hand_tree()
    examples = training_examples([first, second])
    assert [(anchor_task(e.anchor).id, e.target) for e in examples if e.is_root] == [("x", 0.625), ("t", 0.5)]


def test_negative_prefix_weight_is_refused():
    with pytest.raises(ConfigError, match="prefix_weight must be >= 0"):
        training_examples([], prefix_weight=-1.0)


def test_anchor_helpers_on_tasks_roots_and_prefixes():
    tree, a, _, c1 = _hand_tree()
    task = tree.task
    assert anchor_text(task) == "user: Solve it."
    assert anchor_text(tree.root) == anchor_text(task)  # a hand-built root falls back to the task prompt
    assert anchor_text(c1) == "user: Solve it.\nassistant: step c\nassistant: step c1"
    assert anchor_messages(a)[-1] == {"role": "assistant", "content": "step a"}
    assert [anchor_depth(x) for x in (task, tree.root, a, c1)] == [0, 0, 1, 2]
    assert anchor_task(c1) is task and anchor_task(task) is task


def test_anchor_text_of_a_runner_tree_is_its_history():
    with RolloutRunner("trace_gym/SyntheticTree-v0", SimulatedPolicy(), seed=0) as runner:
        task = runner.tasks[0]
        [tree] = runner.run([Job(task, 1)])
    node = tree.nodes[2]
    assert anchor_text(tree.root) == anchor_text(task)
    assert anchor_messages(node) == node.history()
    assert anchor_text(node).endswith(node.messages[-1]["content"])


def test_check_probabilities_accepts_and_converts():
    out = check_probabilities(np.array([0, 0.5, 1], dtype=np.float32), "p")
    assert out.dtype == np.float64
    assert out.tolist() == [0.0, 0.5, 1.0]


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ([0.1, 0.2, float("nan")], r"MyPredictor.predict returned nan at index 2 \(1 bad of 3\)"),
        ([1.5, -0.1], r"returned 1.5 at index 0 \(2 bad of 2\).*numbers in \[0, 1\]"),
        ([0.5, float("inf")], "returned inf at index 1"),
    ],
)
def test_check_probabilities_names_the_first_bad_value(values, match):
    with pytest.raises(ConfigError, match=match):
        check_probabilities(np.array(values), "MyPredictor.predict")


def test_check_probabilities_wants_one_value_per_anchor():
    with pytest.raises(ConfigError, match=r"must return a 1-D array.*shape \(2, 2\)"):
        check_probabilities(np.full((2, 2), 0.5), "p")


def test_shipped_predictors_satisfy_the_protocol():
    for predictor in (OraclePredictor(), BetaPredictor(), FeaturePredictor(dim=64)):
        assert isinstance(predictor, Predictor)
    assert not isinstance(object(), Predictor)
