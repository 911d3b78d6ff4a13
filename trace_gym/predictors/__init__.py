"""Success-probability predictors for anchors (prompts and prefixes), DESIGN section 8."""

from trace_gym.predictors.base import (
    Anchor,
    Example,
    Predictor,
    anchor_depth,
    anchor_messages,
    anchor_task,
    anchor_text,
    anchor_turns,
    check_probabilities,
    training_examples,
)
from trace_gym.predictors.beta import BetaPredictor
from trace_gym.predictors.features import FeatureConfig, FeaturePredictor
from trace_gym.predictors.oracle import OraclePredictor

__all__ = [
    "Anchor",
    "BetaPredictor",
    "Example",
    "FeatureConfig",
    "FeaturePredictor",
    "LMValuePredictor",
    "OraclePredictor",
    "Predictor",
    "anchor_depth",
    "anchor_messages",
    "anchor_task",
    "anchor_text",
    "anchor_turns",
    "check_probabilities",
    "training_examples",
]


def __getattr__(name: str) -> object:
    # LMValuePredictor needs torch; import it only when asked for, so the core stays light.
    if name == "LMValuePredictor":
        from trace_gym.predictors.lm_value import LMValuePredictor

        return LMValuePredictor
    raise AttributeError(f"module 'trace_gym.predictors' has no attribute {name!r}")
