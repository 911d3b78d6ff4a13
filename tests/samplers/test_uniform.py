import pytest

from trace_gym import Budget, BudgetError, ConfigError, Ledger, RolloutRunner, SimulatedPolicy
from trace_gym.samplers import UniformSampler


@pytest.fixture(scope="module")
def runner():
    with RolloutRunner("trace_gym/SyntheticTree-v0", SimulatedPolicy(), seed=3) as r:
        yield r


def test_spends_exactly_the_budget_in_groups_of_g(runner):
    budget = Budget(roots=32, continuations_per_root=1, max_per_prompt=8, candidates=40)
    batch = UniformSampler(group_size=8).sample(runner.tasks[:40], runner, budget)
    assert batch.ledger.total().rollouts == budget.total == 64
    assert len(batch.trees) == 8
    assert [t.task.id for t in batch.trees] == [t.id for t in runner.tasks[:8]]
    assert all(len(list(t.leaves())) == 8 for t in batch.trees)
    assert batch.allocations["roots"] == {t.id: 8 for t in runner.tasks[:8]}
    assert batch.ledger.counts() == Ledger.from_trees(batch.trees).counts()


def test_budget_not_divisible_by_group_is_refused(runner):
    budget = Budget(roots=10, continuations_per_root=0, max_per_prompt=8, candidates=40)
    with pytest.raises(BudgetError, match="does not divide it"):
        UniformSampler(group_size=8).sample(runner.tasks[:40], runner, budget)


def test_pool_too_small_is_refused(runner):
    budget = Budget(roots=32, continuations_per_root=1, max_per_prompt=8, candidates=40)
    with pytest.raises(BudgetError, match="needs 8 prompts"):
        UniformSampler(group_size=8).sample(runner.tasks[:5], runner, budget)


def test_group_of_one_is_refused():
    with pytest.raises(ConfigError, match="group_size must be an int >= 2"):
        UniformSampler(group_size=1)


def test_has_no_learned_state():
    sampler = UniformSampler()
    assert sampler.state_dict() == {}
    sampler.load_state_dict({})
