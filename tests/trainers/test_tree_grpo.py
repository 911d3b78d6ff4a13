import pickle
from collections import defaultdict
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest

pytest.importorskip("trl", reason="needs the train extra: pip install 'trace-gym[train]'")
torch = pytest.importorskip("torch", reason="needs the hf extra: pip install 'trace-gym[hf]'")

from trace_gym.advantages import tree_grpo_advantages, treerpo_advantages  # noqa: E402
from trace_gym.errors import BudgetError, ConfigError  # noqa: E402
from trace_gym.policies import make_tiny_model  # noqa: E402
from trace_gym.predictors import BetaPredictor, FeaturePredictor  # noqa: E402
from trace_gym.samplers import PCLSampler, TraceSampler, TreePOSampler, UniformSampler  # noqa: E402
from trace_gym.trainers import TreeGRPOConfig, TreeGRPOTrainer  # noqa: E402
from trace_gym.trainers.tree_grpo import STATE_FILE  # noqa: E402

from .parity_env import ENV_ID, OBSERVATION, register  # noqa: E402

register()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def config(tmp_path: Path, **overrides) -> TreeGRPOConfig:
    values: dict[str, Any] = {
        "output_dir": str(tmp_path / "out"),
        "env_id": ENV_ID,
        "env_kwargs": {"num_tasks": 8},
        "max_steps": 2,
        "roots": 4,
        "continuations_per_root": 1,
        "max_per_prompt": 4,
        "candidates": 4,
        "max_completion_length": 6,
        "learning_rate": 1e-2,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "gradient_checkpointing": False,
        "per_device_train_batch_size": 4,
        "num_generations": 2,
        "seed": 3,
    }
    values.update(overrides)
    return TreeGRPOConfig(**values)


Rows = dict[tuple[Any, ...], list[float]]
LOGGED = (
    "reward",
    "effective_ratio",
    "ledger/rollouts",
    "ledger/turns",
    "ledger/generated_tokens",
    "ledger/prompt_tokens",
    "allocation/roots/mean",
    "allocation/prefixes/count",
    "predictor/brier",
    "predictor/ece",
)


class Recorder:
    """Keeps every sampled batch and every input the loss saw."""

    def __init__(self, trainer: TreeGRPOTrainer) -> None:
        self.batches: list[Any] = []
        self.inputs: list[dict[str, Any]] = []
        sample, loss = trainer.sample_step, trainer._compute_loss

        def sample_step():
            self.batches.append(sample())
            return self.batches[-1]

        def compute_loss(model, inputs):
            self.inputs.append(
                {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in inputs.items()}
            )
            return loss(model, inputs)

        trainer.sample_step = sample_step  # type: ignore[method-assign]
        trainer._compute_loss = compute_loss  # type: ignore[method-assign]


def loss_rows(inputs) -> Rows:
    """(prompt ids, completion ids under the loss mask) -> advantages, over every micro-batch."""
    out: Rows = defaultdict(list)
    for batch in inputs:
        for i in range(batch["prompt_ids"].shape[0]):
            prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()]
            completion = batch["completion_ids"][i][batch["completion_mask"][i].bool()]
            out[(tuple(prompt.tolist()), tuple(completion.tolist()))].append(float(batch["advantages"][i]))
    return out


def assert_same_rows(fed: Rows, expected: Rows) -> None:
    assert fed.keys() == expected.keys()
    for key, values in fed.items():
        np.testing.assert_allclose(sorted(values), sorted(expected[key]), atol=1e-6)


def tree_rows(batch, estimator=tree_grpo_advantages) -> Rows:
    out: Rows = defaultdict(list)
    for tree, adv in zip(batch.trees, estimator(batch.trees), strict=True):
        for node in tree.nodes:
            if node.generated:
                out[(node.prompt_token_ids, node.completion_token_ids)].append(float(adv[node.id]))
    return out


def test_two_steps_train_on_each_turn_once_with_the_trees_advantages(tmp_path):
    model, tokenizer = make_tiny_model(seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = TreeGRPOTrainer(
        model, config(tmp_path, gradient_accumulation_steps=2), TraceSampler(FeaturePredictor(seed=0)),
        processing_class=tokenizer,
    )  # fmt: skip
    record = Recorder(trainer)
    trainer.train()

    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert changed == list(before), "every parameter must move"
    assert len(record.batches) == 2 and len(record.inputs) == 4  # 2 steps x 2 accumulation micro-batches
    for step, batch in enumerate(record.batches):
        fed = loss_rows(record.inputs[2 * step : 2 * step + 2])
        expected = tree_rows(batch)
        assert_same_rows(fed, expected)
        generated = [n for t in batch.trees for n in t.nodes if n.generated]
        assert sum(len(v) for v in fed.values()) == len(generated)  # each turn once
        leaves = sum(1 for t in batch.trees for _ in t.leaves())
        assert len(generated) < 2 * leaves  # shared first turns are not repeated per leaf
        assert any(n.tree is not None and len(list(n.tree.leaves(n))) > 1 for n in generated)
    assert any(abs(a) > 0 for v in loss_rows(record.inputs).values() for a in v)


def test_observation_tokens_carry_no_loss(tmp_path):
    model, tokenizer = make_tiny_model(seed=0)
    trainer = TreeGRPOTrainer(
        model, config(tmp_path, max_steps=1), UniformSampler(2), processing_class=tokenizer
    )
    record = Recorder(trainer)
    trainer.train()
    [inputs] = record.inputs
    observation = tokenizer(OBSERVATION, add_special_tokens=False)["input_ids"]
    second_turns = 0
    for i in range(inputs["prompt_ids"].shape[0]):
        prompt = tokenizer.decode(inputs["prompt_ids"][i][inputs["prompt_mask"][i].bool()])
        mask = inputs["completion_mask"][i]
        trained = inputs["completion_ids"][i][mask.bool()].tolist()
        # the loss covers exactly the generated ids; padding and everything before is masked
        assert mask.sum() == len(trained) and (mask[: len(trained)] == 1).all()
        assert not _contains(trained, observation)
        second_turns += OBSERVATION in prompt
    assert second_turns > 0, "the observation must appear (in prompts only)"
    assert trainer.last_batch is not None
    nodes = [n for t in trainer.last_batch.trees for n in t.nodes if n.generated]
    assert {n.completion_token_ids for n in nodes} == {
        tuple(r["completion_token_ids"]) for r in trainer.last_rows
    }


def _contains(seq: list[int], sub: list[int]) -> bool:
    return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_an_estimator_object_replaces_the_configured_one(tmp_path):
    model, tokenizer = make_tiny_model(seed=0)
    trainer = TreeGRPOTrainer(
        model, config(tmp_path, max_steps=1), TreePOSampler(2, seed=0), processing_class=tokenizer,
        advantage=treerpo_advantages,
    )  # fmt: skip
    record = Recorder(trainer)
    trainer.train()
    fed = loss_rows(record.inputs)
    expected = tree_rows(record.batches[0], treerpo_advantages)
    assert_same_rows(fed, expected)


@pytest.mark.parametrize(
    "make",
    [
        lambda: UniformSampler(2),
        lambda: PCLSampler(BetaPredictor(), group_size=2),
        lambda: TreePOSampler(2, seed=1),
        lambda: TraceSampler(FeaturePredictor(seed=1)),
    ],
    ids=["uniform", "pcl", "treepo", "trace"],
)
def test_every_sampler_drives_the_trainer(tmp_path, make):
    model, tokenizer = make_tiny_model(seed=0)
    sampler = make()
    trainer = TreeGRPOTrainer(model, config(tmp_path, max_steps=1), sampler, processing_class=tokenizer)
    assert trainer.train().global_step == 1
    batch = trainer.last_batch
    assert batch is not None and batch.ledger.total().rollouts == trainer.budget.total
    logged = trainer.state.log_history[0]
    assert set(LOGGED) <= set(logged)
    assert logged["ledger/rollouts"] == trainer.budget.total


def test_resume_continues_with_the_same_sampler_and_predictor_state(tmp_path):
    def run(resume=None):
        model, tokenizer = make_tiny_model(seed=0)
        args = config(tmp_path, save_strategy="steps", save_steps=1, max_steps=2)
        trainer = TreeGRPOTrainer(
            model, args, TraceSampler(FeaturePredictor(seed=0)), processing_class=tokenizer
        )
        record = Recorder(trainer)
        trainer.train(resume_from_checkpoint=resume)
        return trainer, record

    full, full_record = run()
    checkpoint = tmp_path / "out" / "checkpoint-1"
    saved = pickle.loads((checkpoint / STATE_FILE).read_bytes())
    assert saved["sampler"]["predictor"]["fits"] == 1
    resumed, resumed_record = run(str(checkpoint))
    assert len(resumed_record.batches) == 1  # only step 2 was sampled again

    def trees(batch):
        return [[(n.prompt_token_ids, n.completion_token_ids) for n in t.nodes] for t in batch.trees]

    assert trees(resumed_record.batches[0]) == trees(full_record.batches[1])
    assert resumed_record.batches[0].allocations == full_record.batches[1].allocations
    a, b = full.sampler.state_dict()["predictor"], resumed.sampler.state_dict()["predictor"]
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(np.asarray(a[key], dtype=object), np.asarray(b[key], dtype=object))


def test_a_policy_with_its_own_engine_gets_the_new_weights_every_step(tmp_path):
    from trace_gym.policies import HFPolicy

    model, tokenizer = make_tiny_model(seed=0)
    engine_model, _ = make_tiny_model(seed=1)  # a separate copy, as a vLLM engine holds
    synced: list[tuple[int, bool]] = []

    class EnginePolicy(HFPolicy):
        def load_weights(self, weights):
            self.model.load_state_dict(weights.state_dict())
            same = all(
                torch.equal(a, b) for a, b in zip(self.model.parameters(), model.parameters(), strict=True)
            )
            synced.append((trainer.state.global_step, same))

    policy = EnginePolicy(engine_model, tokenizer, device="cpu")
    args = config(tmp_path)
    trainer = TreeGRPOTrainer(model, args, UniformSampler(2), processing_class=tokenizer, policy=policy)
    trainer.train()
    assert synced == [(0, True), (1, True)]


# ----- bad input ------------------------------------------------------------------------
def test_batch_and_budget_that_do_not_fit_are_refused(tmp_path):
    model, tokenizer = make_tiny_model(seed=0)
    with pytest.raises(BudgetError, match="groups of 3"):
        TreeGRPOTrainer(model, config(tmp_path), UniformSampler(3), processing_class=tokenizer)
    with pytest.raises(BudgetError, match="needs 4 prompts per step but candidates=2"):
        TreeGRPOTrainer(
            model,
            config(tmp_path, candidates=2, max_per_prompt=2),
            UniformSampler(2),
            processing_class=tokenizer,
        )
    with pytest.raises(BudgetError, match="task source has 8 tasks; lower candidates"):
        TreeGRPOTrainer(model, config(tmp_path, candidates=9), UniformSampler(2), processing_class=tokenizer)
    with pytest.raises(BudgetError, match="Lower gradient_accumulation_steps"):
        TreeGRPOTrainer(
            model, config(tmp_path, roots=2, continuations_per_root=0, gradient_accumulation_steps=4),
            UniformSampler(2), processing_class=tokenizer,
        )  # fmt: skip
    with pytest.raises(BudgetError, match="roots"):
        config(tmp_path, roots=1)
    with pytest.raises(ConfigError, match="max_steps must be > 0"):
        config(tmp_path, max_steps=-1)
    with pytest.raises(ConfigError, match="advantage must be one of"):
        config(tmp_path, advantage="ppo")


def test_an_env_without_snapshots_is_refused(tmp_path):
    class Counter(gymnasium.Wrapper):  # state trace_gym cannot capture
        def __init__(self, env):
            super().__init__(env)
            self.count = 0

    model, tokenizer = make_tiny_model(seed=0)
    with pytest.raises(ConfigError, match=r"cannot be snapshotted.*register_wrapper_state"):
        TreeGRPOTrainer(
            model, config(tmp_path), TreePOSampler(2), processing_class=tokenizer,
            env=lambda: Counter(gymnasium.make(ENV_ID)),
        )  # fmt: skip


def test_a_tokenizer_without_chat_template_is_refused(tmp_path):
    model, tokenizer = make_tiny_model(seed=0)
    tokenizer.chat_template = None
    with pytest.raises(ConfigError, match=r"no chat template.*set tokenizer\.chat_template"):
        TreeGRPOTrainer(model, config(tmp_path), UniformSampler(2), processing_class=tokenizer)


def test_a_sampler_name_is_not_a_sampler(tmp_path):
    model, tokenizer = make_tiny_model(seed=0)
    with pytest.raises(ConfigError, match=r"Sampler object \(e.g. UniformSampler\(8\)\)"):
        TreeGRPOTrainer(model, config(tmp_path), "uniform", processing_class=tokenizer)  # type: ignore[arg-type]


@pytest.mark.slow
def test_smollm2_takes_two_steps(tmp_path):
    from trace_gym.errors import MissingDependencyError
    from trace_gym.policies.smollm2 import gguf_folder, load_smollm2

    try:
        gguf_folder()
    except MissingDependencyError as exc:
        pytest.skip(str(exc))

    model, tokenizer = load_smollm2()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = config(
        tmp_path, env_id="trace_gym/SyntheticTree-v0", learning_rate=1e-5, max_completion_length=8,
        env_kwargs={"num_tasks": 8, "min_steps": 1, "max_steps": 2, "extra_turns": 0},
        roots=2, candidates=2, max_per_prompt=2, gradient_accumulation_steps=2,  # 4 rollouts, ~6 rows
    )  # fmt: skip
    trainer = TreeGRPOTrainer(model, args, TraceSampler(FeaturePredictor(seed=0)), processing_class=tokenizer)
    assert trainer.train().global_step == 2
    assert trainer.ledger.total().rollouts == 2 * trainer.budget.total
    logged = trainer.state.log_history[-2]
    assert logged["ledger/rollouts"] == trainer.budget.total and "predictor/brier" in logged
    if any(abs(r["advantage"]) > 0 for r in trainer.last_rows):
        assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_docstring_example_runs(tmp_path, monkeypatch):
    import doctest

    from trace_gym.trainers import tree_grpo

    monkeypatch.chdir(tmp_path)  # the example writes to ./out
    result = doctest.testmod(tree_grpo)
    assert result.attempted > 0 and result.failed == 0
