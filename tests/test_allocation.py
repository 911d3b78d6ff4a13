"""Stage 1 and Stage 2 solvers against independent oracles: brute force, a DP, a naive greedy."""

from __future__ import annotations

import doctest
import heapq
import itertools
from functools import cache

import numpy as np
import pytest

from trace_gym import allocation
from trace_gym.allocation import allocate_prefixes, allocate_roots, prefix_value, root_value
from trace_gym.errors import BudgetError, ConfigError

TOL = 1e-12


def random_probabilities(rng: np.random.Generator, n: int) -> np.ndarray:
    """Uniform draws mixed with the edge cases 0, 1 and 0.5."""
    v = rng.random(n)
    special = rng.random(n) < 0.4
    v[special] = rng.choice([0.0, 1.0, 0.5], size=int(special.sum()))
    return v


# --- formulas ------------------------------------------------------------------------------


def test_root_value_known_values():
    assert root_value(0.5, 2) == 0.5
    assert root_value(0.5, 3) == 0.75
    assert root_value(0.25, 2) == 0.375  # 1 - 1/16 - 9/16
    assert root_value(0.75, 3) == 0.5625  # 1 - 27/64 - 1/64


def test_root_value_is_zero_without_contrast():
    v = np.linspace(0.0, 1.0, 11)
    assert np.all(root_value(v, 0) == 0.0)
    assert np.all(root_value(v, 1) == 0.0)
    assert np.all(root_value([0.0, 1.0], 7) == 0.0)


def test_root_value_symmetric_and_broadcasts():
    v = np.array([0.1, 0.3, 0.5])
    m = np.arange(6)[:, None]
    out = root_value(v, m)
    assert out.shape == (6, 3)
    np.testing.assert_allclose(out, root_value(1.0 - v, m), atol=1e-15)
    expected = 1.0 - v[None, :] ** m - (1.0 - v[None, :]) ** m
    np.testing.assert_allclose(out[2:], expected[2:], atol=1e-15)


def test_root_value_concave_from_one():
    v = np.linspace(0.0, 1.0, 21)
    steps = np.diff(root_value(v, np.arange(1, 30)[:, None]), axis=0)
    assert np.all(steps >= 0.0)
    assert np.all(np.diff(steps, axis=0) <= 1e-16)


def test_prefix_value_known_values():
    assert prefix_value(0.25, 1, 2) == 1.0 - 0.25**2  # r = 1: q = v
    assert prefix_value(0.25, 0, 2) == 1.0 - 0.75**2  # r = 0: q = 1 - v
    assert prefix_value(0.7, 1, 0) == 0.0
    assert prefix_value(0.0, 1, 1) == 1.0  # q = 0: the first continuation flips surely
    assert prefix_value(1.0, 1, 5) == 0.0  # q = 1: nothing ever flips
    assert prefix_value([0.2, 0.9], [1, 0], [[1], [2]]).shape == (2, 2)


# --- Stage 1: brute force and DP -----------------------------------------------------------


@cache
def root_combinations(n: int, m_max: int, g: int) -> np.ndarray:
    options = [0, *range(g, m_max + 1)]
    return np.array(list(itertools.product(options, repeat=n)), dtype=np.int64).reshape(-1, n)


def brute_force_roots(v: np.ndarray, m_max: int, g: int) -> dict[int, float]:
    """The optimum of every spendable budget, by enumeration."""
    combos = root_combinations(v.size, m_max, g)
    values = root_value(v[None, :], combos).sum(axis=1)
    sums = combos.sum(axis=1)
    return {int(b): float(values[sums == b].max()) for b in np.unique(sums)}


def dp_roots(v: np.ndarray, total: int, m_max: int, g: int) -> float:
    """The optimum by the multiple-choice knapsack DP over total rollouts."""
    options = np.array([0, *range(g, m_max + 1)])
    best = np.full(total + 1, -np.inf)
    best[0] = 0.0
    for vi in v:
        new = np.full(total + 1, -np.inf)
        for m, value in zip(options, root_value(vi, options), strict=True):
            if m > total:
                break
            new[m:] = np.maximum(new[m:], best[: total + 1 - m] + value)
        best = new
    return float(best[total])


def check_roots(m: np.ndarray, v: np.ndarray, total: int, m_max: int, g: int) -> float:
    assert m.dtype == np.int64 and m.shape == v.shape
    assert m.sum() == total
    assert np.all((m == 0) | ((m >= g) & (m <= m_max)))
    return float(root_value(v, m).sum())


def test_roots_match_brute_force():
    rng = np.random.default_rng(20260611)
    checked = 0
    for _ in range(1000):
        n = int(rng.integers(1, 6))
        m_max = int(rng.integers(2, 6))
        g = int(rng.choice([1, 2, 2, 2, 3])) if m_max >= 3 else int(rng.integers(1, 3))
        v = random_probabilities(rng, n)
        optimum = brute_force_roots(v, m_max, g)
        for total in range(n * m_max + 1):
            if total not in optimum:
                with pytest.raises(BudgetError, match="is not a sum of group sizes"):
                    allocate_roots(v, total, m_max, g)
                continue
            m = allocate_roots(v, total, m_max, g)
            assert abs(check_roots(m, v, total, m_max, g) - optimum[total]) <= TOL, (v, total, m_max, g, m)
            checked += 1
    assert checked > 5000


def test_roots_match_dp_on_larger_cases():
    rng = np.random.default_rng(7)
    for _ in range(60):
        n = int(rng.integers(5, 40))
        m_max = int(rng.integers(2, 17))
        g = int(rng.choice([1, 2, 2, 3])) if m_max >= 3 else 2
        v = random_probabilities(rng, n)
        k = int(rng.integers(1, n + 1))
        total = int(rng.integers(k * g, k * m_max + 1))
        m = allocate_roots(v, total, m_max, g)
        expected = dp_roots(v, total, m_max, g)
        assert abs(check_roots(m, v, total, m_max, g) - expected) <= TOL * max(1.0, expected)


def greedy_roots(v: np.ndarray, total: int, m_max: int, g: int) -> np.ndarray:
    """Marginal-gain greedy per rollout, activation as one g-rollout step: not exact."""
    m = np.zeros(v.size, dtype=np.int64)
    left = total
    while left:
        best, pick = -1.0, -1
        for i in range(v.size):
            step = g if m[i] == 0 else 1
            if step <= left and m[i] + step <= m_max:
                gain = float(root_value(v[i], m[i] + step) - root_value(v[i], m[i])) / step
                if gain > best:
                    best, pick = gain, i
        m[pick] += g if m[pick] == 0 else 1
        left -= g if m[pick] == g else 1
    return m


def test_greedy_is_not_exact_for_roots():
    v = np.array([0.5, 0.45])
    greedy = greedy_roots(v, 4, 4, 2)
    assert greedy.tolist() == [4, 0]  # activates 0, then Δ = 0.25 beats 2·0.45·0.55/2 = 0.2475
    exact = allocate_roots(v, 4, 4, 2)
    assert exact.tolist() == [2, 2]
    assert root_value(v, greedy).sum() == pytest.approx(0.875)
    assert root_value(v, exact).sum() == pytest.approx(0.995)


# --- Stage 1: ties, determinism, edge cases ------------------------------------------------


def test_roots_tie_rule():
    # Equal candidates: lower index first, for activation and for extra rollouts.
    assert allocate_roots([0.3, 0.3, 0.3], 4, 4).tolist() == [2, 2, 0]
    assert allocate_roots([0.3, 0.3, 0.3], 5, 4).tolist() == [3, 2, 0]
    # Mirror images are equally mixed: 0.25 (index 0) before 0.75 (index 1).
    assert allocate_roots([0.25, 0.75], 3, 3).tolist() == [3, 0]
    # Rollouts that add nothing (v in {0, 1}): the fewest active prompts, most mixed first.
    assert allocate_roots([0.0, 0.5, 1.0, 0.0], 8, 4).tolist() == [4, 4, 0, 0]
    assert allocate_roots([0.0, 1.0, 0.0], 4, 2).tolist() == [2, 2, 0]


def test_roots_deterministic_and_permutation_invariant():
    rng = np.random.default_rng(3)
    v = rng.choice([0.1, 0.35, 0.5, 0.8, 1.0], size=200)
    first = allocate_roots(v, 700, 8)
    assert np.array_equal(first, allocate_roots(v.copy(), 700, 8))
    value = root_value(v, first).sum()
    for _ in range(5):
        perm = rng.permutation(v.size)
        m = allocate_roots(v[perm], 700, 8)
        assert root_value(v[perm], m).sum() == pytest.approx(value, abs=1e-9)
        # Equal values get the same multiset of counts.
        for value_class in np.unique(v):
            assert sorted(m[v[perm] == value_class]) == sorted(first[v == value_class])


def test_roots_full_budget_and_zero_budget():
    assert allocate_roots([], 0, 4).tolist() == []
    assert allocate_roots([0.2, 0.6], 0, 4).tolist() == [0, 0]
    assert allocate_roots([0.2, 0.6], 8, 4).tolist() == [4, 4]
    assert allocate_roots([0.2, 0.6], 1, 4, min_group=1).tolist() == [0, 1]


def test_roots_match_dp_at_benchmark_size():
    rng = np.random.default_rng(11)
    v = random_probabilities(rng, 1024)
    m = allocate_roots(v, 2048, 16)
    assert check_roots(m, v, 2048, 16, 2) == pytest.approx(dp_roots(v, 2048, 16, 2), rel=TOL)


def test_docstring_examples():
    result = doctest.testmod(allocation)
    assert result.attempted >= 4 and result.failed == 0


# --- Stage 1: bad input --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("v", "match"),
    [
        ([0.2, float("nan")], r"v\[1\] = nan is not a probability in \[0, 1\]"),
        ([0.2, 0.4, 1.5], r"v\[2\] = 1.5 is not a probability"),
        ([-0.1], r"v\[0\] = -0.1 is not a probability"),
        ([[0.5]], r"v must be 1-D"),
    ],
)
def test_roots_bad_probabilities(v, match):
    with pytest.raises(ConfigError, match=match):
        allocate_roots(v, 2, 4)


def test_roots_bad_budgets():
    with pytest.raises(BudgetError, match=r"budget \(M=-1\) must be >= 0"):
        allocate_roots([0.5], -1, 4)
    with pytest.raises(BudgetError, match=r"M=9\) cannot be spent on 2 candidates .* \(at most 8\)"):
        allocate_roots([0.5, 0.5], 9, 4)
    with pytest.raises(BudgetError, match=r"cannot be spent on 0 candidates"):
        allocate_roots([], 2, 4)
    with pytest.raises(
        BudgetError, match=r"M=1\) is not a sum .* nearest budgets that can be spent are 0 and 2"
    ):
        allocate_roots([0.5, 0.5], 1, 4)
    with pytest.raises(BudgetError, match=r"M=5\) is not a sum .*\[3, 4\].* are 4 and 6"):
        allocate_roots([0.5] * 3, 5, 4, min_group=3)
    with pytest.raises(BudgetError, match="lower min_group or raise max_per_prompt"):
        allocate_roots([0.5] * 3, 5, 4, min_group=3)


def test_roots_bad_config():
    with pytest.raises(ConfigError, match="min_group must be >= 1, got 0"):
        allocate_roots([0.5], 2, 4, min_group=0)
    with pytest.raises(ConfigError, match=r"max_per_prompt \(Mmax=1\) must be >= min_group \(2\)"):
        allocate_roots([0.5], 2, 1)
    with pytest.raises(ConfigError, match=r"budget must be an int, got 2\.0"):
        allocate_roots([0.5], 2.0, 4)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="budget must be an int, got True"):
        allocate_roots([0.5], True, 4)


def test_value_functions_bad_input():
    with pytest.raises(ConfigError, match="m must hold integer counts >= 0"):
        root_value(0.5, -1)
    with pytest.raises(ConfigError, match="k must hold integer counts >= 0"):
        prefix_value(0.5, 1, 1.5)
    with pytest.raises(ConfigError, match=r"shapes do not broadcast: v \(2,\), m \(3,\)"):
        root_value([0.1, 0.2], [1, 2, 3])
    with pytest.raises(ConfigError, match=r"r\[1\] = 2.0 is not a probability"):
        prefix_value(0.5, [1, 2], 1)


# --- Stage 2 -------------------------------------------------------------------------------


@cache
def prefix_combinations(n: int, upper: int) -> np.ndarray:
    return np.array(list(itertools.product(range(upper + 1), repeat=n)), dtype=np.int64).reshape(-1, n)


def greedy_prefixes_reference(v, r, total, cap):
    """One continuation at a time to the largest gain, then fewer so far, then lower index."""
    q = [float(x) for x in np.clip(np.asarray(r) * v + (1 - np.asarray(r)) * (1 - np.asarray(v)), 0, 1)]
    k = [0] * len(q)
    gain = [1.0 - x for x in q]
    for _ in range(total):
        j = max((j for j in range(len(q)) if cap is None or k[j] < cap), key=lambda j: (gain[j], -k[j], -j))
        k[j] += 1
        gain[j] *= q[j]
    return k


def test_prefixes_match_brute_force():
    rng = np.random.default_rng(2606)
    checked = 0
    for _ in range(1000):
        n = int(rng.integers(1, 6))
        v = random_probabilities(rng, n)
        r = rng.integers(0, 2, size=n).astype(float)
        cap = None if rng.random() < 0.4 else int(rng.integers(1, 5))
        combos = prefix_combinations(n, 8 if cap is None else cap)
        values = prefix_value(v[None, :], r[None, :], combos).sum(axis=1)
        sums = combos.sum(axis=1)
        for total in range(9):
            if cap is not None and total > n * cap:
                with pytest.raises(BudgetError, match=f"exceeds {n} prefixes"):
                    allocate_prefixes(v, r, total, cap)
                continue
            k = allocate_prefixes(v, r, total, cap)
            assert k.dtype == np.int64 and k.shape == (n,)
            assert k.sum() == total and k.min() >= 0
            assert cap is None or k.max() <= cap
            optimum = values[sums == total].max()
            assert abs(prefix_value(v, r, k).sum() - optimum) <= TOL, (v, r, total, cap, k)
            checked += 1
    assert checked > 5000


def test_prefixes_follow_the_greedy_tie_rule_exactly():
    rng = np.random.default_rng(5)
    for _ in range(300):
        n = int(rng.integers(1, 9))
        v = rng.choice([0.0, 0.5, 1.0, 0.3, 0.9], size=n)
        r = rng.integers(0, 2, size=n)
        cap = None if rng.random() < 0.5 else int(rng.integers(1, 6))
        total = int(rng.integers(0, n * (cap or 6) + 1))
        expected = greedy_prefixes_reference(v, r, total, cap)
        assert allocate_prefixes(v, r, total, cap).tolist() == expected, (v, r, total, cap)


def heap_greedy_prefixes(q: np.ndarray, total: int, cap: int | None) -> list[int]:
    """The textbook heap greedy on keys (-gain, continuations so far, index)."""
    cap = total if cap is None else cap
    counts = [0] * q.size
    heap = [(-(1.0 - x), 0, j) for j, x in enumerate(q.tolist())] if cap else []
    heapq.heapify(heap)
    for _ in range(total):
        neg_gain, k, j = heapq.heappop(heap)
        counts[j] = k + 1
        if k + 1 < cap:
            heapq.heappush(heap, (neg_gain * q[j], k + 1, j))
    return counts


@pytest.mark.parametrize(
    ("n", "total", "cap", "kind"),
    [
        (300, 150, None, "uniform"),
        (300, 2000, None, "uniform"),
        (50, 3000, 100, "near_one"),  # deep rows: several doubling rounds
        (4, 5000, None, "near_one"),
        (3, 5000, None, "half"),  # gains underflow to 0 after ~1075 picks, then the level fill
        (40, 900, 30, "mixed"),
        (200, 199, 1, "mixed"),
    ],
)
def test_prefixes_match_heap_greedy_on_larger_cases(n, total, cap, kind):
    rng = np.random.default_rng(n * 7919 + total)
    v = {
        "uniform": rng.random(n),
        "near_one": 1.0 - rng.random(n) * 1e-3,
        "half": np.full(n, 0.5),
        "mixed": rng.choice([0.0, 0.5, 1.0, 0.999, 0.3], size=n),
    }[kind]
    r = np.ones(n)  # q = v
    k = allocate_prefixes(v, r, total, cap)
    assert k.tolist() == heap_greedy_prefixes(v, total, cap)


def test_prefixes_tie_rule_and_edge_gains():
    # q = 1 everywhere: nothing to gain, spread round-robin by index.
    assert allocate_prefixes([1.0, 1.0, 1.0], [1, 1, 1], 7).tolist() == [3, 2, 2]
    # q = 0 gains 1 once, then 0: one each first, then round-robin.
    assert allocate_prefixes([0.0, 0.0], [1, 1], 2).tolist() == [1, 1]
    assert allocate_prefixes([0.0, 1.0, 1.0], [1, 1, 1], 7, max_per_prefix=3).tolist() == [3, 2, 2]
    # Equal gains: fewer so far, then lower index.
    assert allocate_prefixes([0.5, 0.5], [1, 1], 3).tolist() == [2, 1]
    # Large budgets on q = 1 take the level-filling path.
    assert allocate_prefixes(np.ones(4), np.ones(4), 10**6 + 2).tolist() == [250001] * 2 + [250000] * 2


def test_prefixes_deterministic_and_permutation_invariant():
    rng = np.random.default_rng(9)
    v = rng.choice([0.0, 0.2, 0.5, 0.7, 1.0], size=300)
    r = rng.integers(0, 2, size=300)
    first = allocate_prefixes(v, r, 500)
    assert np.array_equal(first, allocate_prefixes(v.copy(), r.copy(), 500))
    for _ in range(3):
        perm = rng.permutation(v.size)
        k = allocate_prefixes(v[perm], r[perm], 500)
        assert prefix_value(v[perm], r[perm], k).sum() == pytest.approx(
            prefix_value(v, r, first).sum(), abs=1e-9
        )


def test_prefixes_empty():
    assert allocate_prefixes([], [], 0).tolist() == []
    assert allocate_prefixes([0.5], [1], 0, max_per_prefix=0).tolist() == [0]


def test_prefixes_bad_input():
    with pytest.raises(BudgetError, match="budget=3 continuations but there are no prefixes"):
        allocate_prefixes([], [], 3)
    with pytest.raises(
        BudgetError, match=r"budget=5 continuations exceeds 2 prefixes × max_per_prefix=2 = 4"
    ):
        allocate_prefixes([0.5, 0.5], [1, 0], 5, max_per_prefix=2)
    with pytest.raises(BudgetError, match="budget must be >= 0 continuations, got -1"):
        allocate_prefixes([0.5], [1], -1)
    with pytest.raises(ConfigError, match="max_per_prefix must be >= 0 or None, got -1"):
        allocate_prefixes([0.5], [1], 1, max_per_prefix=-1)
    with pytest.raises(ConfigError, match=r"v has shape \(2,\) but r has shape \(3,\)"):
        allocate_prefixes([0.5, 0.5], [1, 0, 1], 1)
    with pytest.raises(ConfigError, match=r"v\[1\] = nan is not a probability"):
        allocate_prefixes([0.5, float("nan")], [1, 0], 1)
    with pytest.raises(ConfigError, match=r"r\[0\] = -1.0 is not a probability"):
        allocate_prefixes([0.5, 0.5], [-1, 0], 1)
