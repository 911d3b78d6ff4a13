"""Compare rollout-allocation strategies at equal cost: the project's main job."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats
from tqdm.auto import tqdm

from trace_gym.budget import Budget, Ledger
from trace_gym.errors import ConfigError, MissingDependencyError
from trace_gym.metrics import (
    contrast_pairs_per_anchor,
    effective_per_rollouts,
    effective_per_tokens,
    effective_ratio,
    prediction_calibration,
)
from trace_gym.policies.base import Policy
from trace_gym.predictors import FeaturePredictor, OraclePredictor
from trace_gym.rollout import RolloutRunner, SamplingParams
from trace_gym.samplers import PCLSampler, TraceSampler, TreePOSampler, UniformSampler
from trace_gym.samplers.base import SampleBatch, Sampler
from trace_gym.samplers.trace import Scope
from trace_gym.tree import write_jsonl

SAMPLER_NAMES = ("uniform", "pcl", "treepo", "trace", "trace_oracle")
"""The samplers `trace-gym compare` knows by name."""

SamplerFactory = Callable[[int], Sequence[Sampler]]
"""Builds fresh samplers (with fresh predictors) for one seed."""

HEADLINE = (
    "effective_ratio",
    "effective_per_1k_rollouts",
    "contrast_pairs_per_1k_rollouts",
    "turns",
    "generated_tokens",
    "predictor_brier",
)


@dataclass(frozen=True)
class CompareConfig:
    """One comparison: every sampler gets the same candidate pools and budget."""

    env: str = "trace_gym/SyntheticTree-v0"
    """Gymnasium id of the env."""
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments for `gymnasium.make`."""
    steps: int = 8
    """Sampling steps per sampler and seed."""
    seeds: tuple[int, ...] = (0, 1)
    """One full run per seed (candidate pools, rollouts, predictors all reseeded)."""
    warmup: int = 3
    """First steps of each run left out of the summary (predictors start knowing nothing)."""
    budget: Budget = field(default_factory=lambda: Budget(256, 1, 8, 512))
    """M, N, Mmax and the candidate pool size of every step."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    """Sampling settings of every generation request."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1, got {self.steps}.")
        if not self.seeds:
            raise ConfigError("seeds must name at least one seed.")
        if not 0 <= self.warmup < self.steps:
            raise ConfigError(
                f"warmup must be in [0, steps) so some steps are summarised, got warmup="
                f"{self.warmup} with steps={self.steps}."
            )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable form."""
        data = asdict(self)
        data["env_kwargs"] = dict(self.env_kwargs)
        data["seeds"] = list(self.seeds)
        return data


def build_sampler(name: str, seed: int, group_size: int = 8, scope: Scope = "per_prompt") -> Sampler:
    """A fresh sampler (with a fresh predictor) of one of `SAMPLER_NAMES`, for one seed.

    Learned predictors are `FeaturePredictor`s; "trace_oracle" is TRACE with the
    `OraclePredictor` (envs that expose true values only).
    """
    if name == "uniform":
        return UniformSampler(group_size)
    if name == "pcl":
        return PCLSampler(FeaturePredictor(seed=seed), group_size)
    if name == "treepo":
        return TreePOSampler(group_size, seed=seed)
    if name == "trace":
        return TraceSampler(FeaturePredictor(seed=seed), scope=scope, seed=seed)
    if name == "trace_oracle":
        return TraceSampler(OraclePredictor(), scope=scope, name="trace_oracle", seed=seed)
    raise ConfigError(f"Unknown sampler {name!r}; choose from {', '.join(SAMPLER_NAMES)}.")


def step_metrics(batch: SampleBatch) -> dict[str, float]:
    """The metrics of one sampling step."""
    total = batch.ledger.total()
    pairs = sum(sum(t.contrast_pairs().values()) for t in batch.trees)
    calibration = prediction_calibration(batch)
    return {
        "effective_ratio": effective_ratio(batch.trees),
        "effective_per_1k_rollouts": effective_per_rollouts(batch.trees, batch.ledger),
        "effective_per_100k_tokens": effective_per_tokens(batch.trees, batch.ledger),
        "contrast_pairs_per_1k_rollouts": pairs * 1000 / total.rollouts if total.rollouts else math.nan,
        "contrast_pairs_per_anchor": contrast_pairs_per_anchor(batch.trees),
        "prompts": len(batch.trees),
        "rollouts": total.rollouts,
        "turns": total.turns,
        "generated_tokens": total.generated_tokens,
        "failures": total.failures,
        "wall_time": total.wall_time,
        "predictor_brier": calibration["brier"],
        "predictor_ece": calibration["ece"],
        "fallback": float(batch.fallback is not None),
    }


@dataclass
class SamplerRuns:
    """Everything one sampler did across seeds."""

    name: str
    steps: dict[int, list[dict[str, float]]] = field(default_factory=dict)
    """Per seed, each step's metrics."""
    ledger: Ledger = field(default_factory=Ledger)
    root_counts: list[int] = field(default_factory=list)
    """Every m_i the sampler chose (prompts that got rollouts)."""
    prefix_counts: list[int] = field(default_factory=list)
    """Every K the sampler chose (prefixes that got continuations)."""
    fallbacks: list[str] = field(default_factory=list)

    def summarised(self, metric: str, warmup: int) -> np.ndarray:
        """The metric's values over every seed's steps after the warm-up."""
        return np.array([s[metric] for runs in self.steps.values() for s in runs[warmup:]], dtype=float)

    def mean_ci(self, metric: str, warmup: int) -> tuple[float, float]:
        """Mean and 95% confidence half-width (t-interval over summarised steps)."""
        values = self.summarised(metric, warmup)
        values = values[~np.isnan(values)]
        if not len(values):
            return math.nan, math.nan
        if len(values) < 2:
            return float(values.mean()), math.nan
        half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
        return float(values.mean()), float(half)

    def summary(self, warmup: int) -> dict[str, Any]:
        """A JSON-serialisable summary: each metric's mean and CI, plus per-step values."""
        metrics = sorted({k for runs in self.steps.values() for s in runs for k in s})
        out: dict[str, Any] = {}
        for metric in metrics:
            mean, half = self.mean_ci(metric, warmup)
            out[metric] = mean
            out[f"{metric}_ci95"] = half
        out["steps"] = {str(seed): runs for seed, runs in self.steps.items()}
        out["ledger"] = self.ledger.to_dict()
        out["root_allocation_histogram"] = _histogram(self.root_counts)
        out["prefix_allocation_histogram"] = _histogram(self.prefix_counts)
        out["fallbacks"] = self.fallbacks
        return out


def _histogram(counts: Sequence[int]) -> dict[str, int]:
    values, freq = np.unique(np.asarray(counts, dtype=int), return_counts=True)
    return {str(v): int(f) for v, f in zip(values, freq, strict=True)}


def run_comparison(
    config: CompareConfig,
    samplers: SamplerFactory,
    policy_factory: Callable[[], Policy],
    *,
    trees_dir: Path | None = None,
    progress: bool | None = None,
) -> list[SamplerRuns]:
    """Run every sampler for `config.steps` steps per seed on the same candidate pools.

    For each seed, every sampler gets fresh state from `samplers(seed)` and its own
    runner seeded with that seed, and all see the same candidate pools. With
    `trees_dir`, each sampler's trees are written as `trees-<name>.jsonl`.
    """
    results: dict[str, SamplerRuns] = {}
    total = config.steps * len(config.seeds)
    bar = tqdm(total=total, unit="step", disable=None if progress is None else not progress)
    with bar:
        for seed in config.seeds:
            group = list(samplers(seed))
            names = [s.name for s in group]
            if len(set(names)) != len(names):
                raise ConfigError(f"Sampler names must be unique, got {names}; set .name on each.")
            _run_seed(config, seed, group, policy_factory, results, trees_dir, bar)
    return list(results.values())


def _run_seed(
    config: CompareConfig,
    seed: int,
    samplers: Sequence[Sampler],
    policy_factory: Callable[[], Policy],
    results: dict[str, SamplerRuns],
    trees_dir: Path | None,
    bar: Any,
) -> None:
    runners = [
        RolloutRunner(
            config.env, policy_factory(), seed=seed, env_kwargs=config.env_kwargs, sampling=config.sampling
        )
        for _ in samplers
    ]
    try:
        tasks = runners[0].tasks
        if config.budget.candidates > len(tasks):
            raise ConfigError(
                f"The budget asks for {config.budget.candidates} candidates per step but "
                f"{config.env} has {len(tasks)} tasks; lower candidates."
            )
        rng = np.random.default_rng(seed)
        for step in range(config.steps):
            pool = [tasks[i] for i in rng.choice(len(tasks), config.budget.candidates, replace=False)]
            for sampler, runner in zip(samplers, runners, strict=True):
                bar.set_postfix_str(f"seed {seed} {sampler.name}")
                batch = sampler.sample(pool, runner, config.budget)
                runs = results.setdefault(sampler.name, SamplerRuns(sampler.name))
                runs.steps.setdefault(seed, []).append(step_metrics(batch))
                runs.ledger.merge(batch.ledger)
                runs.root_counts.extend(batch.allocations.get("roots", {}).values())
                runs.prefix_counts.extend(batch.allocations.get("prefixes", {}).values())
                if batch.fallback:
                    runs.fallbacks.append(f"seed {seed} step {step}: {batch.fallback}")
                if trees_dir is not None:
                    trees_dir.mkdir(parents=True, exist_ok=True)
                    first = len(runs.steps) == 1 and len(runs.steps[seed]) == 1  # this run's first write
                    path = trees_dir / f"trees-{sampler.name}.jsonl"
                    with open(path, "w" if first else "a", encoding="utf-8") as fh:
                        write_jsonl(batch.trees, fh)
            bar.update(1)
    finally:
        for runner in runners:
            runner.close()


def summary(config: CompareConfig, results: Sequence[SamplerRuns]) -> dict[str, Any]:
    """`{"config": {...}, "samplers": {name: {metric: mean, metric_ci95: ..., ...}}}`."""
    return {
        "config": config.to_dict(),
        "samplers": {r.name: r.summary(config.warmup) for r in results},
    }


def format_table(config: CompareConfig, results: Sequence[SamplerRuns]) -> str:
    """A plain-text table of the headline metrics (means over summarised steps)."""
    header = (
        f"{'sampler':<13} {'effective ratio (95% CI)':>25} {'eff/1k rollouts':>16} "
        f"{'pairs/1k rollouts':>18} {'turns':>9} {'gen tokens':>11} {'Brier':>7}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        ratio, half = r.mean_ci("effective_ratio", config.warmup)
        ci = f"{ratio:.3f} ± {half:.3f}" if not math.isnan(half) else f"{ratio:.3f}"
        brier = r.mean_ci("predictor_brier", config.warmup)[0]
        lines.append(
            f"{r.name:<13} {ci:>25} "
            f"{r.mean_ci('effective_per_1k_rollouts', config.warmup)[0]:>16.1f} "
            f"{r.mean_ci('contrast_pairs_per_1k_rollouts', config.warmup)[0]:>18.0f} "
            f"{r.ledger.total().turns:>9d} {r.ledger.total().generated_tokens:>11d} "
            f"{'-' if math.isnan(brier) else f'{brier:.3f}':>7}"
        )
    return "\n".join(lines)


def write_plot(config: CompareConfig, results: Sequence[SamplerRuns], path: Path) -> None:
    """A PNG: effective ratio per step per sampler, and the allocations m_i and K."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependencyError("matplotlib", "compare", "Writing the comparison plot") from None
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colours = {r.name: f"C{i}" for i, r in enumerate(results)}
    for r in results:
        per_step = np.nanmean([[s["effective_ratio"] for s in runs] for runs in r.steps.values()], axis=0)
        axes[0].plot(
            np.arange(1, len(per_step) + 1), per_step, marker="o", label=r.name, color=colours[r.name]
        )
    if config.warmup:
        axes[0].axvspan(0.5, config.warmup + 0.5, color="0.9", label="warm-up")
    axes[0].set(xlabel="step", ylabel="effective ratio", title="Effective ratio per step (mean over seeds)")
    axes[0].legend(fontsize=8)
    for ax, attr, title in (
        (axes[1], "root_counts", "Root allocations m_i"),
        (axes[2], "prefix_counts", "Prefix allocations K"),
    ):
        drawn = [(r.name, getattr(r, attr)) for r in results if getattr(r, attr)]
        if drawn:
            top = max(max(c) for _, c in drawn)
            bins = np.arange(0.5, top + 1.5)
            ax.hist(
                [c for _, c in drawn],
                bins=bins,
                label=[n for n, _ in drawn],
                color=[colours[n] for n, _ in drawn],
            )
            ax.legend(fontsize=8)
        ax.set(xlabel="rollouts", ylabel="count", title=title)
    fig.suptitle(
        f"{config.env}: M={config.budget.roots}, N={config.budget.continuations_per_root}, "
        f"Mmax={config.budget.max_per_prompt}, {config.budget.candidates} candidates, "
        f"{config.steps} steps x {len(config.seeds)} seeds"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_summary(config: CompareConfig, results: Sequence[SamplerRuns], path: Path) -> None:
    """Write `summary(...)` as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary(config, results), indent=2) + "\n", encoding="utf-8")
