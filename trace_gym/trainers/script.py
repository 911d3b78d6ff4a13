"""`trace-gym train`: TRL's convention of dataclass configs, a YAML file and flag overrides.

    trace-gym train --config examples/train_smollm2_cpu.yaml --max_steps 4 --sampler uniform

Every `TreeGRPOConfig` field (TRL's `GRPOConfig` and the transformers `TrainingArguments`
included) and every `TrainScriptArguments` field is a flag with the field's name; the YAML
file sets defaults and the flags given win (`trl.TrlParser`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trace_gym.compare import SAMPLER_NAMES, build_sampler
from trace_gym.errors import ConfigError
from trace_gym.trainers.tree_grpo import TreeGRPOConfig, TreeGRPOTrainer

if TYPE_CHECKING:
    from trace_gym.policies.base import Policy

__all__ = ["TrainScriptArguments", "build_trainer", "train_main"]


@dataclass
class TrainScriptArguments:
    """What `trace-gym train` builds around the trainer."""

    model: str = field(
        default="smollm2",
        metadata={
            "help": "'smollm2' (the embedded SmolLM2-135M-Instruct), 'tiny' (a random test model), or a "
            "local folder / cached hub id of a causal LM with a chat template."
        },
    )
    sampler: str = field(
        default="trace", metadata={"help": "Allocation strategy.", "choices": list(SAMPLER_NAMES)}
    )
    group_size: int = field(default=8, metadata={"help": "G of the uniform, PCL and TreePO samplers."})
    scope: str = field(
        default="per_prompt",
        metadata={"help": "TRACE's Stage 2 budget scope.", "choices": ["per_prompt", "global"]},
    )
    generation: str = field(
        default="hf",
        metadata={
            "help": "'hf': sample with the trainer's own model (transformers); 'vllm': a colocated vLLM "
            "engine (VLLMPolicy) that receives the new weights before every step; 'vllm-server': a "
            "`vllm serve` server at vllm_server_base_url (or vllm_server_host:vllm_server_port), started "
            "with VLLM_SERVER_DEV_MODE=1, that reloads the new weights from vllm_weights_dir before "
            "every step (VLLMServerPolicy).",
            "choices": ["hf", "vllm", "vllm-server"],
        },
    )
    served_model_name: str | None = field(
        default=None,
        metadata={"help": "The model name the vLLM server serves (default: the model argument)."},
    )
    vllm_weights_dir: str | None = field(
        default=None,
        metadata={
            "help": "Folder the trainer writes each step's weights to for the vLLM server to reload "
            "(default: <output_dir>/vllm_weights); the server must read it under the same path."
        },
    )
    summary: str | None = field(default=None, metadata={"help": "Write the final summary as JSON here."})


def _load_model(name: str, dtype: Any = None) -> tuple[Any, Any]:
    if name == "smollm2":
        from trace_gym.policies.smollm2 import load_smollm2

        return load_smollm2(dtype=dtype)
    if name == "tiny":
        from trace_gym.policies.tiny import make_tiny_model

        return make_tiny_model(seed=0)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
    except OSError as exc:
        raise ConfigError(
            f"Cannot load model {name!r}: {exc}. Pass 'smollm2', 'tiny' or a model folder."
        ) from exc
    return model, tokenizer


def _vllm_policy(script: TrainScriptArguments, config: TreeGRPOConfig) -> Policy:
    from trace_gym.policies.vllm import VLLMPolicy

    if script.model in ("smollm2", "tiny"):
        raise ConfigError(
            "generation='vllm' needs a model folder or hub id vLLM can load; the embedded models are "
            "for the 'hf' generation."
        )
    return VLLMPolicy(
        script.model,
        seed=config.seed,
        gpu_memory_utilization=config.vllm_gpu_memory_utilization,
        max_model_len=config.vllm_max_model_length,
    )


def _vllm_server_policy(script: TrainScriptArguments, config: TreeGRPOConfig) -> Policy:
    from trace_gym.policies.vllm_server import VLLMServerPolicy

    url = config.vllm_server_base_url or f"http://{config.vllm_server_host}:{config.vllm_server_port}"
    if not url.rstrip("/").endswith("/v1"):
        url = url.rstrip("/") + "/v1"
    weights = script.vllm_weights_dir or str(Path(config.output_dir or ".") / "vllm_weights")
    return VLLMServerPolicy(
        url,
        script.served_model_name or script.model,
        weights_dir=weights,
        timeout=config.vllm_server_timeout,
    )


def build_trainer(script: TrainScriptArguments, config: TreeGRPOConfig) -> TreeGRPOTrainer:
    """The model, sampler and trainer a parsed command line describes."""
    if config.use_vllm:
        raise ConfigError(
            "use_vllm starts TRL's own vLLM engine, which generates without the env. Set use_vllm=false "
            "and generation=vllm (a colocated VLLMPolicy) or generation=vllm-server (VLLMServerPolicy): "
            "they sample the trees through the env and get the trainer's weights each step."
        )
    model, tokenizer = _load_model(script.model)
    sampler = build_sampler(script.sampler, config.seed, script.group_size, script.scope)  # type: ignore[arg-type]
    policy: Policy | None = None
    if script.generation == "vllm":
        policy = _vllm_policy(script, config)
    elif script.generation == "vllm-server":
        policy = _vllm_server_policy(script, config)
    return TreeGRPOTrainer(model, config, sampler, processing_class=tokenizer, policy=policy)


def summarise(trainer: TreeGRPOTrainer, seconds: float) -> dict[str, Any]:
    """The run's totals and its per-step reward and effective ratio."""
    steps = [log for log in trainer.state.log_history if "reward" in log and "train_runtime" not in log]
    total = trainer.ledger.total()
    rewards = [float(s["reward"]) for s in steps]
    ratios = [float(s["effective_ratio"]) for s in steps]
    return {
        "steps": trainer.state.global_step,
        "sampler": trainer.sampler.name,
        "rollouts": total.rollouts,
        "turns": total.turns,
        "generated_tokens": total.generated_tokens,
        "prompt_tokens": total.prompt_tokens,
        "reward_per_logged_step": rewards,
        "effective_ratio_per_logged_step": ratios,
        "reward_first": rewards[0] if rewards else math.nan,
        "reward_last": rewards[-1] if rewards else math.nan,
        "effective_ratio_mean": sum(ratios) / len(ratios) if ratios else math.nan,
        "wall_seconds": seconds,
        "output_dir": trainer.args.output_dir,
    }


def train_main(argv: Sequence[str]) -> int:
    """Parse `argv` (everything after `train`), train, and print a summary."""
    from trl.scripts.utils import TrlParser

    types: list[Any] = [TrainScriptArguments, TreeGRPOConfig]
    parser = TrlParser(types, prog="trace-gym train")
    try:
        script, config = parser.parse_args_and_config(list(argv))
    except ValueError as exc:  # TrlParser reports a bad config file this way
        raise ConfigError(str(exc)) from None
    trainer = build_trainer(script, config)
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    summary = summarise(trainer, time.perf_counter() - start)
    print(
        f"trained {summary['steps']} steps with sampler {summary['sampler']} on {config.env_id}: "
        f"{summary['rollouts']} rollouts, {summary['turns']} turns, {summary['generated_tokens']} generated "
        f"tokens in {summary['wall_seconds']:.0f} s; reward {summary['reward_first']:.3f} (first step) -> "
        f"{summary['reward_last']:.3f} (last step), mean effective ratio "
        f"{summary['effective_ratio_mean']:.3f}; "
        f"checkpoints and logs in {summary['output_dir']}"
    )
    if script.summary is not None:
        path = Path(script.summary)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {path}")
    return 0
