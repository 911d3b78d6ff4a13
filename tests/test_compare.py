import json
import math
from typing import Any

import pytest

from trace_gym import Budget, ConfigError, SimulatedPolicy
from trace_gym.compare import (
    SAMPLER_NAMES,
    CompareConfig,
    build_sampler,
    format_table,
    run_comparison,
    summary,
    write_plot,
    write_summary,
)
from trace_gym.samplers import UniformSampler
from trace_gym.tree import read_jsonl


def _config(**kw: Any) -> CompareConfig:
    base: dict[str, Any] = {
        "budget": Budget(16, 1, 8, 40),
        "steps": 3,
        "seeds": (1,),
        "warmup": 1,
        "env_kwargs": {"num_tasks": 80},
    }
    base.update(kw)
    return CompareConfig(**base)


def _all(seed: int) -> list[Any]:
    return [build_sampler(name, seed) for name in SAMPLER_NAMES]


def test_every_sampler_runs_at_equal_cost_and_is_summarised(tmp_path):
    config = _config(seeds=(1, 2))
    results = run_comparison(config, _all, SimulatedPolicy, trees_dir=tmp_path, progress=False)
    assert [r.name for r in results] == list(SAMPLER_NAMES)
    for r in results:
        assert sorted(r.steps) == [1, 2] and all(len(s) == 3 for s in r.steps.values())
        assert r.ledger.total().rollouts == 2 * 3 * 32, r.name
        trees = read_jsonl(tmp_path / f"trees-{r.name}.jsonl")
        assert sum(len(list(t.leaves())) for t in trees) == 2 * 3 * 32
    data = summary(config, results)
    assert set(data["samplers"]) == set(SAMPLER_NAMES)
    trace = data["samplers"]["trace"]
    assert 0 <= trace["effective_ratio"] <= 1 and trace["effective_ratio_ci95"] >= 0
    assert trace["predictor_brier"] >= 0
    assert math.isnan(data["samplers"]["uniform"]["predictor_brier"])
    assert sum(data["samplers"]["trace"]["root_allocation_histogram"].values()) > 0
    assert data["config"]["budget"]["roots"] == 16
    table = format_table(config, results)
    assert "trace_oracle" in table and "effective ratio (95% CI)" in table
    write_summary(config, results, tmp_path / "out.json")
    assert json.loads((tmp_path / "out.json").read_text())["config"]["seeds"] == [1, 2]
    write_plot(config, results, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_leaves_out_the_warmup_steps():
    config = _config(warmup=2)
    [r] = run_comparison(config, lambda seed: [UniformSampler(8)], SimulatedPolicy, progress=False)
    values = [s["effective_ratio"] for s in r.steps[1]]
    assert r.mean_ci("effective_ratio", 2)[0] == pytest.approx(values[2])


def test_same_seed_same_results():
    strip = lambda r: [{k: v for k, v in s.items() if k != "wall_time"} for s in r.steps[1]]  # noqa: E731
    a = run_comparison(_config(), _all, SimulatedPolicy, progress=False)
    b = run_comparison(_config(), _all, SimulatedPolicy, progress=False)
    assert [strip(r) for r in a] == [strip(r) for r in b]
    c = run_comparison(_config(seeds=(2,)), lambda s: [UniformSampler(8)], SimulatedPolicy, progress=False)
    assert strip(a[0]) != [{k: v for k, v in s.items() if k != "wall_time"} for s in c[0].steps[2]]


def test_duplicate_sampler_names_are_refused():
    with pytest.raises(ConfigError, match="Sampler names must be unique"):
        run_comparison(_config(), lambda s: [UniformSampler(8), UniformSampler(4)], SimulatedPolicy)


def test_pool_larger_than_task_set_is_refused():
    with pytest.raises(ConfigError, match="has 80 tasks; lower candidates"):
        run_comparison(_config(budget=Budget(16, 1, 8, 90)), _all, SimulatedPolicy)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"steps": 0}, "steps must be >= 1"),
        ({"seeds": ()}, "seeds must name at least one seed"),
        ({"warmup": 3}, r"warmup must be in \[0, steps\)"),
    ],
)
def test_bad_config_is_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        _config(**kwargs)


def test_unknown_sampler_name_is_refused():
    with pytest.raises(ConfigError, match="Unknown sampler 'magic'; choose from uniform"):
        build_sampler("magic", 0)


def test_a_second_run_into_the_same_folder_replaces_the_trees(tmp_path):
    for _ in range(2):
        run_comparison(
            _config(), lambda s: [UniformSampler(8)], SimulatedPolicy, trees_dir=tmp_path, progress=False
        )
    assert len(read_jsonl(tmp_path / "trees-uniform.jsonl")) == 3 * 4
