import gymnasium
import numpy as np
import pytest

from trace_gym import ConfigError, Job, RolloutRunner, SimulatedPolicy, Task
from trace_gym.envs.synthetic import (
    NEGATIVE_WORDS,
    POSITIVE_WORDS,
    SyntheticConfig,
    SyntheticTreeEnv,
    advance_call,
)
from trace_gym.metrics import effective_ratio

ENV_ID = "trace_gym/SyntheticTree-v0"


@pytest.fixture(scope="module")
def runner():
    with RolloutRunner(ENV_ID, SimulatedPolicy(), seed=11) as r:
        yield r


def test_calibration_puts_uniform_effective_ratio_in_paper_grpo_range(runner):
    assert 0.27 <= SyntheticConfig().expected_effective_ratio(8) <= 0.35
    trees = runner.run([Job(task, 8) for task in runner.tasks])
    assert 0.27 <= effective_ratio(trees) <= 0.35


def test_root_success_rate_matches_v0(runner):
    tasks = runner.tasks[:300]
    trees = runner.run([Job(task, 16) for task in tasks])
    v0 = np.array([t.metadata["v0"] for t in tasks])
    rates = np.array([tree.success_rate() for tree in trees])
    # 4,800 Bernoulli draws: the mean success equals the mean V_0 within 4 standard errors.
    se = np.sqrt(np.sum(v0 * (1 - v0)) / 16) / len(tasks)
    assert abs(rates.mean() - v0.mean()) < 4 * se + 1e-3
    assert np.corrcoef(v0, rates)[0, 1] > 0.9


def test_value_after_a_turn_is_the_success_probability_from_there(runner):
    """The martingale: continuations from a prefix succeed at the rate info['value'] says."""
    mid = [t for t in runner.tasks if 0.2 < t.metadata["v0"] < 0.8][:40]
    trees = runner.run([Job(task, 1) for task in mid])
    prefixes = [tree.root.children[0] for tree in trees if not tree.root.children[0].done]
    runner.run([Job(node, 200, stage="continuation") for node in prefixes])
    values = np.array([node.info["value"] for node in prefixes])
    rates = np.array([np.mean([leaf.reward for leaf in node.tree.leaves(node)]) for node in prefixes])
    counts = np.array([len(list(node.tree.leaves(node))) for node in prefixes])
    z = (rates - values) / np.sqrt(np.maximum(values * (1 - values), 1e-3) / counts)
    assert np.all(np.abs(z) < 4.5), z
    assert abs(np.mean(z)) < 4 / np.sqrt(len(z))


def test_contrast_potential_falls_with_depth(runner):
    trees = runner.run([Job(task, 4) for task in runner.tasks[:300]])
    by_depth: dict[int, list[float]] = {}
    for tree in trees:
        for node in tree.nodes:
            v = node.info["value"] if node.parent is not None else tree.task.metadata["v0"]
            by_depth.setdefault(node.depth, []).append(v * (1 - v))
    means = [np.mean(by_depth[d]) for d in range(4)]
    assert means == sorted(means, reverse=True)
    assert means[3] < 0.5 * means[0]


def test_signal_words_carry_evidence_of_the_value(runner):
    trees = runner.run([Job(task, 2) for task in runner.tasks[:300]])
    values, positives = [], []
    for tree in trees:
        for node in tree.nodes[1:]:
            if node.done or node.failed:
                continue
            words = node.messages[-1]["content"].split("Signals: ")[1].rstrip(".").split()
            assert all(w in POSITIVE_WORDS or w in NEGATIVE_WORDS for w in words)
            values.append(node.info["value"])
            positives.append(np.mean([w in POSITIVE_WORDS for w in words]))
    assert np.corrcoef(values, positives)[0, 1] > 0.5


def test_hints_in_the_prompt_carry_evidence_of_v0():
    env = SyntheticTreeEnv()
    v0 = np.array([t.metadata["v0"] for t in env.tasks])
    hints = [t.messages()[-1]["content"].split("Hints: ")[1] for t in env.tasks]
    pos = np.array([np.mean([w.strip(".") in POSITIVE_WORDS for w in h.split()]) for h in hints])
    assert np.corrcoef(v0, pos)[0, 1] > 0.5


def test_malformed_action_gives_an_error_observation_and_uses_a_turn():
    env = gymnasium.make(ENV_ID)
    env.reset(seed=0, options={"index": 5})
    obs, reward, terminated, truncated, info = env.step("no tool call here")
    assert obs.startswith("Error: expected exactly one <tool_call>")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["tool_calls"] == 0
    obs, *_ = env.step('<tool_call>{"name": "jump", "arguments": {}}</tool_call>')
    assert "unknown tool 'jump'" in obs
    obs, *_ = env.step('<tool_call>{"name": "advance", "arguments": {"draw": 2}}</tool_call>')
    assert "arguments.draw must be a number in [0, 1], got 2" in obs


def test_truncated_after_max_turns_with_reward_zero():
    env = SyntheticTreeEnv()
    env.reset(seed=0, options={"index": 0})
    for turn in range(1, env.max_turns + 1):
        _, reward, terminated, truncated, info = env.step("garbage")
        assert not terminated
        assert truncated == (turn == env.max_turns)
    assert reward == 0.0 and info["success"] is False


def test_valid_actions_end_the_episode_after_the_task_length():
    env = SyntheticTreeEnv()
    env.reset(seed=0, options={"index": 7})
    steps = env.tasks[7].metadata["steps"]
    for k in range(steps):
        _, reward, terminated, _, info = env.step(advance_call(k))
        assert terminated == (k == steps - 1)
    assert info["success"] == (reward == 1.0)
    assert info["value"] in (0.0, 1.0)


def test_draw_decides_the_final_step():
    env = SyntheticTreeEnv(min_steps=1, max_steps=1)
    env.reset(options={"index": 0})
    v0 = env.tasks[0].metadata["v0"]
    s = env.snapshot()
    low = env.step(advance_call(int(v0 * 0.99 * 1e9)))
    env.restore(s)
    high = env.step(advance_call(int(min(v0 * 1.01, 0.999999) * 1e9)))
    assert low[1] == 1.0 and high[1] == 0.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_tasks": 0}, "num_tasks must be >= 1"),
        ({"alpha": 0}, "alpha and beta must be > 0"),
        ({"kappa": -1}, "kappa must be > 0"),
        ({"min_steps": 4, "max_steps": 3}, "Need 1 <= min_steps <= max_steps"),
    ],
)
def test_bad_config_is_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        gymnasium.make(ENV_ID, **kwargs)


def test_foreign_task_is_refused_with_the_expected_metadata():
    env = SyntheticTreeEnv()
    with pytest.raises(ConfigError, match=r"needs metadata \{'v0'"):
        env.reset(options={"task": Task("x", "hello")})
    env.reset(options={"task": Task("mine", "hello", metadata={"v0": 0.5, "steps": 2})})
    assert env.task is not None and env.task.id == "mine"


def test_task_set_is_a_function_of_its_kwargs():
    a, b = SyntheticTreeEnv(task_seed=3), SyntheticTreeEnv(task_seed=3)
    assert [t.to_dict() for t in a.tasks] == [t.to_dict() for t in b.tasks]
    assert a.tasks[0].metadata != SyntheticTreeEnv(task_seed=4).tasks[0].metadata
