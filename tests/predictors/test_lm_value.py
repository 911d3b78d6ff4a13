import numpy as np
import pytest

pytest.importorskip("transformers", reason="pip install 'trace-gym[hf]'")

from trace_gym import RolloutTree, Task
from trace_gym.metrics import brier_score
from trace_gym.policies.tiny import make_tiny_model
from trace_gym.predictors import Predictor
from trace_gym.predictors.lm_value import LMValueConfig, LMValuePredictor

WORDS = ["alpha", "bravo", "delta", "kilo", "lima", "mike"]


def _tree(i: int, easy: bool) -> RolloutTree:
    """A task whose prompt says whether it is easy; 4 leaves, 3 of 4 succeed if easy, 1 if hard."""
    word = "sunny calm easy" if easy else "stormy dark hard"
    tree = RolloutTree(Task(f"t{i}", f"Task {WORDS[i % len(WORDS)]} {i}: the weather is {word}."))
    for j in range(4):
        ok = (j < 3) if easy else (j < 1)
        tree.add_child(tree.root, action="a", terminated=True, success=ok, reward=float(ok))
    return tree


def test_starts_at_one_half_and_is_a_predictor():
    model, tokenizer = make_tiny_model(seed=1)
    predictor = LMValuePredictor(model, tokenizer)
    assert isinstance(predictor, Predictor)
    assert predictor.predict([Task("a", "x"), Task("b", "a longer prompt")]).tolist() == [0.5, 0.5]


def test_fits_a_synthetic_target_better_than_the_constants():
    model, tokenizer = make_tiny_model(seed=1)
    predictor = LMValuePredictor(model, tokenizer, LMValueConfig(lr=2e-2, epochs=30, batch_size=32))
    train = [_tree(i, easy=i % 2 == 0) for i in range(40)]
    test = [_tree(i, easy=i % 2 == 0) for i in range(40, 60)]
    metrics = predictor.fit(train)
    assert metrics["examples"] == 40
    p = predictor.predict([t.root for t in test])
    truth = np.array([t.success_rate() for t in test])
    base_rate = np.mean([t.success_rate() for t in train])
    assert brier_score(p, truth) < brier_score(np.full(len(test), 0.5), truth)
    assert brier_score(p, truth) < 0.5 * brier_score(np.full(len(test), base_rate), truth)


def test_state_dict_round_trip_predicts_identically():
    model, tokenizer = make_tiny_model(seed=1)
    predictor = LMValuePredictor(model, tokenizer, LMValueConfig(lr=1e-2, epochs=2))
    predictor.fit([_tree(i, easy=i % 2 == 0) for i in range(8)])
    other_model, other_tokenizer = make_tiny_model(seed=1)
    other = LMValuePredictor(other_model, other_tokenizer, LMValueConfig(lr=1e-2, epochs=2))
    other.load_state_dict(predictor.state_dict())
    anchors = [_tree(i, easy=True).root for i in range(3)]
    assert np.allclose(other.predict(anchors), predictor.predict(anchors))


def test_backbone_training_changes_the_backbone_only_when_asked():
    model, tokenizer = make_tiny_model(seed=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    LMValuePredictor(model, tokenizer, LMValueConfig(epochs=1)).fit([_tree(0, True), _tree(1, False)])
    assert all((model.state_dict()[k] == v).all() for k, v in before.items())
    LMValuePredictor(model, tokenizer, LMValueConfig(epochs=1, train_backbone=True)).fit([_tree(0, True)])
    assert any((model.state_dict()[k] != v).any() for k, v in before.items())
