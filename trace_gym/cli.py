"""The `trace-gym` command: `compare` (the main job), `train`, `envs` and `tasks`."""

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
from trace_gym.compare import (
    SAMPLER_NAMES,
    CompareConfig,
    build_sampler,
    format_table,
    run_comparison,
    write_plot,
    write_summary,
)
from trace_gym.env import BranchableEnv
from trace_gym.errors import ConfigError, MissingDependencyError, TraceGymError
from trace_gym.policies.base import Policy
from trace_gym.policies.simulated import SimulatedPolicy
from trace_gym.predictors import OraclePredictor
from trace_gym.registration import registered_env_ids
from trace_gym.rollout import SamplingParams


def _smollm2(args: argparse.Namespace) -> Policy:
    from trace_gym.policies.hf import HFPolicy
    from trace_gym.policies.smollm2 import load_smollm2

    model, tokenizer = load_smollm2()
    return HFPolicy(model, tokenizer)


POLICIES: dict[str, Callable[[argparse.Namespace], Policy]] = {
    "simulated": lambda args: SimulatedPolicy(),
    "smollm2": _smollm2,
}
COMPARE_DEFAULTS: dict[str, Any] = {
    "env": "trace_gym/SyntheticTree-v0",
    "env_kwargs": {},
    "policy": "simulated",
    "samplers": list(SAMPLER_NAMES),
    "steps": 8,
    "seeds": [0, 1],
    "warmup": 3,
    "roots": 256,
    "continuations": 1,
    "max_per_prompt": 8,
    "candidates": 512,
    "min_group": 2,
    "group_size": 8,
    "scope": "per_prompt",
    "output": None,
    "plot": None,
    "trees": None,
    "max_new_tokens": 256,
    "temperature": 1.0,
    "quiet": False,
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


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SAMPLER_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown {unknown or text!r}; choose from {', '.join(SAMPLER_NAMES)}"
        )
    return names


def _seeds(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers like 0,1,2, got {text!r}"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `trace-gym`."""
    parser = argparse.ArgumentParser(
        prog="trace-gym",
        description="Rollout-budget allocation for agentic RL: compare strategies at equal cost.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    compare = sub.add_parser(
        "compare",
        help="compare samplers at equal rollout budget",
        description="Run every sampler on the same candidate pools at the same budget and "
        "print a table; flags override the values of --config.",
    )
    compare.add_argument("--config", type=Path, default=None, help="YAML file with any of the options below")
    compare.add_argument("--env", help="gymnasium env id (default %(default)s)")
    compare.add_argument("--env-kwargs", type=_json_object, help="JSON object of env kwargs")
    compare.add_argument("--policy", choices=sorted(POLICIES), help="generation backend")
    compare.add_argument(
        "--samplers", type=_names, help=f"comma-separated, from {','.join(SAMPLER_NAMES)} (default: all)"
    )
    compare.add_argument("--steps", type=int, help="sampling steps per sampler and seed (default 8)")
    compare.add_argument("--seeds", type=_seeds, help="comma-separated seeds, one run each (default 0,1)")
    compare.add_argument("--warmup", type=int, help="first steps left out of the summary (default 3)")
    compare.add_argument("--roots", type=int, help="M: root rollouts per step (default 256)")
    compare.add_argument("--continuations", type=int, help="N: continuations per root rollout (default 1)")
    compare.add_argument("--max-per-prompt", type=int, help="Mmax: most root rollouts per prompt (default 8)")
    compare.add_argument("--candidates", type=int, help="candidate prompts per step (default 512)")
    compare.add_argument("--min-group", type=int, help="fewest root rollouts of an active prompt (default 2)")
    compare.add_argument("--group-size", type=int, help="G of uniform, PCL and TreePO (default 8)")
    compare.add_argument("--scope", choices=["per_prompt", "global"], help="TRACE's Stage 2 budget scope")
    compare.add_argument("--max-new-tokens", type=int, help="cap on generated tokens per turn (default 256)")
    compare.add_argument("--temperature", type=float, help="sampling temperature (default 1.0)")
    compare.add_argument("--output", type=Path, help="write the summary as JSON to this path")
    compare.add_argument("--plot", type=Path, help="PNG path (default: --output with .png, else compare.png)")
    compare.add_argument("--trees", type=Path, help="folder for each sampler's trees as JSON lines")
    compare.add_argument("--quiet", action="store_true", default=None, help="no progress bar")

    sub.add_parser(
        "train",
        add_help=False,  # `trace-gym train --help` lists TreeGRPOConfig's flags (TrlParser)
        help="tree-GRPO training on sampled trees (needs the train extra); see `trace-gym train --help`",
        description="TreeGRPOTrainer with a YAML --config and flag overrides.",
    )

    sub.add_parser("envs", help="list the registered trace_gym envs")

    tasks = sub.add_parser("tasks", help="list an env's task ids")
    tasks.add_argument("env", help="gymnasium env id, e.g. trace_gym/SyntheticTree-v0")
    tasks.add_argument("--env-kwargs", type=_json_object, default={})
    tasks.add_argument("--limit", type=int, default=None, help="show at most this many")
    return parser


def compare_options(args: argparse.Namespace) -> argparse.Namespace:
    """Defaults, then the YAML file of --config, then the flags given.

    `samplers_chosen` says whether the samplers were named (not the default set).
    """
    options = dict(COMPARE_DEFAULTS)
    from_file = _read_config(args.config) if args.config is not None else {}
    options.update(from_file)
    options.update({k: v for k, v in vars(args).items() if k in COMPARE_DEFAULTS and v is not None})
    options["samplers_chosen"] = args.samplers is not None or "samplers" in from_file
    for key in ("output", "plot", "trees"):
        if options[key] is not None:
            options[key] = Path(options[key])
    return argparse.Namespace(**options)


def _read_config(path: Path) -> dict[str, Any]:
    try:
        import yaml
    except ImportError:
        raise MissingDependencyError("pyyaml", "compare", "Reading --config files") from None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError(f"Cannot read --config {path}: {exc.strerror}.") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path} must hold a mapping of options, got {type(data).__name__}.")
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    unknown = sorted(set(data) - set(COMPARE_DEFAULTS))
    if unknown:
        raise ConfigError(
            f"--config {path} has unknown options {unknown}; valid ones are {sorted(COMPARE_DEFAULTS)}."
        )
    if isinstance(data.get("samplers"), str):
        data["samplers"] = _names(data["samplers"])
    if isinstance(data.get("seeds"), (int, str)):
        data["seeds"] = _seeds(str(data["seeds"]))
    return data


def _oracle_available(env_id: str, env_kwargs: dict[str, Any]) -> bool:
    env = gymnasium.make(env_id, **env_kwargs)
    try:
        base = env.unwrapped
        if not isinstance(base, BranchableEnv):
            return False
        OraclePredictor().predict(base.tasks[:1])
        return True
    except ConfigError:
        return False
    finally:
        env.close()


def _compare(raw: argparse.Namespace) -> int:
    args = compare_options(raw)
    budget = Budget(args.roots, args.continuations, args.max_per_prompt, args.candidates, args.min_group)
    sampling = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    config = CompareConfig(
        args.env, args.env_kwargs, args.steps, tuple(args.seeds), args.warmup, budget, sampling
    )
    names = list(args.samplers)
    if "trace_oracle" in names and not _oracle_available(args.env, args.env_kwargs):
        if args.samplers_chosen:
            raise ConfigError(f"trace_oracle needs an env that exposes true values; {args.env} does not.")
        names.remove("trace_oracle")
        print(f"note: {args.env} exposes no true values; skipping trace_oracle", file=sys.stderr)
    for name in names:  # fail on a bad configuration before any rollout
        build_sampler(name, 0, args.group_size, args.scope)
    policy = POLICIES[args.policy](args)  # one instance serves every runner
    results = run_comparison(
        config,
        lambda seed: [build_sampler(name, seed, args.group_size, args.scope) for name in names],
        lambda: policy,
        trees_dir=args.trees,
        progress=False if args.quiet else None,
    )
    print(
        f"{config.env} with policy {args.policy}: {config.steps} steps x seeds {list(config.seeds)}, "
        f"M={budget.roots}, N={budget.continuations_per_root}, Mmax={budget.max_per_prompt}, "
        f"{budget.candidates} candidates, {budget.total} rollouts per step per sampler; "
        f"means over steps {config.warmup + 1}-{config.steps}"
    )
    print(format_table(config, results))
    plot = args.plot or (args.output.with_suffix(".png") if args.output else Path("compare.png"))
    write_plot(config, results, plot)
    print(f"wrote {plot}")
    if args.output is not None:
        write_summary(config, results, args.output)
        print(f"wrote {args.output}")
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


def _train(args: argparse.Namespace) -> int:
    try:
        from trace_gym.trainers.script import train_main
    except ImportError as exc:
        raise MissingDependencyError(exc.name or "trl", "train", "trace-gym train") from None
    return train_main(args.train_args)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "compare": _compare,
    "train": _train,
    "envs": _envs,
    "tasks": _tasks,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `trace-gym` console script."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "train":
        args.train_args = extra  # parsed by the trainer's own dataclass parser
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
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
