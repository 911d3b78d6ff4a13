"""Every sampler spends exactly M·(1 + N) rollouts from the same pool, and each decides
as its definition says."""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from trace_gym import Budget, BudgetError, ConfigError, Ledger, RolloutRunner, SimulatedPolicy
from trace_gym.predictors import OraclePredictor
from trace_gym.samplers import PCLSampler, Sampler, TraceSampler, TreePOSampler, UniformSampler
from trace_gym.samplers.base import visited_prefixes
from trace_gym.tree import RolloutTree

ENV_ID = "trace_gym/SyntheticTree-v0"


class ConstantPredictor:
    def __init__(self, value: float = 0.5) -> None:
        self.value = value
        self.fits = 0

    def predict(self, anchors: Sequence[object]) -> np.ndarray:
        return np.full(len(anchors), self.value)

    def fit(self, trees: Sequence[RolloutTree]) -> dict[str, float]:
        self.fits += 1
        return {"trees": float(len(trees))}

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.value = state["value"]


class FailingPredictor(ConstantPredictor):
    def predict(self, anchors: Sequence[object]) -> np.ndarray:
        raise RuntimeError("model server down")


class PrefixFailingPredictor(OraclePredictor):
    def predict(self, anchors):
        if any(getattr(a, "depth", 0) > 0 for a in anchors):
            raise RuntimeError("prefix head missing")
        return super().predict(anchors)


class BadPredictor(ConstantPredictor):
    def predict(self, anchors: Sequence[object]) -> np.ndarray:
        out = np.full(len(anchors), 0.5)
        out[3] = np.nan
        return out


@pytest.fixture(scope="module")
def runner():
    with RolloutRunner(ENV_ID, SimulatedPolicy(), seed=5) as r:
        yield r


@pytest.fixture(scope="module")
def pool(runner):
    rng = np.random.default_rng(0)
    return [runner.tasks[i] for i in rng.choice(len(runner.tasks), 128, replace=False)]


def all_samplers() -> list[Sampler]:
    return [
        UniformSampler(8),
        PCLSampler(OraclePredictor(), 8),
        TreePOSampler(8, seed=1),
        TraceSampler(OraclePredictor()),
        TraceSampler(OraclePredictor(), scope="global", name="trace_global"),
        TraceSampler(ConstantPredictor(), name="trace_constant"),
    ]


@pytest.mark.parametrize(("roots", "n"), [(64, 0), (64, 1), (32, 3)])  # G=8 splits evenly
def test_every_sampler_spends_exactly_the_budget(runner, pool, roots, n):
    budget = Budget(roots, n, 8, len(pool))
    for sampler in all_samplers():
        batch = sampler.sample(pool, runner, budget)
        leaves = sum(len(list(t.leaves())) for t in batch.trees)
        assert batch.ledger.total().rollouts == leaves == budget.total, sampler.name
        assert batch.ledger.counts() == Ledger.from_trees(batch.trees).counts(), sampler.name
        assert {t.task.id for t in batch.trees} <= {t.id for t in pool}
        assert (
            sum(batch.allocations["roots"].values()) + sum(batch.allocations.get("prefixes", {}).values())
            == budget.total
        ), sampler.name


def test_trace_stage1_follows_allocate_roots_and_stage2_stays_per_prompt(runner, pool):
    from trace_gym.allocation import allocate_roots

    budget = Budget(64, 2, 8, len(pool))
    batch = TraceSampler(OraclePredictor()).sample(pool, runner, budget)
    v = np.array([t.metadata["v0"] for t in pool])
    expected = allocate_roots(v, 64, 8, 2)
    assert batch.allocations["roots"] == {t.id: int(m) for t, m in zip(pool, expected, strict=True) if m > 0}
    for tree in batch.trees:
        m = batch.allocations["roots"][tree.task.id]
        continuations = [leaf for leaf in tree.leaves() if leaf.stage == "continuation"]
        assert len(continuations) == m * 2
    assert all(p.stage in ("root", "prefix") for p in batch.predictions)
    assert len([p for p in batch.predictions if p.stage == "root"]) == len(pool)


def test_trace_with_the_oracle_beats_uniform_on_effective_prompts(runner, pool):
    budget = Budget(128, 1, 8, len(pool))
    uniform = UniformSampler(8).sample(pool, runner, budget)
    trace = TraceSampler(OraclePredictor()).sample(pool, runner, budget)
    eff = lambda b: sum(t.is_effective for t in b.trees)  # noqa: E731
    assert eff(trace) > 1.5 * eff(uniform)


def test_trace_global_scope_pools_the_continuation_budget(runner, pool):
    budget = Budget(64, 1, 8, len(pool))
    batch = TraceSampler(OraclePredictor(), scope="global").sample(pool, runner, budget)
    assert sum(batch.allocations["prefixes"].values()) == 64


def test_pcl_keeps_the_candidates_closest_to_tau(runner, pool):
    budget = Budget(64, 0, 8, len(pool))
    batch = PCLSampler(OraclePredictor(), 8, tau=0.5).sample(pool, runner, budget)
    distance = {t.id: abs(t.metadata["v0"] - 0.5) for t in pool}
    chosen = set(batch.allocations["roots"])
    worst_chosen = max(distance[i] for i in chosen)
    best_skipped = min(d for i, d in distance.items() if i not in chosen)
    assert len(chosen) == 8 and worst_chosen <= best_skipped


def test_treepo_uses_grpo_prompts_and_branches_from_random_prefixes(runner, pool):
    budget = Budget(64, 3, 8, len(pool))
    batch = TreePOSampler(8, seed=3).sample(pool, runner, budget)
    assert [t.task.id for t in batch.trees] == [t.id for t in pool[:32]]
    assert all(m == 2 for m in batch.allocations["roots"].values())
    assert sum(batch.allocations["prefixes"].values()) == 192
    assert all(len(list(t.leaves())) == 8 for t in batch.trees)
    assert len(batch.allocations["prefixes"]) > 64  # spread over many prefixes, not piled up


def test_treepo_refuses_roots_that_do_not_split_evenly(runner, pool):
    with pytest.raises(BudgetError, match="is not a multiple of"):
        TreePOSampler(8).sample(pool, runner, Budget(48, 2, 8, len(pool)))


def test_treepo_state_dict_replays_its_choices(runner, pool):
    budget = Budget(32, 1, 8, len(pool))
    sampler = TreePOSampler(8, seed=3)
    state = sampler.state_dict()
    first = sampler.rng.integers(1000, size=5)
    other = TreePOSampler(8, seed=99)
    other.load_state_dict(state)
    assert list(other.rng.integers(1000, size=5)) == list(first)
    assert budget.total == 64


def test_failing_predictor_falls_back_to_uniform_and_says_why(runner, pool):
    budget = Budget(64, 1, 8, len(pool))
    for sampler in (TraceSampler(FailingPredictor()), PCLSampler(FailingPredictor(), 8)):
        batch = sampler.sample(pool, runner, budget)
        assert batch.fallback is not None
        assert "FailingPredictor.predict failed on candidate prompts: RuntimeError: model server down" in (
            batch.fallback
        )
        assert batch.ledger.total().rollouts == budget.total


def test_failing_prefix_prediction_falls_back_for_stage2_only(runner, pool):
    budget = Budget(64, 1, 8, len(pool))
    batch = TraceSampler(PrefixFailingPredictor()).sample(pool, runner, budget)
    assert batch.fallback is not None and "on visited prefixes" in batch.fallback
    assert batch.ledger.total().rollouts == budget.total
    assert sum(batch.allocations["prefixes"].values()) == 64


def test_nan_from_a_predictor_is_a_clear_error(runner, pool):
    with pytest.raises(ConfigError, match=r"returned nan at index 3 \(1 bad of 128\)"):
        TraceSampler(BadPredictor()).sample(pool, runner, Budget(64, 1, 8, len(pool)))


def test_empty_pool_is_refused(runner):
    for sampler in all_samplers():
        with pytest.raises(BudgetError, match="empty candidate pool"):
            sampler.sample([], runner, Budget(16, 1, 8, 8))


def test_predictor_is_fitted_each_step_and_state_round_trips(runner, pool):
    predictor = ConstantPredictor(0.4)
    sampler = TraceSampler(predictor)
    batch = sampler.sample(pool, runner, Budget(32, 1, 8, len(pool)))
    assert predictor.fits == 1 and batch.predictor_metrics["trees"] == len(batch.trees)
    other = TraceSampler(ConstantPredictor(0.9))
    other.load_state_dict(sampler.state_dict())
    assert other.predictor.predict(pool[:2]).tolist() == [0.4, 0.4]


def test_bad_scope_is_refused():
    with pytest.raises(ConfigError, match="scope must be 'per_prompt' or 'global'"):
        TraceSampler(OraclePredictor(), scope="everywhere")  # type: ignore[arg-type]


def test_visited_prefixes_are_inner_turns(runner):
    [tree] = runner.run([__import__("trace_gym").Job(runner.tasks[0], 3)])
    prefixes = visited_prefixes(tree)
    assert prefixes and all(n.parent is not None and not n.done for n in prefixes)


@pytest.mark.parametrize(
    "sampler",
    [
        TraceSampler(OraclePredictor()),
        TraceSampler(OraclePredictor(), scope="global", name="trace_global"),
        TreePOSampler(4, seed=1),
    ],
    ids=lambda s: s.name,
)
def test_a_step_of_one_turn_episodes_branches_from_the_prompts(sampler: Sampler) -> None:
    """No rollout left a prefix: the Stage 2 budget goes to the roots, not to an error."""
    kwargs = {"num_tasks": 32, "min_steps": 1, "max_steps": 1, "extra_turns": 0}
    with RolloutRunner(ENV_ID, SimulatedPolicy(), seed=3, env_kwargs=kwargs) as one_turn:
        budget = Budget(8, 1, 4, 8)
        batch = sampler.sample(list(one_turn.tasks[:8]), one_turn, budget)
    assert batch.ledger.total().rollouts == budget.total == 16
    assert sum(len(list(t.leaves())) for t in batch.trees) == 16
    assert all(not visited_prefixes(t) for t in batch.trees)
    assert sum(batch.allocations["prefixes"].values()) == 8
    assert all(key.endswith("/0") for key in batch.allocations["prefixes"])  # node 0: the root
    if sampler.name == "trace":  # per prompt: each prompt's share stays with it
        assert batch.allocations["prefixes"] == {f"{t}/0": m for t, m in batch.allocations["roots"].items()}
