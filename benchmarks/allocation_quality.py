"""Allocation quality: every sampler at equal cost over several budgets and seeds.

On SyntheticTree-v0 with SimulatedPolicy (uniform with 8 per prompt is calibrated to
the paper's GRPO effective ratio, 0.27-0.35). Targets (issue "Allocation"): TRACE with
the learned FeaturePredictor reaches an effective ratio >= 0.60, >= 1.8x uniform and
>= 90% of TRACE with the oracle predictor, after the warm-up; on effective prompts per
1k rollouts, uniform < TreePO and PCL < TRACE.

A reference row, trace_hint_bayes, is TRACE whose Stage 1 uses the exact posterior
mean of V_0 given the prompt's hint words (the best any predictor that reads only the
prompt can do for a task it has not seen) and whose Stage 2 uses the true values: it
bounds what a learned predictor can reach within a few steps.

Run: python benchmarks/allocation_quality.py [--steps 12] [--seeds 0,1,2] [--warmup 4] [--budgets 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np

from trace_gym import Budget, SimulatedPolicy, Task
from trace_gym.compare import SAMPLER_NAMES, CompareConfig, SamplerRuns, build_sampler, run_comparison
from trace_gym.envs.synthetic import POSITIVE_WORDS, SyntheticConfig
from trace_gym.predictors import OraclePredictor
from trace_gym.predictors.base import Anchor
from trace_gym.samplers import Sampler, TraceSampler

BUDGETS = {
    "M=128 N=1 P=256": Budget(128, 1, 8, 256),
    "M=256 N=1 P=512": Budget(256, 1, 8, 512),
    "M=256 N=3 P=512": Budget(256, 3, 8, 512),
}


class HintPosteriorPredictor(OraclePredictor):
    """E[V_0 | hint words] under the env's Beta prior at the root; true values below it."""

    def predict(self, anchors: Sequence[Anchor]) -> np.ndarray:
        config = SyntheticConfig()
        out = []
        for anchor in anchors:
            if isinstance(anchor, Task) or anchor.parent is None:
                task = anchor if isinstance(anchor, Task) else anchor.tree.task  # type: ignore[union-attr]
                hints = task.messages()[-1]["content"].split("Hints: ")[1].rstrip(".").split()
                k = sum(word in POSITIVE_WORDS for word in hints)
                out.append((config.alpha + k) / (config.alpha + config.beta + len(hints)))
            else:
                out.append(float(anchor.info["value"]))
        return np.array(out)


def samplers(seed: int) -> list[Sampler]:
    reference = TraceSampler(HintPosteriorPredictor(), name="trace_hint_bayes", seed=seed)
    return [*(build_sampler(n, seed) for n in SAMPLER_NAMES), reference]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--budgets", default=",".join(str(i) for i in range(len(BUDGETS))),
                        help="comma-separated indices into the budget list")  # fmt: skip
    args = parser.parse_args()
    chosen = [list(BUDGETS)[int(i)] for i in args.budgets.split(",")]
    seeds = tuple(int(s) for s in args.seeds.split(","))
    print(
        f"{'budget':<17} {'sampler':<13} {'eff ratio':>15} {'eff/1k roll':>12} {'pairs/1k':>9} {'Brier':>7}"
    )
    checks: list[tuple[str, str, float, bool]] = []
    start = time.perf_counter()
    for label in chosen:
        budget = BUDGETS[label]
        config = CompareConfig(steps=args.steps, seeds=seeds, warmup=args.warmup, budget=budget)
        results = run_comparison(
            config,
            samplers,
            SimulatedPolicy,
            progress=False,
        )
        by_name: dict[str, SamplerRuns] = {r.name: r for r in results}
        for r in results:
            ratio, half = r.mean_ci("effective_ratio", args.warmup)
            brier = r.mean_ci("predictor_brier", args.warmup)[0]
            print(
                f"{label:<17} {r.name:<13} {ratio:>8.3f} ± {half:.3f} "
                f"{r.mean_ci('effective_per_1k_rollouts', args.warmup)[0]:>12.1f} "
                f"{r.mean_ci('contrast_pairs_per_1k_rollouts', args.warmup)[0]:>9.0f} {brier:>7.3f}"
            )
        means = {n: by_name[n].mean_ci("effective_ratio", args.warmup)[0] for n in by_name}
        per1k = {n: by_name[n].mean_ci("effective_per_1k_rollouts", args.warmup)[0] for n in by_name}
        trace, uniform, oracle = means["trace"], means["uniform"], means["trace_oracle"]
        checks += [
            (label, "TRACE effective ratio >= 0.60", trace, trace >= 0.60),
            (label, "TRACE / uniform >= 1.8", trace / uniform, trace >= 1.8 * uniform),
            (label, "TRACE / TRACE-oracle >= 0.9", trace / oracle, trace >= 0.9 * oracle),
            (label, "(hint-posterior / oracle)", means["trace_hint_bayes"] / oracle, True),
            (label, "eff/1k: TreePO / uniform > 1", per1k["treepo"] / per1k["uniform"], per1k["treepo"] > per1k["uniform"]),
            (label, "eff/1k: TRACE / PCL > 1", per1k["trace"] / per1k["pcl"], per1k["trace"] > per1k["pcl"]),
        ]  # fmt: skip
    print(f"\n{'budget':<17} {'target':<30} {'value':>7}  met")
    for label, target, value, met in checks:
        print(f"{label:<17} {target:<30} {value:>7.3f}  {'yes' if met else 'NO'}")
    print(f"\n{args.steps} steps x seeds {list(seeds)}, means over steps after {args.warmup}; "
          f"{time.perf_counter() - start:.0f} s")  # fmt: skip
    print("reproduce: python " + " ".join([sys.argv[0], *sys.argv[1:]]))


if __name__ == "__main__":
    main()
