"""FeaturePredictor: hashed text features and an online logistic model, shared across tasks."""

from __future__ import annotations

import re
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.optimize import minimize
from scipy.special import expit

from trace_gym.errors import ConfigError
from trace_gym.metrics import brier_score, expected_calibration_error
from trace_gym.predictors.base import Anchor, anchor_depth, anchor_turns, training_examples
from trace_gym.seeding import mix
from trace_gym.tree import RolloutTree

MAX_DEPTH_FEATURE = 8
"""Depths from this one on share one depth feature."""
_EXTRA = MAX_DEPTH_FEATURE + 2  # one-hot of min(depth, 8) (9 columns) and a bias
_TOKEN = re.compile(r"[a-z0-9]+(?:[-'_][a-z0-9]+)*")
_MASK32 = np.uint64(0xFFFFFFFF)
_GRAM_MUL = np.uint64(0x9E3779B1)  # a 32-bit odd constant (golden ratio)
_MEMO_LIMIT = 1 << 16  # entries per hash memo before it is cleared


@dataclass(frozen=True)
class FeatureConfig:
    """Settings of `FeaturePredictor` (its constructor arguments)."""

    dim: int = 2**18
    """Hash buckets per text block; the model has 2·dim + 10 weights."""
    ngrams: int = 2
    """Longest word n-gram hashed (1: words only)."""
    l2: float = 1e-4
    """L2 penalty on the weights, added to the weighted mean cross-entropy."""
    prefix_weight: float = 1.0
    """Multiplies the weight of prefix (non-root) examples."""
    max_examples: int = 50_000
    """Replay buffer size: the most recent examples refitted at each `fit`."""
    seed: int = 0
    """Seeds the feature hash (different seeds collide differently)."""
    max_iter: int = 20
    """Newton iterations per `fit` (each refit starts from the previous weights)."""
    tol: float = 1e-3
    """The refit stops once a Newton step moves the weights by less than this on average."""

    def __post_init__(self) -> None:
        if not 16 <= self.dim <= 2**28:
            raise ConfigError(f"dim must be in [16, 2**28], got {self.dim}; 2**18 suits most uses.")
        if self.ngrams < 1:
            raise ConfigError(f"ngrams must be >= 1 (1 hashes single words), got {self.ngrams}.")
        if not self.l2 >= 0:
            raise ConfigError(f"l2 must be >= 0, got {self.l2}.")
        if not self.prefix_weight >= 0:
            raise ConfigError(
                f"prefix_weight must be >= 0 (0 trains on roots only), got {self.prefix_weight}."
            )
        if not self.tol > 0:
            raise ConfigError(f"tol must be > 0, got {self.tol}.")
        if self.max_examples < 1 or self.max_iter < 1:
            raise ConfigError(
                f"max_examples and max_iter must be >= 1, got {self.max_examples}, {self.max_iter}."
            )

    @property
    def width(self) -> int:
        """Columns of the feature matrix: two hashed text blocks, depth one-hot and bias."""
        return 2 * self.dim + _EXTRA


class FeaturePredictor:
    """v(H) = σ(θ·φ(H)): a logistic model on hashed features of the anchor's text.

    φ(H) has three blocks. The conversation block hashes every lowercased word and
    word n-gram (n ≤ `ngrams`) of `anchor_text(H)` into `dim` buckets; the newest-message
    block does the same for the last message alone (the newest observation, where an
    agent's progress shows first); each block holds log(1 + count) scaled to unit L2
    norm. Last come a one-hot of min(depth, 8) and a bias. Hashes are CRC-32 based, so
    features are the same in every process (Python's `hash` is salted).

    `fit` adds the step's examples (`training_examples`: roots and prefixes, targets
    V̂ = mean leaf reward, weights = leaf counts) to a replay buffer of the most recent
    `max_examples`, then refits on the whole buffer by truncated Newton, warm-started from
    the previous weights, minimising

        L(θ) = Σ_i w_i [softplus(z_i) − y_i z_i] / Σ_i w_i + (l2 / 2)‖θ‖²,  z_i = θ·φ_i,

    the weighted cross-entropy with soft targets y_i. Before any data it predicts
    exactly 0.5. Because it scores text, it generalises to unseen prompts and prefixes.

    Args:
        dim: Hash buckets per text block.
        ngrams: Longest word n-gram hashed.
        l2: L2 penalty.
        prefix_weight: Weight multiplier of prefix examples.
        max_examples: Replay buffer size.
        seed: Seeds the feature hash.
        max_iter: Newton iterations per `fit`.
        tol: Convergence tolerance of the refit.
    """

    def __init__(
        self,
        dim: int = 2**18,
        ngrams: int = 2,
        l2: float = 1e-4,
        prefix_weight: float = 1.0,
        max_examples: int = 50_000,
        seed: int = 0,
        max_iter: int = 20,
        tol: float = 1e-3,
    ) -> None:
        self._configure(FeatureConfig(dim, ngrams, l2, prefix_weight, max_examples, seed, max_iter, tol))

    def _configure(self, config: FeatureConfig) -> None:
        self.config = config
        self.weights = np.zeros(config.width, dtype=np.float64)
        self.fits = 0
        self._x = sp.csr_matrix((0, config.width), dtype=np.float64)
        self._y = np.zeros(0, dtype=np.float64)
        self._w = np.zeros(0, dtype=np.float64)
        self._salt = mix(config.seed) & 0xFFFFFFFF
        self._word_memo: dict[str, int] = {}
        self._message_memo: dict[tuple[str, str], np.ndarray] = {}

    # ----- features -------------------------------------------------------------------
    def _hash_messages(self, keys: list[tuple[str, str]]) -> None:
        """Hash the words and n-grams of new messages into the memo, all in one pass.

        A message's buckets are those of the words of "role: content" and of its word
        n-grams (n ≤ ngrams; n-grams do not cross messages, so a history's features are
        the sum of its messages'). Words hash by salted CRC-32; an n-gram's hash is the
        (n−1)-gram's combined with its last word's.
        """
        memo, words = self._message_memo, self._word_memo
        tokens: list[str] = []
        sizes = np.empty(len(keys), dtype=np.int64)
        for i, (role, content) in enumerate(keys):
            found = _TOKEN.findall(f"{role}: {content}".lower())
            tokens.extend(found)
            sizes[i] = len(found)
        for token in dict.fromkeys(tokens).keys() - words.keys():
            words[token] = zlib.crc32(token.encode(), self._salt)
        h_all = np.array([words[t] for t in tokens], dtype=np.uint64)
        message = np.repeat(np.arange(len(keys)), sizes)
        grams, owners, current = [h_all], [message], h_all
        for n in range(2, self.config.ngrams + 1):
            current = ((current[:-1] * _GRAM_MUL) ^ h_all[n - 1 :] ^ np.uint64(n)) & _MASK32
            current = (current * _GRAM_MUL) & _MASK32
            same = message[: current.size] == message[n - 1 :]  # the n-gram stays in one message
            grams.append(current[same])
            owners.append(message[: current.size][same])
        owner = np.concatenate(owners)
        order = np.argsort(owner, kind="stable")
        buckets = (np.concatenate(grams)[order] % np.uint64(self.config.dim)).astype(np.int32)
        ends = np.cumsum(np.bincount(owner, minlength=len(keys))).tolist()
        for key, start, end in zip(keys, [0, *ends[:-1]], ends, strict=True):
            memo[key] = buckets[start:end]

    def features(self, anchors: Sequence[Anchor]) -> sp.csr_matrix:
        """φ of each anchor: a CSR matrix of shape (len(anchors), config.width)."""
        dim, n = self.config.dim, len(anchors)
        turns = [anchor_turns(a) for a in anchors]
        memo = self._message_memo
        if len(memo) > _MEMO_LIMIT or len(self._word_memo) > _MEMO_LIMIT:  # bound the memory held
            memo.clear()
            self._word_memo.clear()
        new = list(dict.fromkeys(k for t in turns for k in t if k not in memo))
        if new:
            self._hash_messages(new)
        parts: list[np.ndarray] = []
        sizes = np.zeros(n, dtype=np.int64)
        for i, keys in enumerate(turns):
            row = [memo[k] for k in keys]
            if row:
                row.append(row[-1] + dim)  # the newest-message block
                sizes[i] = sum(map(len, row))
                parts.extend(row)
        indptr = np.concatenate([[0], np.cumsum(sizes)])
        indices = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        counts = sp.csr_matrix((np.ones(indices.size), indices, indptr), shape=(n, 2 * dim))
        counts.sum_duplicates()  # sorts each row's columns and turns repeats into counts
        values = np.log1p(counts.data)
        # unit L2 norm per (row, block): block b of a row is its columns in [b·dim, (b+1)·dim)
        row_of = np.repeat(np.arange(n), np.diff(counts.indptr))
        key = row_of * 2 + counts.indices // dim
        values /= np.sqrt(np.bincount(key, weights=values**2, minlength=2 * n))[key]
        # append the depth one-hot and the bias after each row's text columns (still sorted)
        out_indptr = counts.indptr + 2 * np.arange(n + 1)
        data = np.ones(out_indptr[-1])
        indices = np.empty(out_indptr[-1], dtype=np.int32)
        text = np.arange(counts.nnz) + 2 * row_of
        data[text], indices[text] = values, counts.indices
        depths = np.array([min(anchor_depth(a), MAX_DEPTH_FEATURE) for a in anchors], dtype=np.int32)
        indices[out_indptr[1:] - 2] = 2 * dim + depths
        indices[out_indptr[1:] - 1] = self.config.width - 1
        return sp.csr_matrix((data, indices, out_indptr), shape=(n, self.config.width))

    # ----- prediction and training ----------------------------------------------------
    def predict(self, anchors: Sequence[Anchor]) -> np.ndarray:
        """σ(θ·φ(H)) for each anchor (exactly 0.5 before the first `fit`)."""
        if self.fits == 0:
            return np.full(len(anchors), 0.5)
        return np.asarray(expit(self.features(anchors) @ self.weights), dtype=np.float64)

    def fit(self, trees: Sequence[RolloutTree]) -> dict[str, float]:
        """Add the trees' examples to the replay buffer and refit on it.

        Returns:
            "examples" (added), "buffer" (examples refitted on), "brier" and "ece" of the
            predictions made before this update on the new examples (a held-out
            calibration check, weighted by leaf counts), "loss" (L(θ) after the refit),
            "iterations" and "seconds".
        """
        start = time.perf_counter()
        examples = training_examples(trees, prefix_weight=self.config.prefix_weight)
        x = self.features([e.anchor for e in examples])
        y = np.array([e.target for e in examples], dtype=np.float64)
        w = np.array([e.weight for e in examples], dtype=np.float64)
        before = np.full(len(examples), 0.5) if self.fits == 0 else expit(x @ self.weights)
        self._remember(x, y, w)
        loss, iterations = self._refit()
        self.fits += 1
        return {
            "examples": float(len(examples)),
            "buffer": float(self._y.size),
            "brier": brier_score(before, y, w),
            "ece": expected_calibration_error(before, y, w),
            "loss": loss,
            "iterations": float(iterations),
            "seconds": time.perf_counter() - start,
        }

    def _remember(self, x: sp.csr_matrix, y: np.ndarray, w: np.ndarray) -> None:
        """Append examples to the buffer, keeping the most recent `max_examples`."""
        keep = self.config.max_examples
        self._x = sp.vstack([self._x, x], format="csr")[-keep:]
        self._y = np.concatenate([self._y, y])[-keep:]
        self._w = np.concatenate([self._w, w])[-keep:]

    def _refit(self) -> tuple[float, int]:
        """Minimise L(θ) over the buffer by truncated Newton (Newton-CG), from the current θ.

        The Hessian is never formed: ∇²L(θ)·v = Φᵀ(w ⊙ σ(z)(1 − σ(z)) ⊙ Φv) / Σw + l2·v
        (as in liblinear's trust-region Newton; scipy's L-BFGS-B took 3-5x as long here).
        Only columns present in the buffer are optimised: every other weight's optimum
        is 0 (its only term is the L2 penalty), so it is set to 0.
        """
        total = self._w.sum()
        if not total > 0:
            return float("nan"), 0
        active = np.flatnonzero(np.bincount(self._x.indices, minlength=self.config.width))
        column = np.zeros(self.config.width, dtype=np.int32)
        column[active] = np.arange(active.size, dtype=np.int32)
        x = sp.csr_matrix(
            (self._x.data, column[self._x.indices], self._x.indptr), shape=(self._y.size, active.size)
        )
        xt = x.T.tocsr()
        y, w = self._y, self._w / total
        l2 = self.config.l2
        curvature = {"theta": np.full(active.size, np.nan), "d": w}  # w ⊙ σ'(z) at the last θ seen

        def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
            z = x @ theta
            s = expit(z)
            curvature["theta"], curvature["d"] = theta.copy(), w * s * (1.0 - s)
            loss = np.dot(w, np.logaddexp(0.0, z) - y * z) + 0.5 * l2 * np.dot(theta, theta)
            return float(loss), xt @ (w * (s - y)) + l2 * theta

        def hessian_times(theta: np.ndarray, v: np.ndarray) -> np.ndarray:
            if not np.array_equal(theta, curvature["theta"]):
                objective(theta)
            return np.asarray(xt @ (curvature["d"] * (x @ v)) + l2 * v)

        result = minimize(
            objective,
            self.weights[active],
            jac=True,
            hessp=hessian_times,
            method="Newton-CG",
            options={"maxiter": self.config.max_iter, "xtol": self.config.tol},
        )
        self.weights = np.zeros(self.config.width, dtype=np.float64)
        self.weights[active] = result.x
        return float(result.fun), int(result.nit)

    # ----- checkpoints ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Config, the non-zero weights and the replay buffer (as CSR arrays)."""
        nonzero = np.flatnonzero(self.weights)
        return {
            "config": asdict(self.config),
            "fits": self.fits,
            "weight_index": nonzero,
            "weight_value": self.weights[nonzero].copy(),
            "buffer_data": self._x.data.copy(),
            "buffer_indices": self._x.indices.copy(),
            "buffer_indptr": self._x.indptr.copy(),
            "buffer_targets": self._y.copy(),
            "buffer_weights": self._w.copy(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned (its config replaces this predictor's)."""
        self._configure(FeatureConfig(**state["config"]))
        self.fits = int(state["fits"])
        self.weights[np.asarray(state["weight_index"], dtype=np.int64)] = state["weight_value"]
        indptr = np.asarray(state["buffer_indptr"])
        self._x = sp.csr_matrix(
            (state["buffer_data"], state["buffer_indices"], indptr),
            shape=(indptr.size - 1, self.config.width),
        )
        self._y = np.asarray(state["buffer_targets"], dtype=np.float64)
        self._w = np.asarray(state["buffer_weights"], dtype=np.float64)
