"""Tree-GRPO training curves of the embedded SmolLM2 on CPU: uniform against TRACE at equal budget.

For each seed and sampler, a fresh SmolLM2-135M-Instruct is trained with TreeGRPOTrainer for
`--steps` optimizer steps; every step both samplers spend M·(1+N) rollouts. Reported per
step (mean over seeds): the mean training reward of the step's rollouts and the effective
ratio (share of sampled prompts with both a success and a failure), plus the ledger.

The env is MathPython-v0 at difficulty 0 (one addition) when it is registered, else
SyntheticTree-v0 (two turns per episode).

Run: python benchmarks/train_curve.py [--steps 3 --seeds 0,1 --roots 4 --max-new-tokens 24]
Writes benchmarks/results/train_curve.{json,png}. Seeds can run as separate processes
(`--seeds 1 --output other.json`) and be combined with `--merge a.json b.json`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import torch
from transformers import PrinterCallback, TrainerCallback

from trace_gym.predictors import FeaturePredictor
from trace_gym.samplers import TraceSampler, UniformSampler
from trace_gym.samplers.base import Sampler
from trace_gym.trainers import TreeGRPOConfig, TreeGRPOTrainer

ROOT = Path(__file__).resolve().parents[1]


def pick_env() -> tuple[str, dict[str, Any]]:
    try:
        gymnasium.make("trace_gym/MathPython-v0", difficulty=0.0, num_tasks=8).close()
    except gymnasium.error.Error:
        return "trace_gym/SyntheticTree-v0", {
            "num_tasks": 64,
            "min_steps": 1,
            "max_steps": 2,
            "extra_turns": 0,
        }
    # The turn's last number counts as its answer: SmolLM2 rarely writes tags or answer phrases.
    return "trace_gym/MathPython-v0", {
        "difficulty": 0.0,
        "num_tasks": 64,
        "max_turns": 2,
        "last_number": True,
    }


def make_sampler(name: str, seed: int, group_size: int) -> Sampler:
    if name == "uniform":
        return UniformSampler(group_size)
    return TraceSampler(FeaturePredictor(seed=seed), seed=seed)


class StepLog(TrainerCallback):
    """Appends each step's metrics to a JSON-lines file and prints a progress line."""

    def __init__(self, path: Path, label: str) -> None:
        self.path, self.label = path, label

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any
    ) -> None:
        if logs and "reward" in logs:
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps({"run": self.label, "step": state.global_step, **logs}) + "\n")
            print(
                f"{self.label} step {state.global_step}: reward {logs['reward']:.3f}, "
                f"effective ratio {logs['effective_ratio']:.3f}, {logs.get('step_time', math.nan):.0f} s",
                file=sys.stderr,
                flush=True,
            )


def held_out_tasks(env: str, env_kwargs: dict[str, Any], problems: int) -> list[Any]:
    """`problems` MathPython tasks from another generator seed, none with a training task's text."""
    if problems <= 0 or "MathPython" not in env:
        return []
    train: Any = gymnasium.make(env, **env_kwargs)
    other: Any = gymnasium.make(env, **{**env_kwargs, "seed": 10_000, "num_tasks": 4 * problems})
    try:
        seen = {task.prompt for task in train.unwrapped.tasks}
        return [task for task in other.unwrapped.tasks if task.prompt not in seen][:problems]
    finally:
        train.close()
        other.close()


def held_out_accuracy(
    model: Any, tokenizer: Any, env: str, env_kwargs: dict[str, Any], tasks: list[Any], max_new_tokens: int
) -> float:
    """Greedy one-turn success rate on `tasks`, graded by the env (NaN without tasks)."""
    if not tasks:
        return math.nan
    from trace_gym.policies.hf import HFPolicy
    from trace_gym.rollout import Job, RolloutRunner, SamplingParams

    policy = HFPolicy(model, tokenizer, max_batch_size=8)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    one_turn = {**env_kwargs, "max_turns": 1}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), RolloutRunner(env, policy, sampling=greedy, env_kwargs=one_turn) as runner:
            trees = runner.run([Job(task, 1) for task in tasks])
    finally:
        model.train(was_training)
    return float(np.mean([leaf.reward > 0 for tree in trees for leaf in tree.leaves()]))


def run(
    name: str,
    seed: int,
    args: argparse.Namespace,
    env: str,
    env_kwargs: dict[str, Any],
    held_out: list[Any],
) -> tuple[list[dict[str, float]], dict[str, float]]:
    model: Any
    tokenizer: Any
    if args.model == "tiny":  # a smoke test of the script itself
        from trace_gym.policies.tiny import make_tiny_model

        model, tokenizer = make_tiny_model(seed=seed)
    else:
        from trace_gym.policies.smollm2 import load_smollm2

        model, tokenizer = load_smollm2()
    evaluation = {
        "before": held_out_accuracy(model, tokenizer, env, env_kwargs, held_out, args.max_new_tokens)
    }
    with tempfile.TemporaryDirectory() as out:
        config = TreeGRPOConfig(
            output_dir=out,
            env_id=env,
            env_kwargs=env_kwargs,
            max_steps=args.steps,
            roots=args.roots,
            continuations_per_root=args.continuations,
            max_per_prompt=args.group_size,
            candidates=args.candidates,
            max_completion_length=args.max_new_tokens,
            temperature=args.temperature,
            learning_rate=args.lr,
            loss_type="dapo",
            beta=0.0,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=args.grad_accum,
            num_generations=2,
            gradient_checkpointing=False,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            seed=seed,
        )
        trainer = TreeGRPOTrainer(
            model, config, make_sampler(name, seed, args.group_size), processing_class=tokenizer
        )
        trainer.remove_callback(PrinterCallback)  # the table below says it once
        args.output.parent.mkdir(parents=True, exist_ok=True)
        trainer.add_callback(StepLog(args.output.with_suffix(".steps.jsonl"), f"seed {seed} {name}"))
        trainer.train()
    evaluation["after"] = held_out_accuracy(model, tokenizer, env, env_kwargs, held_out, args.max_new_tokens)
    keys = (
        "reward",
        "effective_ratio",
        "ledger/rollouts",
        "ledger/turns",
        "ledger/generated_tokens",
        "step_time",
    )
    steps = [
        {k: float(log.get(k, math.nan)) for k in keys} for log in trainer.state.log_history if "reward" in log
    ]
    return steps, evaluation


def evaluation_lines(evaluations: dict[str, dict[int, dict[str, float]]], problems: int) -> list[str]:
    return [
        f"{name} seed {seed}: held-out greedy accuracy {e['before']:.3f} before, {e['after']:.3f} after "
        f"({problems} problems)"
        for name, by_seed in evaluations.items()
        for seed, e in by_seed.items()
        if not math.isnan(e["before"])
    ]


def table(results: dict[str, dict[int, list[dict[str, float]]]], steps: int) -> str:
    names = list(results)
    header = "step  " + "  ".join(f"{n + ' reward':>15} {n + ' eff.ratio':>18}" for n in names)
    lines = [header, "-" * len(header)]
    for step in range(steps):
        cells = []
        for n in names:
            reward = np.mean([runs[step]["reward"] for runs in results[n].values()])
            ratio = np.mean([runs[step]["effective_ratio"] for runs in results[n].values()])
            cells.append(f"{reward:>15.3f} {ratio:>18.3f}")
        lines.append(f"{step + 1:>4}  " + "  ".join(cells))
    for n in names:
        runs = [s for r in results[n].values() for s in r]
        lines.append(
            f"{n}: {sum(s['ledger/rollouts'] for s in runs):.0f} rollouts, {sum(s['ledger/turns'] for s in runs):.0f} "
            f"turns, {sum(s['ledger/generated_tokens'] for s in runs):.0f} generated tokens, "
            f"{np.mean([s['step_time'] for s in runs]):.0f} s per step"
        )
    return "\n".join(lines)


def plot(results: dict[str, dict[int, list[dict[str, float]]]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, (name, by_seed) in enumerate(results.items()):
        for ax, key in zip(axes, ("reward", "effective_ratio"), strict=True):
            per_seed = np.array([[s[key] for s in runs] for runs in by_seed.values()])
            x = np.arange(1, per_seed.shape[1] + 1)
            for row in per_seed:
                ax.plot(x, row, color=f"C{i}", alpha=0.3, linewidth=1)
            ax.plot(x, per_seed.mean(axis=0), color=f"C{i}", marker="o", label=f"{name} (mean of seeds)")
            ax.set_xticks(x)
    axes[0].set(xlabel="step", ylabel="mean training reward", title="Reward per step")
    axes[1].set(xlabel="step", ylabel="effective ratio", title="Effective ratio per step")
    for ax in axes:
        ax.set_ylim(-0.05, 1.05)
        ax.legend(fontsize=8)
    fig.suptitle(textwrap.fill(title, 150), fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def merge(paths: list[Path], output: Path, title: str = "") -> int:
    """Combine runs of the same configuration split by seed (a results or a .partial.json file each)."""
    results: dict[str, dict[int, list[dict[str, float]]]] = {}
    evaluations: dict[str, dict[int, dict[str, float]]] = {}
    problems = 0
    for path in paths:
        data = json.loads(path.read_text(encoding="utf-8"))
        title = data.get("title", title)
        problems = data.get("held_out_problems", problems)
        for name, by_seed in data.get("held_out", {}).items():
            for seed, e in by_seed.items():
                evaluations.setdefault(name, {})[int(seed)] = e
        for name, by_seed in data.get("results", data).items():
            for seed, runs in by_seed.items():
                results.setdefault(name, {})[int(seed)] = runs
    steps = min(len(runs) for by_seed in results.values() for runs in by_seed.values())
    seeds = sorted({seed for by_seed in results.values() for seed in by_seed})
    title = title.rsplit(", seeds", 1)[0] + f", seeds {seeds}"
    print(title)
    print(table(results, steps))
    print("\n".join(evaluation_lines(evaluations, problems)))
    body = {"title": title, "results": results, "held_out": evaluations, "held_out_problems": problems}
    output.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    plot(results, title, output.with_suffix(".png"))
    print(f"wrote {output} and {output.with_suffix('.png')}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--samplers", default="uniform,trace")
    parser.add_argument("--roots", type=int, default=4, help="M")
    parser.add_argument("--continuations", type=int, default=1, help="N")
    parser.add_argument("--group-size", type=int, default=4, help="G of uniform (and Mmax)")
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--grad-accum", type=int, default=4, help="micro-batches per step (bounds memory)")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--eval-problems",
        type=int,
        default=32,
        help="held-out MathPython problems solved greedily before and after training (0: none)",
    )
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "train_curve.json")
    parser.add_argument(
        "--merge", type=Path, nargs="+", help="only combine the results files of runs split by seed"
    )
    parser.add_argument("--title", default="", help="plot title for --merge of partial files")
    args = parser.parse_args()
    if args.merge:
        return merge(args.merge, args.output, args.title)
    torch.set_num_threads(args.threads)
    env, env_kwargs = pick_env()
    seeds = [int(s) for s in args.seeds.split(",")]
    names = args.samplers.split(",")
    results: dict[str, dict[int, list[dict[str, float]]]] = {n: {} for n in names}
    evaluations: dict[str, dict[int, dict[str, float]]] = {n: {} for n in names}
    held_out = held_out_tasks(env, env_kwargs, args.eval_problems)
    start = time.perf_counter()
    for seed in seeds:
        for name in names:
            t0 = time.perf_counter()
            results[name][seed], evaluations[name][seed] = run(name, seed, args, env, env_kwargs, held_out)
            print(f"seed {seed} {name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
            partial = args.output.with_suffix(".partial.json")
            partial.parent.mkdir(parents=True, exist_ok=True)
            body = {"results": results, "held_out": evaluations, "held_out_problems": len(held_out)}
            partial.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    total = args.roots * (1 + args.continuations)
    title = (
        f"{'SmolLM2-135M-Instruct' if args.model == 'smollm2' else 'tiny random model'} on {env} {env_kwargs}: M={args.roots}, N={args.continuations}, "
        f"{total} rollouts/step, {args.max_new_tokens} tokens/turn, temperature {args.temperature}, lr {args.lr}, seeds {seeds}"
    )
    print(title)
    print(table(results, args.steps))
    print("\n".join(evaluation_lines(evaluations, len(held_out))))
    print(f"total wall time {time.perf_counter() - start:.0f} s")
    print("reproduce: python " + " ".join(sys.argv))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps(
            {
                "title": title,
                "env": env,
                "env_kwargs": env_kwargs,
                "results": results,
                "held_out": evaluations,
                "held_out_problems": len(held_out),
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    png = args.output.with_suffix(".png")
    plot(results, title, png)
    print(f"wrote {args.output} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
