import json
from typing import Any

import pytest

from trace_gym import Budget, ConfigError, SimulatedPolicy
from trace_gym.compare import CompareConfig, format_table, run_comparison
from trace_gym.samplers import UniformSampler
from trace_gym.tree import read_jsonl


def _config(**kw):
    base: dict[str, Any] = {
        "budget": Budget(16, 1, 8, 20),
        "steps": 2,
        "seed": 1,
        "env_kwargs": {"num_tasks": 50},
    }
    base.update(kw)
    return CompareConfig(**base)


def test_comparison_writes_summary_and_trees(tmp_path):
    results = run_comparison(_config(), [UniformSampler(8)], SimulatedPolicy, out=tmp_path, progress=False)
    [result] = results
    assert len(result.steps) == 2
    assert result.ledger.total().rollouts == 2 * 32
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["samplers"][0]["name"] == "uniform"
    assert summary["config"]["budget"]["roots"] == 16
    trees = read_jsonl(tmp_path / "trees-uniform.jsonl")
    assert len(trees) == 2 * 4
    assert sum(len(list(t.leaves())) for t in trees) == 64
    table = format_table(results)
    assert "uniform" in table and "effective ratio" in table


def test_same_seed_same_results():
    a = run_comparison(_config(), [UniformSampler(8)], SimulatedPolicy, progress=False)[0]
    b = run_comparison(_config(), [UniformSampler(8)], SimulatedPolicy, progress=False)[0]
    strip = lambda r: [{k: v for k, v in s.items() if k != "wall_time"} for s in r.steps]  # noqa: E731
    assert strip(a) == strip(b)
    c = run_comparison(_config(seed=2), [UniformSampler(8)], SimulatedPolicy, progress=False)[0]
    assert strip(a) != strip(c)


def test_duplicate_sampler_names_are_refused():
    with pytest.raises(ConfigError, match="Sampler names must be unique"):
        run_comparison(_config(), [UniformSampler(8), UniformSampler(4)], SimulatedPolicy)


def test_pool_larger_than_task_set_is_refused():
    with pytest.raises(ConfigError, match="has 50 tasks; lower candidates"):
        run_comparison(_config(budget=Budget(16, 1, 8, 60)), [UniformSampler(8)], SimulatedPolicy)


def test_steps_must_be_positive():
    with pytest.raises(ConfigError, match="steps must be >= 1"):
        _config(steps=0)
