"""Compare rollout-allocation strategies at equal cost: the project's main job."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
from tqdm.auto import tqdm

from trace_gym.budget import Budget, Ledger
from trace_gym.errors import ConfigError
from trace_gym.metrics import (
    contrast_pairs_per_anchor,
    effective_per_rollouts,
    effective_per_tokens,
    effective_ratio,
)
from trace_gym.policies.base import Policy
from trace_gym.rollout import RolloutRunner
from trace_gym.samplers.base import SampleBatch, Sampler
from trace_gym.tree import write_jsonl

METRICS = (
    "effective_ratio",
    "effective_per_1k_rollouts",
    "effective_per_100k_tokens",
    "contrast_pairs_per_anchor",
    "rollouts",
    "turns",
    "generated_tokens",
    "failures",
    "wall_time",
)


@dataclass(frozen=True)
class CompareConfig:
    """One comparison run: every sampler gets the same candidate pools and budget."""

    env: str = "trace_gym/SyntheticTree-v0"
    """Gymnasium id of the env."""
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments for `gymnasium.make`."""
    steps: int = 10
    """Sampling steps per sampler."""
    budget: Budget = field(default_factory=lambda: Budget(256, 1, 8, 256))
    """M, N, Mmax and the candidate pool size of every step."""
    seed: int = 0
    """Seeds the candidate pools and every runner."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1, got {self.steps}.")


def step_metrics(batch: SampleBatch) -> dict[str, float]:
    """The metrics of one sampling step."""
    total = batch.ledger.total()
    return {
        "effective_ratio": effective_ratio(batch.trees),
        "effective_per_1k_rollouts": effective_per_rollouts(batch.trees, batch.ledger),
        "effective_per_100k_tokens": effective_per_tokens(batch.trees, batch.ledger),
        "contrast_pairs_per_anchor": contrast_pairs_per_anchor(batch.trees),
        "rollouts": total.rollouts,
        "turns": total.turns,
        "generated_tokens": total.generated_tokens,
        "failures": total.failures,
        "wall_time": total.wall_time,
    }


@dataclass
class SamplerResult:
    """Per-step metrics and the total ledger of one sampler."""

    name: str
    steps: list[dict[str, float]] = field(default_factory=list)
    ledger: Ledger = field(default_factory=Ledger)

    def mean(self, metric: str) -> float:
        """Mean of a metric over steps."""
        return float(np.mean([s[metric] for s in self.steps]))

    def stderr(self, metric: str) -> float:
        """Standard error of that mean (0 with one step)."""
        values = [s[metric] for s in self.steps]
        return float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable summary."""
        return {
            "name": self.name,
            "mean": {m: self.mean(m) for m in METRICS},
            "stderr": {m: self.stderr(m) for m in METRICS},
            "steps": self.steps,
            "ledger": self.ledger.to_dict(),
        }


def run_comparison(
    config: CompareConfig,
    samplers: Sequence[Sampler],
    policy_factory: Callable[[], Policy],
    *,
    out: Path | None = None,
    progress: bool | None = None,
) -> list[SamplerResult]:
    """Run every sampler for `config.steps` steps on the same candidate pools.

    Each sampler has its own runner seeded with `config.seed`, so samplers that make
    the same decisions get the same rollouts. With `out`, writes `summary.json` and
    each sampler's trees as `trees-<name>.jsonl`.
    """
    names = [s.name for s in samplers]
    if len(set(names)) != len(names):
        raise ConfigError(f"Sampler names must be unique, got {names}; set .name on each.")
    runners = [
        RolloutRunner(config.env, policy_factory(), seed=config.seed, env_kwargs=config.env_kwargs)
        for _ in samplers
    ]
    tasks = runners[0].tasks
    if config.budget.candidates > len(tasks):
        raise ConfigError(
            f"The budget asks for {config.budget.candidates} candidates per step but "
            f"{config.env} has {len(tasks)} tasks; lower candidates."
        )
    rng = np.random.default_rng(config.seed)
    results = [SamplerResult(s.name) for s in samplers]
    with contextlib.ExitStack() as stack:
        tree_files: dict[str, IO[str]] = {}
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            for s in samplers:
                path = out / f"trees-{s.name}.jsonl"
                tree_files[s.name] = stack.enter_context(open(path, "w", encoding="utf-8"))
        for runner in runners:
            stack.callback(runner.close)
        bar = tqdm(
            total=config.steps * len(samplers),
            unit="step",
            disable=None if progress is None else not progress,
        )
        with bar:
            for _ in range(config.steps):
                pool = [tasks[i] for i in rng.choice(len(tasks), config.budget.candidates, replace=False)]
                for sampler, runner, result in zip(samplers, runners, results, strict=True):
                    bar.set_postfix_str(sampler.name)
                    batch = sampler.sample(pool, runner, config.budget)
                    result.steps.append(step_metrics(batch))
                    result.ledger.merge(batch.ledger)
                    if sampler.name in tree_files:
                        write_jsonl(batch.trees, tree_files[sampler.name])
                    bar.update(1)
    if out is not None:
        summary = {"config": _config_dict(config), "samplers": [r.to_dict() for r in results]}
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return results


def _config_dict(config: CompareConfig) -> dict[str, Any]:
    data = asdict(config)
    data["env_kwargs"] = dict(config.env_kwargs)
    return data


def format_table(results: Sequence[SamplerResult]) -> str:
    """A plain-text table of the headline metrics (mean ± standard error over steps)."""
    columns = ("effective ratio", "eff/1k rollouts", "eff/100k tokens", "pairs/anchor")
    totals = ("rollouts", "turns", "wall s")
    header = f"{'sampler':<12} {columns[0]:>17} " + " ".join(f"{c:>16}" for c in columns[1:])
    header += " " + " ".join(f"{c:>9}" for c in totals)
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(
            f"{r.name:<12} "
            f"{r.mean('effective_ratio'):>9.3f} ± {r.stderr('effective_ratio'):.3f} "
            f"{r.mean('effective_per_1k_rollouts'):>16.1f} "
            f"{r.mean('effective_per_100k_tokens'):>16.1f} "
            f"{r.mean('contrast_pairs_per_anchor'):>16.2f} "
            f"{r.ledger.total().rollouts:>9d} {r.ledger.total().turns:>9d} "
            f"{r.ledger.total().wall_time:>9.2f}"
        )
    return "\n".join(lines)
