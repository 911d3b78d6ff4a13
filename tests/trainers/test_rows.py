import pytest

from trace_gym import Job, RolloutRunner, SamplingParams, SimulatedPolicy
from trace_gym.advantages import tree_grpo_advantages
from trace_gym.errors import ConfigError
from trace_gym.trainers import rows_to_dataset, turn_rows

pytest.importorskip("datasets", reason="needs the train extra: pip install 'trace-gym[train]'")
torch = pytest.importorskip("torch", reason="needs the hf extra: pip install 'trace-gym[hf]'")

ENV = "trace_gym/SyntheticTree-v0"
KWARGS = {"num_tasks": 4, "min_steps": 2, "max_steps": 2, "extra_turns": 0}


@pytest.fixture(scope="module")
def trees():
    from trace_gym.policies import HFPolicy, make_tiny_model

    model, tokenizer = make_tiny_model(seed=0)
    policy = HFPolicy(model, tokenizer, device="cpu")
    sampling = SamplingParams(max_new_tokens=6)
    with RolloutRunner(ENV, policy, seed=0, sampling=sampling, env_kwargs=KWARGS) as runner:
        [tree] = runner.run([Job(runner.tasks[0], 2)])
        runner.run([Job(tree.nodes[1], 3, stage="continuation")])  # 3 more leaves share turn 1
    return [tree]


def test_each_turn_is_one_row_with_the_policys_token_ids(trees):
    [tree] = trees
    [adv] = tree_grpo_advantages(trees)
    rows = turn_rows(trees, [adv])
    generated = [n for n in tree.nodes if n.generated]
    assert [r["node_id"] for r in rows] == [n.id for n in generated]
    shared = next(r for r in rows if r["node_id"] == 1)
    assert shared["leaves"] == 4  # one row, four trajectories through it
    for row, node in zip(rows, generated, strict=True):
        assert row["prompt_token_ids"] == node.prompt_token_ids
        assert row["completion_token_ids"] == node.completion_token_ids
        assert row["advantage"] == adv[node.id]
        assert node.parent is not None and row["prompt"] == node.parent.history()


def test_rows_export_as_a_dataset(trees):
    [adv] = tree_grpo_advantages(trees)
    rows = turn_rows(trees, [adv])
    data = rows_to_dataset(rows)
    assert len(data) == len(rows)
    assert data[0]["completion_token_ids"] == list(rows[0]["completion_token_ids"])
    assert {"prompt", "completion", "advantage", "prompt_token_ids", "leaves"} <= set(data.column_names)


def test_turns_without_token_ids_and_mismatched_advantages_are_refused(trees):
    with RolloutRunner(ENV, SimulatedPolicy(), seed=0, env_kwargs=KWARGS) as runner:
        simulated = runner.run([Job(runner.tasks[0], 2)])
    with pytest.raises(ConfigError, match=r"has no token ids.*HFPolicy"):
        turn_rows(simulated, tree_grpo_advantages(simulated))
    with pytest.raises(ConfigError, match="one per node"):
        turn_rows(trees, [tree_grpo_advantages(trees)[0][:-1]])
    with pytest.raises(ConfigError, match="one per tree"):
        turn_rows(trees, [])
