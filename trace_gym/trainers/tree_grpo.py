"""TreeGRPOTrainer: GRPO on the rollout trees a Sampler grows (DESIGN section 10).

TRL's `GRPOTrainer` does everything but the sampling: the loss and its variants
(`loss_type`), the KL penalty against a reference model (`beta`), logging, callbacks,
gradient accumulation and checkpointing. This subclass replaces where completions come
from: each optimizer step, a `Sampler` spends one `Budget` of rollouts on a candidate
pool of tasks, the trees become one row per generated turn (`rows.turn_rows`), and a
tree estimator from `trace_gym.advantages` gives each row its advantage.

Overridden TRL methods, each kept small:

- `_generate_and_score_completions` (sampling, rows and advantages instead of
  `generate` plus reward functions; the output dict has TRL's keys);
- `_prepare_inputs` (the same buffering, but a step's rows are split into
  `steps_per_generation` nearly equal parts, since their number varies per step);
- `_save_checkpoint` / `_load_optimizer_and_scheduler` (the sampler's and predictor's
  state, the rollout seed stream and the candidate RNG travel with each checkpoint,
  the way TRL saves its adaptive-entropy state).
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import gymnasium
import numpy as np

from trace_gym.advantages import ESTIMATORS, TreeEstimator
from trace_gym.budget import Budget, Ledger
from trace_gym.env import BranchableEnv, snapshot
from trace_gym.errors import BudgetError, ConfigError, MissingDependencyError, TraceGymError
from trace_gym.metrics import effective_ratio, prediction_calibration
from trace_gym.policies.base import Policy
from trace_gym.rollout import EnvFactory, RolloutRunner, SamplingParams
from trace_gym.samplers.base import SampleBatch, Sampler, group_count
from trace_gym.seeding import mix
from trace_gym.trainers.rows import turn_rows
from trace_gym.types import Task

try:
    import torch
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer
    from trl.trainer.utils import pad, shuffle_sequence_dict
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingDependencyError(exc.name or "trl", "train", "TreeGRPOTrainer") from exc

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback

__all__ = ["STATE_FILE", "TreeGRPOConfig", "TreeGRPOTrainer"]

STATE_FILE = "trace_gym_state.pkl"
"""The file in each checkpoint folder holding the sampler's, predictor's and runner's state."""


@dataclass
class TreeGRPOConfig(GRPOConfig):
    """`GRPOConfig` plus where rollouts come from and how advantages are computed.

    TRL's fields keep their meaning, with these readings: `temperature`, `top_p` and
    `max_completion_length` (tokens per turn) are the sampling settings of every turn;
    `max_steps` is the number of sampling steps (one per optimizer step); `seed` also
    seeds the rollouts and the candidate pools. `num_generations` and
    `per_device_train_batch_size` only size TRL's placeholder prompt batches: the rows
    of a step are whatever the budget produced, split into `steps_per_generation` parts.
    """

    env_id: str = field(
        default="trace_gym/SyntheticTree-v0", metadata={"help": "Gymnasium id of a trace_gym branchable env."}
    )
    env_kwargs: dict[str, Any] | str | None = field(
        default=None, metadata={"help": "Keyword arguments for gymnasium.make (a JSON string on the CLI)."}
    )
    roots: int = field(default=8, metadata={"help": "M: root rollouts per step."})
    continuations_per_root: int = field(default=1, metadata={"help": "N: continuations per root rollout."})
    max_per_prompt: int = field(default=8, metadata={"help": "Mmax: most root rollouts one prompt may get."})
    candidates: int = field(default=16, metadata={"help": "Candidate prompts drawn per step."})
    min_group: int = field(default=2, metadata={"help": "Fewest root rollouts an active prompt gets."})
    advantage: str = field(
        default="tree_grpo",
        metadata={"help": "Advantage estimator.", "choices": sorted(ESTIMATORS)},
    )
    advantage_scale: bool = field(
        default=True, metadata={"help": "Divide by the group's std + 1e-4 (GRPO); False: Dr. GRPO."}
    )

    def __post_init__(self) -> None:
        if self.bf16 is None and not torch.cuda.is_available():
            self.bf16 = False  # TRL defaults to bf16, which a CPU run does not want
        if isinstance(self.env_kwargs, str):
            import json

            self.env_kwargs = json.loads(self.env_kwargs)
        super().__post_init__()  # type: ignore[no-untyped-call]
        if self.advantage not in ESTIMATORS:
            raise ConfigError(f"advantage must be one of {sorted(ESTIMATORS)}, got {self.advantage!r}.")
        if self.max_steps is None or self.max_steps <= 0:
            raise ConfigError(
                f"max_steps must be > 0 (got {self.max_steps}): the trainer samples fresh trees every "
                "step, so there is no epoch to count; set max_steps to the number of sampling steps."
            )
        self.budget  # noqa: B018 (validates M, N, Mmax and the pool now, with BudgetError's advice)

    @property
    def budget(self) -> Budget:
        """The rollout budget of one step."""
        return Budget(
            self.roots, self.continuations_per_root, self.max_per_prompt, self.candidates, self.min_group
        )


def _placeholder_rows(args: TreeGRPOConfig) -> int:
    """Prompts of TRL's placeholder dataset: one generation batch's worth."""
    return int(args.generation_batch_size or 1) // int(args.num_generations or 1)


def _turn_tokens(args: TreeGRPOConfig) -> int:
    """Tokens per generated turn (`max_completion_length`)."""
    if args.max_completion_length is None:
        raise ConfigError("max_completion_length must be set: it caps the tokens of every generated turn.")
    return int(args.max_completion_length)


def _env_kwargs(args: TreeGRPOConfig) -> dict[str, Any]:
    if isinstance(args.env_kwargs, str):  # parsed in __post_init__; kept for type narrowing
        raise ConfigError(f"env_kwargs must be a mapping, got the string {args.env_kwargs!r}.")
    return dict(args.env_kwargs or {})


def _never_called(*args: Any, **kwargs: Any) -> list[float | None]:
    raise AssertionError("TreeGRPOTrainer scores rollouts with the env's rewards, not reward functions.")


class TreeGRPOTrainer(GRPOTrainer):
    """GRPO on rollout trees: a `Sampler` decides where each step's rollouts go.

    Args:
        model: The policy model (or a hub id / path TRL can load).
        args: The configuration.
        sampler: The allocation strategy (`UniformSampler`, `PCLSampler`,
            `TreePOSampler`, `TraceSampler`, ...); its predictor, if any, is part of it.
        processing_class: The tokenizer (it needs a chat template).
        tasks: The task source each step's candidates are drawn from (default: the env's tasks).
        env: A zero-argument env factory to use instead of `args.env_id`.
        policy: The generation backend (default: `HFPolicy` on the trainer's own model,
            so every step samples from the current weights).
        advantage: A tree estimator to use instead of `args.advantage`.
        callbacks: TRL / transformers callbacks.
        **kwargs: Passed to `GRPOTrainer` (optimizers, peft_config, eval_dataset).

    Example:
        >>> from trace_gym.policies import make_tiny_model
        >>> from trace_gym.samplers import UniformSampler
        >>> model, tokenizer = make_tiny_model()
        >>> args = TreeGRPOConfig("out", max_steps=1, roots=4, continuations_per_root=0,
        ...     candidates=2, max_completion_length=8, report_to="none",
        ...     env_kwargs={"num_tasks": 4, "min_steps": 1, "max_steps": 1, "extra_turns": 0})
        >>> trainer = TreeGRPOTrainer(model, args, UniformSampler(2), processing_class=tokenizer)
        >>> trainer.train().global_step  # TRL prints the step's metrics first  # doctest: +ELLIPSIS
        {'train_runtime': ...}
        1
    """

    args: TreeGRPOConfig
    model: Any
    _metrics: Any
    _logs: Any
    _buffered_inputs: Any

    def __init__(
        self,
        model: str | PreTrainedModel,
        args: TreeGRPOConfig,
        sampler: Sampler,
        *,
        processing_class: PreTrainedTokenizerBase | None = None,
        tasks: Sequence[Task] | None = None,
        env: EnvFactory | None = None,
        policy: Policy | None = None,
        advantage: TreeEstimator | None = None,
        callbacks: list[TrainerCallback] | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(args, TreeGRPOConfig):
            raise ConfigError(f"args must be a TreeGRPOConfig, got {type(args).__name__}.")
        if not isinstance(sampler, Sampler):
            raise ConfigError(
                f"sampler must be a trace_gym Sampler object (e.g. UniformSampler(8)), got {sampler!r}."
            )
        if processing_class is not None:
            _check_chat_template(processing_class)
        self.sampler = sampler
        self.budget = args.budget
        self.advantage_fn: TreeEstimator = advantage or ESTIMATORS[args.advantage]
        env_source: str | EnvFactory = env if env is not None else args.env_id
        self._env_source = env_source
        tasks = _check_env(env_source, args, tasks)
        _check_budget(sampler, args, len(tasks))
        self.tasks: Sequence[Task] = tasks
        from datasets import Dataset  # type: ignore[import-untyped]

        placeholder = Dataset.from_dict(
            {"prompt": [[{"role": "user", "content": ""}]] * _placeholder_rows(args)}
        )
        super().__init__(
            model,
            reward_funcs=_never_called,
            args=args,
            train_dataset=placeholder,
            processing_class=processing_class,
            callbacks=callbacks,
            **kwargs,
        )
        _check_chat_template(self._tokenizer)
        self.policy = policy if policy is not None else self._own_policy()
        self.runner = RolloutRunner(
            env_source,
            self.policy,
            seed=self.rollout_seed,
            sampling=SamplingParams(args.temperature, args.top_p, _turn_tokens(args)),
            env_kwargs=_env_kwargs(args) if env is None else None,
        )
        self.pool_rng = np.random.default_rng(self.rollout_seed)
        self.last_batch: SampleBatch | None = None
        """The newest step's sampled trees, ledger and allocations."""
        self.last_rows: list[dict[str, Any]] = []
        """The newest step's training rows (with their advantages)."""
        self.ledger = Ledger()
        """Everything sampled so far."""
        self._weights_step: int | None = None

    @property
    def rollout_seed(self) -> int:
        """`args.seed` on the main process; a hash of it and the rank on the others.

        Each data-parallel process samples its own trees (its own pool and seed stream) and
        trains on its own rows; TRL averages the gradients.
        """
        rank = self.accelerator.process_index
        return int(self.args.seed) if rank == 0 else mix(int(self.args.seed), rank) >> 1

    @property
    def _steps_per_generation(self) -> int:
        """Micro-batches per sampling step (GRPOConfig sets it in __post_init__)."""
        return int(self.args.steps_per_generation or 1)

    def _own_policy(self) -> Policy:
        from trace_gym.policies.hf import HFPolicy

        model = self.accelerator.unwrap_model(self.model)
        return HFPolicy(model, self._tokenizer, device=self.accelerator.device, seed=self.args.seed)

    # ----- sampling --------------------------------------------------------------------
    def sample_step(self) -> SampleBatch:
        """Draw a candidate pool and let the sampler spend one budget on it (no gradients)."""
        pool_size = self.budget.candidates
        pool = [self.tasks[i] for i in self.pool_rng.choice(len(self.tasks), pool_size, replace=False)]
        self._sync_weights()
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                batch = self.sampler.sample(pool, self.runner, self.budget)
        finally:
            self.model.train(was_training)
        self.ledger.merge(batch.ledger)
        return batch

    def _sync_weights(self) -> None:
        """Give a policy with its own engine (`load_weights`, e.g. VLLMPolicy) the current weights.

        Called before each sampling step whose weights the engine has not seen (the first
        one too, so a resumed run samples from the checkpoint's weights).
        """
        load = getattr(self.policy, "load_weights", None)
        if callable(load) and self._weights_step != self.state.global_step:
            load(self.accelerator.unwrap_model(self.model))
            self._weights_step = self.state.global_step

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """Mirrors `GRPOTrainer._generate_and_score_completions`: sample trees, build rows, score them.

        The incoming prompts are TRL's placeholders and are ignored. Returns the keys
        TRL's loss reads: prompt and completion ids and masks, `advantages` (one per row),
        `num_items_in_batch`, and `old_per_token_logps` / `ref_per_token_logps` under the
        same conditions as TRL.
        """
        device = self.accelerator.device
        mode = "train" if self.model.training else "eval"
        batch = self.sample_step()
        advantages = self.advantage_fn(batch.trees, scale=self.args.advantage_scale)
        rows = turn_rows(batch.trees, advantages)
        if not rows:
            raise TraceGymError(
                "The step produced no trainable turn (every generation failed); see the trees' node.error."
            )
        self.last_batch, self.last_rows = batch, rows
        pad_id = self._tokenizer.pad_token_id
        prompt_ids = pad([torch.tensor(r["prompt_token_ids"]) for r in rows], pad_id, "left").to(device)
        prompt_mask = pad([torch.ones(len(r["prompt_token_ids"]), dtype=torch.long) for r in rows], 0, "left")
        completion_ids = pad([torch.tensor(r["completion_token_ids"]) for r in rows], pad_id, "right").to(
            device
        )
        completion_mask = pad(
            [torch.ones(len(r["completion_token_ids"]), dtype=torch.long) for r in rows], 0, "right"
        ).to(device)
        if self.mask_truncated_completions:  # a turn cut by max_completion_length
            cut = torch.tensor([r["finish_reason"] == "length" for r in rows], device=device)
            completion_mask = completion_mask * (~cut).unsqueeze(1).long()
        prompt_mask = prompt_mask.to(device)
        output: dict[str, Any] = {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": completion_ids,
            "completion_mask": completion_mask,
            "advantages": torch.tensor([r["advantage"] for r in rows], dtype=torch.float32, device=device),
            "num_items_in_batch": self.accelerator.gather(completion_mask.sum()).sum(),
        }
        output.update(self._reference_logps(prompt_ids, prompt_mask, completion_ids, completion_mask))
        self._log_step(batch, rows, mode)
        return output

    def _reference_logps(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        completion_ids: torch.Tensor,
        completion_mask: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        """Old and reference log-probs, under the conditions TRL computes them."""
        ids = torch.cat([prompt_ids, completion_ids], dim=1)
        mask = torch.cat([prompt_mask, completion_mask], dim=1)
        keep = completion_ids.size(1)
        size = self.args.per_device_train_batch_size
        out = {}
        with torch.no_grad():
            generate_every = self._steps_per_generation * self.num_iterations
            if self.args.gradient_accumulation_steps % generate_every != 0:
                out["old_per_token_logps"] = self._get_per_token_logps_and_entropies(
                    self.model, ids, mask, keep, batch_size=size
                )[0]
            if self.beta != 0.0:
                if self.ref_model is None:
                    raise ConfigError(
                        "beta != 0 needs a reference model; TreeGRPOTrainer does not build PEFT references. "
                        "Set beta=0.0 or train without a peft_config."
                    )
                out["ref_per_token_logps"] = self._get_per_token_logps_and_entropies(
                    self.ref_model, ids, mask, keep, batch_size=size
                )[0]
        return out

    def _log_step(self, batch: SampleBatch, rows: list[dict[str, Any]], mode: str) -> None:
        """Per-step metrics: reward, effective ratio, ledger, allocations, calibration."""
        metrics = self._metrics[mode]
        leaves = [leaf.reward for tree in batch.trees for leaf in tree.leaves()]
        metrics["reward"].append(float(np.mean(leaves)) if leaves else float("nan"))
        metrics["reward_std"].append(float(np.std(leaves, ddof=1)) if len(leaves) > 1 else 0.0)
        metrics["effective_ratio"].append(effective_ratio(batch.trees))
        total = batch.ledger.total()
        for name in ("rollouts", "turns", "generated_tokens", "prompt_tokens", "tool_calls", "failures"):
            metrics[f"ledger/{name}"].append(float(getattr(total, name)))
        metrics["ledger/wall_time"].append(total.wall_time)
        metrics["rows"].append(float(len(rows)))
        metrics["rows/shared_turns"].append(float(sum(1 for r in rows if r["leaves"] > 1)))
        adv = np.array([r["advantage"] for r in rows])
        metrics["advantage/abs_mean"].append(float(np.abs(adv).mean()))
        metrics["advantage/frac_zero"].append(float((adv == 0).mean()))
        for kind in ("roots", "prefixes"):
            counts = list(batch.allocations.get(kind, {}).values())
            metrics[f"allocation/{kind}/count"].append(float(len(counts)))
            metrics[f"allocation/{kind}/mean"].append(float(np.mean(counts)) if counts else 0.0)
            metrics[f"allocation/{kind}/max"].append(float(max(counts)) if counts else 0.0)
        calibration = prediction_calibration(batch)
        metrics["predictor/brier"].append(calibration["brier"])
        metrics["predictor/ece"].append(calibration["ece"])
        metrics["sampler/fallback"].append(float(batch.fallback is not None))
        self._logs["prompt"].extend(r["prompt"] for r in rows)
        self._logs["completion"].extend(r["completion"] for r in rows)
        self._logs["rewards"]["value"].extend(r["value"] for r in rows)
        self._logs["advantages"].extend(float(a) for a in adv)

    def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
        """Mirrors `GRPOTrainer._prepare_inputs` (training branch) with an uneven split.

        A step's rows are generated once, shuffled, and split into `steps_per_generation`
        nearly equal parts (TRL's split needs a multiple); each accumulation step takes one.
        """
        if not self.model.training:
            return self._generate_and_score_completions(generation_batch)
        generate_every = self._steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            whole = shuffle_sequence_dict(self._generate_and_score_completions(generation_batch))
            self._buffered_inputs = _split(whole, self._steps_per_generation)
        inputs: dict[str, Any] = self._buffered_inputs[self._step % self._steps_per_generation]
        return inputs

    # ----- checkpoints -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What resuming needs beyond TRL's own state: sampler (with predictor), seeds, RNG."""
        return {
            "sampler": self.sampler.state_dict(),
            "runner_counter": self.runner._counter,
            "pool_rng": self.pool_rng.bit_generator.state,
            "ledger": self.ledger.to_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        self.sampler.load_state_dict(state["sampler"])
        self.runner._counter = int(state["runner_counter"])
        self.pool_rng.bit_generator.state = state["pool_rng"]
        self.ledger = Ledger.from_dict(state["ledger"])

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Mirrors `GRPOTrainer._save_checkpoint`, then writes `STATE_FILE` into the checkpoint."""
        super()._save_checkpoint(model, trial)  # type: ignore[no-untyped-call]
        if self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            with open(os.path.join(folder, STATE_FILE), "wb") as fh:
                pickle.dump(self.state_dict(), fh)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """Mirrors `GRPOTrainer._load_optimizer_and_scheduler`, then restores `STATE_FILE`."""
        super()._load_optimizer_and_scheduler(checkpoint)  # type: ignore[no-untyped-call]
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, STATE_FILE)
        if not os.path.exists(path):
            raise ConfigError(
                f"{checkpoint} has no {STATE_FILE}, so the sampler and predictor state cannot be restored; "
                "resume from a checkpoint written by TreeGRPOTrainer."
            )
        with open(path, "rb") as fh:
            self.load_state_dict(pickle.load(fh))


def _split(batch: dict[str, Any], parts: int) -> list[dict[str, Any]]:
    """Split along rows into `parts` nearly equal chunks (scalars are shared)."""
    rows = next(v for v in batch.values() if isinstance(v, torch.Tensor) and v.ndim > 0).shape[0]
    chunks = np.array_split(np.arange(rows), parts)
    return [
        {
            k: v[int(c[0]) : int(c[-1]) + 1] if isinstance(v, torch.Tensor) and v.ndim > 0 else v
            for k, v in batch.items()
        }
        for c in chunks
    ]


def _check_chat_template(tokenizer: Any) -> None:
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    if getattr(tok, "chat_template", None) is None:
        raise ConfigError(
            f"The tokenizer {type(tok).__name__} has no chat template, so turns cannot be rendered as chat "
            "prompts. Use an instruct model's tokenizer, or set tokenizer.chat_template before building "
            "the trainer."
        )


def _check_env(env: str | EnvFactory, args: TreeGRPOConfig, tasks: Sequence[Task] | None) -> Sequence[Task]:
    """Make one env, check it is branchable and can be snapshotted; return the task source."""
    instance = gymnasium.make(env, **_env_kwargs(args)) if isinstance(env, str) else env()
    try:
        base = instance.unwrapped
        if not isinstance(base, BranchableEnv):
            raise ConfigError(
                f"The env {env!r} is a {type(base).__name__}, not a trace_gym BranchableEnv; the trainer "
                "needs snapshots to grow trees. Subclass BranchableEnv, or use a registered trace_gym env."
            )
        source = list(tasks) if tasks is not None else list(base.tasks)
        if not source:
            raise ConfigError("The task source is empty; pass tasks=[...] or an env with tasks.")
        instance.reset(seed=args.seed, options={"task": source[0]})
        try:
            snapshot(instance)
        except TraceGymError as exc:
            raise ConfigError(
                f"The env {env!r} cannot be snapshotted ({exc}). Every sampler records a snapshot per turn "
                "and branching samplers (TreePO, TRACE with continuations_per_root > 0) restore prefixes "
                "from them. Remove the wrapper that holds uncaptured state or register it with "
                "trace_gym.register_wrapper_state."
            ) from None
        return source
    finally:
        instance.close()


def _check_budget(sampler: Sampler, args: TreeGRPOConfig, pool: int) -> None:
    """The budget fits the task source, the sampler's groups and the accumulation steps."""
    budget = args.budget
    if budget.candidates > pool:
        raise BudgetError(
            f"candidates={budget.candidates} per step but the task source has {pool} tasks; lower "
            "candidates or pass more tasks."
        )
    group_size = getattr(sampler, "group_size", None)
    if isinstance(group_size, int):
        prompts = group_count(budget, budget.total, group_size, type(sampler).__name__)
        if prompts > budget.candidates:
            raise BudgetError(
                f"{type(sampler).__name__} spends M·(1+N)={budget.total} rollouts in groups of {group_size}, "
                f"so it needs {prompts} prompts per step but candidates={budget.candidates}. Raise "
                "candidates, or lower roots / continuations_per_root."
            )
    if budget.total < (args.steps_per_generation or 1):
        raise BudgetError(
            f"A step's M·(1+N)={budget.total} rollouts give at least {budget.total} rows, too few to split "
            f"into steps_per_generation={args.steps_per_generation} micro-batches. Lower "
            "gradient_accumulation_steps (or steps_per_generation), or raise roots."
        )
