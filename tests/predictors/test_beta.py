import numpy as np
import pytest

from trace_gym import ConfigError, Job, RolloutRunner, RolloutTree, SimulatedPolicy, Task
from trace_gym.predictors import BetaPredictor


def _tree(task_id, root_outcomes, continuation_outcomes=()):
    """Bare rollouts (stage "root") and continuations (stage "continuation") from one prefix."""
    tree = RolloutTree(Task(task_id, "p"))
    tree.root.stage = "root"
    prefix = tree.add_child(tree.root, action="a", stage="root")
    for ok in root_outcomes:
        tree.add_child(prefix, terminated=True, success=ok, reward=float(ok), stage="root")
    for ok in continuation_outcomes:
        tree.add_child(prefix, terminated=True, success=ok, reward=float(ok), stage="continuation")
    return tree


def test_posterior_counts_by_hand():
    beta = BetaPredictor(prior_a=2.0, prior_b=1.0)
    beta.fit([_tree("x", [True, True, False]), _tree("y", [False])])
    assert beta.posterior("x") == (4.0, 2.0)
    assert beta.posterior("y") == (2.0, 2.0)
    assert beta.predict([Task("x", "p"), Task("y", "p")]).tolist() == [4 / 6, 2 / 4]
    beta.fit([_tree("x", [True])])
    assert beta.posterior("x") == (5.0, 2.0)


def test_continuation_leaves_are_ignored():
    beta = BetaPredictor()
    beta.fit([_tree("x", [True, False], continuation_outcomes=[True, True, True, True])])
    assert beta.posterior("x") == (2.0, 2.0)


def test_runner_trees_count_only_bare_rollouts():
    with RolloutRunner("trace_gym/SyntheticTree-v0", SimulatedPolicy(), seed=1) as runner:
        [tree] = runner.run([Job(runner.tasks[0], 4)])
        runner.run([Job(tree.nodes[1], 3, stage="continuation")])
    bare = [leaf.success for leaf in tree.leaves() if leaf.stage == "root"]
    assert len(bare) == 4 and len(list(tree.leaves())) == 7
    beta = BetaPredictor()
    beta.fit([tree])
    assert beta.posterior(tree.task.id) == (1.0 + sum(bare), 1.0 + 4 - sum(bare))


def test_decay_shrinks_old_counts_before_adding():
    beta = BetaPredictor(decay=0.5)
    beta.fit([_tree("x", [True] * 4), _tree("y", [False] * 2)])
    beta.fit([_tree("x", [False, False])])
    assert beta.posterior("x") == (1.0 + 2.0, 1.0 + 2.0)
    assert beta.posterior("y") == (1.0, 1.0 + 1.0)  # every task forgets, seen this step or not


def test_unseen_tasks_get_the_prior_mean_and_prefixes_inherit():
    beta = BetaPredictor()
    tree = _tree("x", [True, True, True])
    beta.fit([tree])
    prefix = tree.root.children[0]
    got = beta.predict([Task("never-seen", "p"), tree.root, prefix, tree.task])
    assert got.tolist() == [0.5, 0.8, 0.8, 0.8]
    assert BetaPredictor(prior_a=1.0, prior_b=3.0).predict([tree.task]).tolist() == [0.25]


def test_fit_reports_calibration_of_the_predictions_before_the_update():
    beta = BetaPredictor()
    metrics = beta.fit([_tree("x", [True, True, True, False]), _tree("y", [False, False])])
    # before: 0.5 for both; rates 0.75 (4 leaves) and 0 (2 leaves)
    assert metrics["examples"] == 6
    assert metrics["brier"] == pytest.approx((4 * 0.25**2 + 2 * 0.5**2) / 6)
    assert metrics["ece"] == pytest.approx(abs((4 * 0.75 + 2 * 0.0) / 6 - 0.5))


def test_state_round_trip_predicts_identically():
    beta = BetaPredictor(prior_a=0.5, prior_b=2.0, decay=0.9)
    beta.fit([_tree("x", [True, False, True]), _tree("y", [False])])
    beta.fit([_tree("x", [True])])
    state = beta.state_dict()
    assert isinstance(state["successes"], np.ndarray) and state["task_ids"] == ["x", "y"]
    loaded = BetaPredictor()
    loaded.load_state_dict(state)
    tasks = [Task("x", "p"), Task("y", "p"), Task("z", "p")]
    assert loaded.predict(tasks).tolist() == beta.predict(tasks).tolist()
    loaded.fit([_tree("y", [True])])
    beta.fit([_tree("y", [True])])
    assert loaded.predict(tasks).tolist() == beta.predict(tasks).tolist()


def test_bad_configuration_is_refused():
    with pytest.raises(ConfigError, match="prior_a and prior_b must be > 0"):
        BetaPredictor(prior_a=0.0)
    with pytest.raises(ConfigError, match=r"decay must be in \(0, 1\]"):
        BetaPredictor(decay=1.5)
    with pytest.raises(ConfigError, match="2 task ids but 1 success"):
        BetaPredictor().load_state_dict(
            {
                "prior_a": 1,
                "prior_b": 1,
                "decay": 1,
                "task_ids": ["a", "b"],
                "successes": [1],
                "failures": [1],
            }
        )
