"""Budget shape: breadth of roots versus depth of prefix sampling (the paper's ablation).

The paper (Qwen3-8B, HotpotQA) compares TRACE with (512 roots, N=2), (512, N=6) and
(1024, N=2) and finds breadth of roots beats depth of prefix sampling. Scaled to this
machine: (128, 2), (128, 6), (256, 2) on SyntheticTree-v0 with SimulatedPolicy, TRACE
with the FeaturePredictor, plus uniform at the same budgets for reference.

Run: python benchmarks/budget_shape.py [--steps 10] [--seeds 0,1] [--warmup 3]
"""

from __future__ import annotations

import argparse
import sys

from trace_gym import Budget, SimulatedPolicy
from trace_gym.compare import CompareConfig, build_sampler, run_comparison

SHAPES = {
    "(128 roots, N=2)": Budget(128, 2, 8, 256),
    "(128 roots, N=6)": Budget(128, 6, 8, 256),
    "(256 roots, N=2)": Budget(256, 2, 8, 512),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    seeds = tuple(int(s) for s in args.seeds.split(","))
    print(
        f"{'shape':<18} {'sampler':<9} {'rollouts/step':>13} {'prompts/step':>12} "
        f"{'eff ratio':>15} {'eff/1k roll':>12} {'pairs/1k':>9}"
    )
    for label, budget in SHAPES.items():
        config = CompareConfig(steps=args.steps, seeds=seeds, warmup=args.warmup, budget=budget)
        group = 8 if budget.total % 8 == 0 else 4
        results = run_comparison(
            config,
            lambda seed: [build_sampler("trace", seed), build_sampler("uniform", seed, group_size=group)],  # noqa: B023
            SimulatedPolicy,
            progress=False,
        )
        for r in results:
            ratio, half = r.mean_ci("effective_ratio", args.warmup)
            print(
                f"{label:<18} {r.name:<9} {budget.total:>13d} "
                f"{r.mean_ci('prompts', args.warmup)[0]:>12.1f} {ratio:>8.3f} ± {half:.3f} "
                f"{r.mean_ci('effective_per_1k_rollouts', args.warmup)[0]:>12.1f} "
                f"{r.mean_ci('contrast_pairs_per_1k_rollouts', args.warmup)[0]:>9.0f}"
            )
    print(f"\n{args.steps} steps x seeds {list(seeds)}, means over steps after {args.warmup}")
    print("reproduce: python " + " ".join([sys.argv[0], *sys.argv[1:]]))


if __name__ == "__main__":
    main()
