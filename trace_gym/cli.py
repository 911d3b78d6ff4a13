"""The `trace-gym` command: `compare` (the main job), `envs` and `tasks`."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium

from trace_gym.budget import Budget
from trace_gym.compare import CompareConfig, format_table, run_comparison
from trace_gym.env import BranchableEnv
from trace_gym.errors import TraceGymError
from trace_gym.policies.base import Policy
from trace_gym.policies.simulated import SimulatedPolicy
from trace_gym.registration import registered_env_ids
from trace_gym.samplers.base import Sampler
from trace_gym.samplers.uniform import UniformSampler

SAMPLERS: dict[str, Callable[[argparse.Namespace], Sampler]] = {
    "uniform": lambda args: UniformSampler(args.group_size),
}
POLICIES: dict[str, Callable[[argparse.Namespace], Policy]] = {
    "simulated": lambda args: SimulatedPolicy(),
}


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"expected a JSON object like '{{\"num_tasks\": 100}}', got {text!r}"
        )
    return value


def _names(choices: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown {unknown or text!r}; choose from {', '.join(choices)}")
        return names

    return parse


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `trace-gym`."""
    parser = argparse.ArgumentParser(
        prog="trace-gym",
        description="Rollout-budget allocation for agentic RL: compare strategies at equal cost.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    compare = sub.add_parser("compare", help="compare samplers at equal rollout budget")
    compare.add_argument("--env", default="trace_gym/SyntheticTree-v0", help="gymnasium env id")
    compare.add_argument("--env-kwargs", type=_json_object, default={}, help="JSON object of env kwargs")
    compare.add_argument("--policy", choices=sorted(POLICIES), default="simulated", help="generation backend")
    compare.add_argument(
        "--samplers", type=_names(sorted(SAMPLERS)), default=sorted(SAMPLERS),
        help=f"comma-separated samplers (default: all of {', '.join(sorted(SAMPLERS))})",
    )  # fmt: skip
    compare.add_argument("--steps", type=int, default=10, help="sampling steps per sampler")
    compare.add_argument("--roots", type=int, default=256, help="M: root rollouts per step")
    compare.add_argument("--continuations", type=int, default=1, help="N: continuations per root rollout")
    compare.add_argument("--max-per-prompt", type=int, default=8, help="Mmax: most root rollouts per prompt")
    compare.add_argument("--candidates", type=int, default=256, help="candidate prompts per step")
    compare.add_argument("--min-group", type=int, default=2, help="fewest root rollouts of an active prompt")
    compare.add_argument("--group-size", type=int, default=8, help="G of the uniform sampler")
    compare.add_argument("--seed", type=int, default=0)
    compare.add_argument("--out", type=Path, default=None, help="folder for summary.json and trees-*.jsonl")
    compare.add_argument("--quiet", action="store_true", help="no progress bar")

    sub.add_parser("envs", help="list the registered trace_gym envs")

    tasks = sub.add_parser("tasks", help="list an env's task ids")
    tasks.add_argument("env", help="gymnasium env id, e.g. trace_gym/SyntheticTree-v0")
    tasks.add_argument("--env-kwargs", type=_json_object, default={})
    tasks.add_argument("--limit", type=int, default=None, help="show at most this many")
    return parser


def _compare(args: argparse.Namespace) -> int:
    budget = Budget(args.roots, args.continuations, args.max_per_prompt, args.candidates, args.min_group)
    config = CompareConfig(args.env, args.env_kwargs, args.steps, budget, args.seed)
    samplers = [SAMPLERS[name](args) for name in args.samplers]
    results = run_comparison(
        config,
        samplers,
        lambda: POLICIES[args.policy](args),
        out=args.out,
        progress=False if args.quiet else None,
    )
    print(
        f"{config.env}: {config.steps} steps, M={budget.roots}, N={budget.continuations_per_root}, "
        f"Mmax={budget.max_per_prompt}, {budget.candidates} candidates, "
        f"{budget.total} rollouts per step per sampler, policy {args.policy}"
    )
    print(format_table(results))
    if args.out is not None:
        print(f"wrote {args.out / 'summary.json'} and trees-*.jsonl")
    return 0


def _envs(args: argparse.Namespace) -> int:
    for env_id in registered_env_ids():
        print(env_id)
    return 0


def _tasks(args: argparse.Namespace) -> int:
    env = gymnasium.make(args.env, **args.env_kwargs)
    base = env.unwrapped
    if not isinstance(base, BranchableEnv):
        print(f"error: {args.env} is not a trace_gym BranchableEnv", file=sys.stderr)
        return 2
    ids = base.task_ids
    for task_id in ids[: args.limit]:
        print(task_id)
    if args.limit is not None and len(ids) > args.limit:
        print(f"... {len(ids) - args.limit} more ({len(ids)} tasks)", file=sys.stderr)
    env.close()
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "compare": _compare,
    "envs": _envs,
    "tasks": _tasks,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `trace-gym` console script."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (TraceGymError, gymnasium.error.Error) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: {shlex.join(sys.argv)}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
