"""LMValuePredictor: the paper's shared generalisable predictor, a transformer with a value head."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from trace_gym.errors import ConfigError, MissingDependencyError
from trace_gym.metrics import brier_score, expected_calibration_error
from trace_gym.predictors.base import Anchor, anchor_messages, check_probabilities, training_examples
from trace_gym.tree import RolloutTree


@dataclass(frozen=True)
class LMValueConfig:
    """Training settings of `LMValuePredictor`."""

    lr: float = 1e-3
    """AdamW learning rate of the value head (the backbone's is `lr * backbone_lr_scale`)."""
    backbone_lr_scale: float = 0.1
    """Learning-rate multiplier of the backbone when it is trained."""
    train_backbone: bool = False
    """Fine-tune the backbone too (then give the predictor its own copy of the model)."""
    epochs: int = 2
    """Passes over each `fit` call's examples."""
    batch_size: int = 16
    """Histories per forward pass."""
    max_length: int = 512
    """Tokens kept per history (its newest ones)."""
    prefix_weight: float = 1.0
    """Weight of prefix examples relative to root examples."""
    seed: int = 0
    """Seeds the head's shuffling of examples."""

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.epochs < 1 or self.batch_size < 1 or self.max_length < 8:
            raise ConfigError(
                "LMValueConfig needs lr > 0, epochs >= 1, batch_size >= 1 and max_length >= 8, got "
                f"lr={self.lr}, epochs={self.epochs}, batch_size={self.batch_size}, "
                f"max_length={self.max_length}."
            )


class LMValuePredictor:
    """P(success | H) = σ(w · h(H) + b), h the backbone's last hidden state at H's last token.

    The backbone is any Hugging Face causal or encoder model (the tiny test model,
    SmolLM2, the policy's own architecture); histories are rendered with the tokenizer's
    chat template when it has one. The head starts at zero, so every prediction is 0.5
    before any data. `fit` minimises the binary cross-entropy between the prediction and
    each node's empirical subtree success rate, weighted by its leaf count, and reports
    the Brier score and ECE of the predictions it made before updating.

    Args:
        model: The backbone (not shared with a policy when `train_backbone` is on).
        tokenizer: Its tokenizer.
        config: Training settings.
        device: "cpu", "cuda", ... (default: the model's device).
    """

    def __init__(self, model: Any, tokenizer: Any, config: LMValueConfig | None = None, device: Any = None):
        try:
            import torch
        except ImportError:
            raise MissingDependencyError("torch", "hf", "LMValuePredictor") from None
        self.torch = torch
        self.config = config or LMValueConfig()
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.model.to(self.device)
        hidden = int(model.config.hidden_size)
        self.head = torch.nn.Linear(hidden, 1).to(self.device)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.model.requires_grad_(self.config.train_backbone)
        groups = [{"params": self.head.parameters(), "lr": self.config.lr}]
        if self.config.train_backbone:
            groups.append(
                {"params": self.model.parameters(), "lr": self.config.lr * self.config.backbone_lr_scale}
            )
        self.optimizer = torch.optim.AdamW(groups)
        self.rng = np.random.default_rng(self.config.seed)

    # ----- encoding -------------------------------------------------------------------
    def _texts(self, anchors: Sequence[Anchor]) -> list[str]:
        texts = []
        for anchor in anchors:
            messages = anchor_messages(anchor)
            if getattr(self.tokenizer, "chat_template", None):
                texts.append(self.tokenizer.apply_chat_template(messages, tokenize=False))
            else:
                texts.append("\n".join(f"{m['role']}: {m['content']}" for m in messages))
        return texts

    def _features(self, anchors: Sequence[Anchor]) -> Any:
        """h(H) for each anchor: the last layer's hidden state at its last token."""
        torch = self.torch
        ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in self._texts(anchors)]
        ids = [row[-self.config.max_length :] or [0] for row in ids]
        width = max(len(row) for row in ids)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        input_ids = torch.tensor([row + [pad] * (width - len(row)) for row in ids], device=self.device)
        mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids], device=self.device)
        out = self.model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
        last = torch.tensor([len(row) - 1 for row in ids], device=self.device)
        return out.hidden_states[-1][torch.arange(len(ids), device=self.device), last]

    def _logits(self, anchors: Sequence[Anchor]) -> Any:
        return self.head(self._features(anchors).float()).squeeze(-1)

    # ----- the Predictor protocol -------------------------------------------------------
    def predict(self, anchors: Sequence[Anchor]) -> np.ndarray:
        """Success probabilities, batched."""
        torch = self.torch
        out = []
        self.model.eval()
        with torch.inference_mode():
            for i in range(0, len(anchors), self.config.batch_size):
                batch = anchors[i : i + self.config.batch_size]
                out.append(torch.sigmoid(self._logits(batch)).double().cpu().numpy())
        values = np.concatenate(out) if out else np.zeros(0)
        return check_probabilities(values, "LMValuePredictor.predict")

    def fit(self, trees: Sequence[RolloutTree]) -> dict[str, float]:
        """Train on the trees' subtree success rates; metrics use the pre-update predictions."""
        torch = self.torch
        examples = training_examples(trees, prefix_weight=self.config.prefix_weight)
        if not examples:
            return {"examples": 0.0}
        anchors = [e.anchor for e in examples]
        targets = np.array([e.target for e in examples])
        weights = np.array([e.weight for e in examples])
        before = self.predict(anchors)
        self.model.train(self.config.train_backbone)
        losses = []
        for _ in range(self.config.epochs):
            order = self.rng.permutation(len(examples))
            for i in range(0, len(order), self.config.batch_size):
                idx = order[i : i + self.config.batch_size]
                logits = self._logits([anchors[j] for j in idx])
                y = torch.tensor(targets[idx], dtype=torch.float32, device=self.device)
                w = torch.tensor(weights[idx], dtype=torch.float32, device=self.device)
                loss = (
                    torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="none") * w
                ).sum()
                loss = loss / w.sum()
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                losses.append(float(loss.detach()))
        self.model.eval()
        return {
            "examples": float(len(examples)),
            "loss": float(np.mean(losses)),
            "brier": brier_score(before, targets, weights),
            "ece": expected_calibration_error(before, targets, weights),
        }

    def state_dict(self) -> dict[str, Any]:
        """The head, the backbone when it is trained, the optimiser and the config."""
        state: dict[str, Any] = {
            "config": asdict(self.config),
            "head": self.head.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": self.rng.bit_generator.state,
        }
        if self.config.train_backbone:
            state["backbone"] = self.model.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned (the backbone must have the same architecture)."""
        if LMValueConfig(**state["config"]) != self.config:
            raise ConfigError(
                "The saved LMValuePredictor was trained with a different config "
                f"({state['config']}); build the predictor with LMValueConfig(**state['config'])."
            )
        self.head.load_state_dict(state["head"])
        if "backbone" in state:
            self.model.load_state_dict(state["backbone"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.bit_generator.state = state["rng"]
