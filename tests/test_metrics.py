import math

from trace_gym import Ledger, RolloutTree, Task
from trace_gym.metrics import (
    contrast_pairs_per_anchor,
    effective_per_rollouts,
    effective_per_tokens,
    effective_ratio,
)


def _tree(task_id, outcomes, tokens=10):
    tree = RolloutTree(Task(task_id, "p"))
    for ok in outcomes:
        tree.add_child(
            tree.root, action="a", terminated=True, success=ok, reward=float(ok), completion_tokens=tokens
        )
    return tree


def test_effective_ratio_counts_mixed_trees():
    trees = [_tree("a", [True, False]), _tree("b", [True, True]), _tree("c", [False, False, True])]
    assert effective_ratio(trees) == 2 / 3
    assert math.isnan(effective_ratio([]))


def test_per_rollout_and_per_token_rates_use_the_ledger():
    trees = [_tree("a", [True, False]), _tree("b", [True, True])]
    ledger = Ledger.from_trees(trees)
    assert effective_per_rollouts(trees, ledger) == 1 * 1000 / 4
    assert effective_per_tokens(trees, ledger) == 1 * 100_000 / 40


def test_skipping_prompts_cannot_inflate_the_per_rollout_rate():
    """Spending rollouts on prompts and dropping their trees still counts the rollouts."""
    kept, dropped = _tree("a", [True, False]), _tree("b", [True, True])
    ledger = Ledger.from_trees([kept, dropped])
    assert effective_per_rollouts([kept], ledger) == effective_per_rollouts([kept, dropped], ledger)


def test_contrast_pairs_per_anchor():
    tree = _tree("a", [True, False, False])  # root only anchor: 1 * 2 pairs
    assert contrast_pairs_per_anchor([tree]) == 2
    assert math.isnan(contrast_pairs_per_anchor([]))


def test_prediction_calibration_compares_with_realised_subtree_means():
    from trace_gym.metrics import brier_score, prediction_calibration
    from trace_gym.samplers import Prediction, SampleBatch

    tree = _tree("a", [True, False, False, True])  # root mean 0.5 over 4 leaves
    leaf = tree.nodes[1]
    predictions = [
        Prediction("a", 0, "root", 0.8),  # realised 0.5, weight 4
        Prediction("a", leaf.id, "prefix", 0.25),  # realised 1.0, weight 1
        Prediction("skipped", None, "root", 0.1),  # no rollouts: left out
        Prediction("other", 0, "root", 0.3),  # no such tree: left out
    ]
    batch = SampleBatch([tree], Ledger.from_trees([tree]), predictions=predictions)
    result = prediction_calibration(batch)
    expected = (4 * (0.8 - 0.5) ** 2 + 1 * (0.25 - 1.0) ** 2) / 5
    assert result["brier"] == brier_score([0.8, 0.25], [0.5, 1.0], [4, 1]) == expected
    assert result["ece"] > 0
    assert math.isnan(prediction_calibration(SampleBatch([tree], Ledger()))["brier"])
