import numpy as np
import pytest

from trace_gym import ConfigError, Job, RolloutRunner, RolloutTree, SimulatedPolicy, Task
from trace_gym.metrics import brier_score
from trace_gym.predictors import OraclePredictor, training_examples


@pytest.fixture(scope="module")
def trees():
    with RolloutRunner("trace_gym/SyntheticTree-v0", SimulatedPolicy(), seed=0) as runner:
        trees = runner.run([Job(task, 4) for task in runner.tasks[:5]])
        runner.run([Job(tree.nodes[1], 2, stage="continuation") for tree in trees])
    return trees


def test_returns_exactly_the_env_values(trees):
    oracle = OraclePredictor()
    for tree in trees:
        child = tree.root.children[0]
        got = oracle.predict([tree.root, child])
        assert got.dtype == np.float64
        assert got.tolist() == [tree.root.info["value"], child.info["value"]]
        assert oracle.predict([tree.task]).tolist() == [tree.task.metadata["v0"]]
        assert tree.root.info["value"] == tree.task.metadata["v0"]
    nodes = [n for t in trees for n in t.nodes]
    assert oracle.predict(nodes).tolist() == [n.info["value"] for n in nodes]


def test_fit_learns_nothing_and_reports_brier_against_targets(trees):
    oracle = OraclePredictor()
    examples = training_examples(trees)
    metrics = oracle.fit(trees)
    truth = np.array([e.anchor.info["value"] for e in examples])
    targets = np.array([e.target for e in examples])
    weights = np.array([e.weight for e in examples])
    assert metrics["examples"] == len(examples)
    assert metrics["brier"] == pytest.approx(np.sum(weights * (truth - targets) ** 2) / weights.sum())
    assert 0 <= metrics["ece"] <= 1
    assert brier_score(truth, targets, weights) < brier_score(np.full_like(truth, 0.5), targets, weights)
    assert oracle.predict([trees[0].root]).tolist() == [trees[0].root.info["value"]]


def test_missing_values_name_the_env_it_needs():
    oracle = OraclePredictor()
    task = Task("plain", "Add 2 and 3.")
    with pytest.raises(
        ConfigError, match=r"needs an env that exposes true success probabilities.*SyntheticTree-v0"
    ):
        oracle.predict([task])
    tree = RolloutTree(task)
    with pytest.raises(ConfigError, match=r"node 0 has no number under info\['value'\]"):
        oracle.predict([tree.root])


def test_custom_keys_and_state_round_trip():
    oracle = OraclePredictor(task_key="p", info_key="q")
    task = Task("t", "x", metadata={"p": 0.25})
    tree = RolloutTree(task)
    tree.root.info["q"] = 0.75
    assert oracle.predict([task, tree.root]).tolist() == [0.25, 0.75]
    loaded = OraclePredictor()
    loaded.load_state_dict(oracle.state_dict())
    assert loaded.predict([task, tree.root]).tolist() == [0.25, 0.75]


def test_out_of_range_values_are_refused():
    with pytest.raises(ConfigError, match=r"returned 1\.5 at index 0"):
        OraclePredictor().predict([Task("t", "x", metadata={"v0": 1.5})])
