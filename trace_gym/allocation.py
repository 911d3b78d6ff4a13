"""TRACE's two allocation problems as pure functions (DESIGN section 7).

Zou et al., TRACE, arXiv 2606.11119. Notation follows the paper:

- Stage 1 (global root allocation): choose m_i ∈ {0} ∪ {min_group, …, Mmax} with Σ m_i = M
  maximising Σ V_root(v_i, m_i), V_root(v, m) = 1 − v^m − (1 − v)^m.
- Stage 2 (local prefix expansion): choose K_j ≥ 0 with Σ K_j = budget maximising
  Σ V_pref(v_j, r_j, K_j), V_pref(v, r, k) = 1 − [r·v + (1 − r)(1 − v)]^k.

Both solvers are exact; `tests/test_allocation.py` checks them against brute-force
enumeration. Only numpy and the standard library are used.
"""

from __future__ import annotations

import bisect
import operator

import numpy as np
from numpy.typing import ArrayLike

from trace_gym.errors import BudgetError, ConfigError

__all__ = ["allocate_prefixes", "allocate_roots", "prefix_value", "root_value"]

_TIE_RTOL = 1e-13
"""Stage 1 totals closer than this (relative) count as tied; the fewer active prompts win."""


def root_value(v: ArrayLike, m: ArrayLike) -> np.ndarray:
    """V_root(v, m) = 1 − v^m − (1 − v)^m: the chance that m rollouts are mixed.

    The probability that m rollouts of a prompt with success probability v contain both a
    success and a failure (Zou et al., TRACE, arXiv 2606.11119, Stage 1). It is 0 for
    m ∈ {0, 1} (a skipped prompt, or a group of one, has no contrast) and broadcasts over
    `v` and `m`.

    Args:
        v: Success probabilities in [0, 1].
        m: Rollout counts, integers >= 0.

    Returns:
        float64 array of the broadcast shape of `v` and `m`.

    Raises:
        ConfigError: A probability is NaN or outside [0, 1], a count is negative or not an
            integer, or the shapes do not broadcast.

    Examples:
        >>> root_value([0.5, 0.5, 0.5, 0.25], [0, 1, 2, 3]).tolist()
        [0.0, 0.0, 0.5, 0.5625]
    """
    p = _probabilities("v", v, one_dimensional=False)
    mm = _counts("m", m)
    _broadcast_shape(("v", p), ("m", mm))
    with np.errstate(over="ignore", under="ignore"):
        value = 1.0 - p**mm - (1.0 - p) ** mm
    return np.where(mm <= 1, 0.0, value)


def prefix_value(v: ArrayLike, r: ArrayLike, k: ArrayLike) -> np.ndarray:
    """V_pref(v, r, k) = 1 − q^k, q = r·v + (1 − r)(1 − v): the chance of a flipped outcome.

    The probability that k continuations from a prefix with predicted success probability v
    include one whose reward differs from the observed leaf reward r (Zou et al., TRACE,
    arXiv 2606.11119, Stage 2); q is the chance that one continuation repeats r. Broadcasts
    over `v`, `r` and `k`.

    Args:
        v: Predicted success probabilities of the prefixes, in [0, 1].
        r: Observed rewards of the rollouts the prefixes lie on, in [0, 1] (the paper's are 0
            or 1).
        k: Continuation counts, integers >= 0.

    Returns:
        float64 array of the broadcast shape of `v`, `r` and `k`.

    Raises:
        ConfigError: A probability or reward is NaN or outside [0, 1], a count is negative or
            not an integer, or the shapes do not broadcast.

    Examples:
        >>> prefix_value(0.25, [1, 0], 2).tolist()  # q = 0.25, then q = 0.75
        [0.9375, 0.4375]
    """
    p = _probabilities("v", v, one_dimensional=False)
    rr = _probabilities("r", r, one_dimensional=False)
    kk = _counts("k", k)
    _broadcast_shape(("v", p), ("r", rr), ("k", kk))
    q = _repeat_probability(p, rr)
    with np.errstate(under="ignore"):
        return np.asarray(1.0 - q**kk, dtype=np.float64)


def allocate_roots(v: ArrayLike, budget: int, max_per_prompt: int, min_group: int = 2) -> np.ndarray:
    """Stage 1: the exact optimal split of M root rollouts over candidate prompts.

    Solves (Zou et al., TRACE, arXiv 2606.11119, Stage 1)

        max Σ_i V_root(v_i, m_i)   s.t.   Σ_i m_i = M,   m_i ∈ {0} ∪ {min_group, …, Mmax},

    a multiple-choice knapsack whose items are not concave at the activation step
    0 → min_group, so plain marginal-gain greedy is not exact. This solver is, by two facts:

    1. Activation order. V_root(v, m) = V_root(1 − v, m); with u = min(v, 1 − v) = 1/2 − |v − 1/2|
       and m fixed, it is non-decreasing in u (∂/∂u = m[(1 − u)^(m−1) − u^(m−1)] ≥ 0 on
       [0, 1/2]). So if a prompt with larger u is skipped while one with smaller u is active,
       swapping their counts keeps Σ m_i and does not lower the total: some optimum activates
       exactly the k most mixed prompts, for some k.
    2. Concave filling. Among active prompts, m_i = min_group + x_i and the increments
       Δ_i(m) = V_root(v_i, m + 1) − V_root(v_i, m) = v_i^m (1 − v_i) + (1 − v_i)^m v_i are
       non-increasing in m for m >= 1. A separable concave allocation of T_k = M − k·min_group
       units with boxes x_i ≤ Mmax − min_group is solved exactly by taking the T_k largest
       increments of the pool (Gross 1956).

    The total W(k) is computed for every feasible k in one sweep, since the cut position in
    the globally sorted increment pool only moves one way as k grows: O(P log P) for
    P = B·(Mmax − min_group) increments (a few ms at B = 1024, M = 2048, Mmax = 16; see
    `benchmarks/solver_speed.py`). Powers are built by repeated multiplication, so the
    increments are non-increasing in floating point too.

    Tie rule (deterministic): among totals equal to a relative 1e-13, the fewest active
    prompts win; the active prompts are the most mixed (smallest |v_i − 1/2|, lower index
    first when equal); each extra rollout goes to the largest increment, the more mixed
    (then lower-index) prompt first when increments are equal.

    Args:
        v: Predicted success probabilities of the B candidates, shape (B,), in [0, 1].
        budget: M, the root rollouts to spend, exactly.
        max_per_prompt: Mmax, the most rollouts one prompt may get.
        min_group: The fewest rollouts an active prompt gets (the paper's 2).

    Returns:
        int64 counts m of shape (B,), each 0 or in [min_group, max_per_prompt], sum M.

    Raises:
        ConfigError: `v` is not 1-D or holds NaN or a value outside [0, 1];
            min_group < 1; max_per_prompt < min_group.
        BudgetError: M < 0, or M is not a sum of B group sizes in {0} ∪ [min_group, Mmax].

    Examples:
        >>> allocate_roots([0.5, 0.1, 0.9, 1.0], budget=6, max_per_prompt=4).tolist()
        [4, 2, 0, 0]
        >>> allocate_roots([0.5, 0.1, 0.9, 1.0], budget=5, max_per_prompt=4).tolist()
        [3, 2, 0, 0]
    """
    p = _probabilities("v", v, one_dimensional=True)
    total = _integer("budget", budget)
    m_max = _integer("max_per_prompt", max_per_prompt)
    g = _integer("min_group", min_group)
    if g < 1:
        raise ConfigError(
            f"min_group must be >= 1, got {g}; the paper uses 2 (a group of one has no contrast)."
        )
    if m_max < g:
        raise ConfigError(
            f"max_per_prompt (Mmax={m_max}) must be >= min_group ({g}); raise max_per_prompt "
            "or lower min_group."
        )
    _check_root_budget(total, p.size, m_max, g)
    counts = np.zeros(p.size, dtype=np.int64)
    if total == 0:
        return counts

    # Rank candidates: most mixed first, lower index first among equals (fact 1).
    rank = np.argsort(np.abs(p - 0.5), kind="stable")
    pr = p[rank]
    powers_v = np.cumprod(np.repeat(pr[:, None], m_max, axis=1), axis=1)  # [:, m-1] = v^m
    powers_w = np.cumprod(np.repeat(1.0 - pr[:, None], m_max, axis=1), axis=1)  # (1-v)^m
    activation = 1.0 - powers_v[:, g - 1] - powers_w[:, g - 1]  # V_root(v, g)
    if g == 1:
        activation = np.zeros_like(activation)
    # Δ(m) for m = g .. Mmax-1, one row per ranked candidate.
    steps = (
        powers_v[:, g - 1 : m_max - 1] * (1.0 - pr[:, None]) + powers_w[:, g - 1 : m_max - 1] * pr[:, None]
    )
    # position[c, t]: rank of the increment Δ_c(g + t) in the pool sorted by (−Δ, candidate, m).
    order = np.argsort(-steps.ravel(), kind="stable")
    position = np.empty(order.size, dtype=np.int64)
    position[order] = np.arange(order.size)
    position = position.reshape(steps.shape)  # rows ascending: Δ is non-increasing in m
    k_best, cut = _best_active_count(activation, steps, order, position, total, g, m_max)
    counts[rank[:k_best]] = g + (position[:k_best] < cut).sum(axis=1)
    return counts


def allocate_prefixes(
    v: ArrayLike, r: ArrayLike, budget: int, max_per_prefix: int | None = None
) -> np.ndarray:
    """Stage 2: the exact optimal split of continuations over visited prefixes.

    Solves (Zou et al., TRACE, arXiv 2606.11119, Stage 2)

        max Σ_j V_pref(v_j, r_j, K_j) = Σ_j 1 − q_j^K_j,   q_j = r_j v_j + (1 − r_j)(1 − v_j),
        s.t. Σ_j K_j = budget,   0 ≤ K_j ≤ max_per_prefix.

    Greedy by marginal gain is exact here: the gain of the (k + 1)-th continuation of prefix
    j, V_pref(·, k + 1) − V_pref(·, k) = q_j^k (1 − q_j), is non-increasing in k because
    q_j ∈ [0, 1], so every term is concave in K_j and a separable concave allocation is
    solved by repeatedly taking the largest gain (Gross 1956). The picks are computed in
    vectorised rounds that give exactly the one-at-a-time greedy's result in
    O((n + budget) log budget). A prefix with q = 0 gains 1 from its first continuation and 0
    after; one with q = 1 never gains.

    Tie rule (deterministic): among equal gains, the prefix with fewer continuations so far
    wins, then the lower index. Zero gains (q = 1, or a q = 0 prefix already continued) are
    thus spread round-robin in index order.

    Args:
        v: Predicted success probabilities of the n prefixes, shape (n,), in [0, 1].
        r: Observed rewards of the rollouts through those prefixes, shape (n,), in [0, 1].
        budget: Continuations to spend, exactly (the paper's m_i·N per prompt).
        max_per_prefix: The most continuations one prefix may get; None for no cap.

    Returns:
        int64 counts K of shape (n,), sum `budget`.

    Raises:
        ConfigError: `v` or `r` is not 1-D, their shapes differ, a value is NaN or outside
            [0, 1], or max_per_prefix < 0.
        BudgetError: budget < 0, or budget > n·max_per_prefix (budget > 0 with no prefixes).

    Examples:
        >>> allocate_prefixes([0.9, 0.5, 0.2], r=[1, 1, 0], budget=4).tolist()  # q = 0.9, 0.5, 0.8
        [0, 2, 2]
    """
    p = _probabilities("v", v, one_dimensional=True)
    rr = _probabilities("r", r, one_dimensional=True)
    if p.shape != rr.shape:
        raise ConfigError(
            f"v has shape {p.shape} but r has shape {rr.shape}: give one observed reward per prefix."
        )
    total = _integer("budget", budget)
    n = p.size
    cap = total if max_per_prefix is None else _integer("max_per_prefix", max_per_prefix)
    if total < 0:
        raise BudgetError(f"budget must be >= 0 continuations, got {total}.")
    if cap < 0:
        raise ConfigError(f"max_per_prefix must be >= 0 or None, got {cap}.")
    if total > n * cap:
        if n == 0:
            raise BudgetError(
                f"budget={total} continuations but there are no prefixes to continue; "
                "pass budget=0 when no prefix was visited."
            )
        raise BudgetError(
            f"budget={total} continuations exceeds {n} prefixes × max_per_prefix={cap} = {n * cap}; "
            "raise max_per_prefix (or pass None) or lower the budget."
        )
    counts = _take_positive_gains(_repeat_probability(p, rr), total, cap)
    left = total - int(counts.sum())
    if left:
        _spread_zero_gains(counts, left, cap)
    return counts


def _best_active_count(
    activation: np.ndarray,
    steps: np.ndarray,
    order: np.ndarray,
    position: np.ndarray,
    total: int,
    g: int,
    m_max: int,
) -> tuple[int, int]:
    """The best number k of active (ranked) candidates, and the cut in the sorted pool for it.

    W(k) = Σ_{c<k} V_root(v_c, g) + (sum of the T_k = M − k·g largest increments of
    candidates c < k). With the pool sorted once (`order`, `position`), the T_k largest are
    the items of candidates c < k before a cut position, and that cut never moves right as k
    grows (the pool grows while T_k shrinks), so one sweep finds W(k) for every k.
    """
    n, width = steps.shape
    prefix_sums = np.concatenate([np.zeros((n, 1)), np.cumsum(steps, axis=1)], axis=1).tolist()
    rows = position.tolist()
    owner = (order // max(width, 1)).tolist()
    gains = steps.ravel()[order].tolist()
    activated = np.cumsum(activation).tolist()

    k_low = -(-total // m_max)
    cut, taken, pool = order.size, 0, 0.0  # items before `cut` of candidates < k: `taken`, sum `pool`
    totals: list[float] = []
    cuts: list[int] = []
    for k in range(1, min(n, total // g) + 1):
        c = k - 1
        inside = bisect.bisect_left(rows[c], cut)
        taken += inside
        pool += prefix_sums[c][inside]
        target = total - k * g
        while taken > target:
            cut -= 1
            if owner[cut] < k:
                taken -= 1
                pool -= gains[cut]
        if k >= k_low:
            totals.append(activated[c] + pool)
            cuts.append(cut)
    best = max(totals)
    tolerance = _TIE_RTOL * max(1.0, abs(best))
    i = next(i for i, w in enumerate(totals) if w >= best - tolerance)
    return k_low + i, cuts[i]


def _take_positive_gains(q: np.ndarray, total: int, cap: int) -> np.ndarray:
    """The greedy's picks while gains are positive: the first `total` items by (−gain, k, j).

    Item (j, k) is the (k + 1)-th continuation of prefix j, with gain g_j(k) = (1 − q_j) q_j^k
    built by repeated multiplication, so it is non-increasing in k in floating point too and
    the first items of the union take a leading run of each row. Rows are built lazily: while
    a prefix has every built item taken, its next one might be taken too, so its row is
    doubled; a row ends at its first zero gain or at `cap`. Each round costs O(items built),
    and a doubled row was fully taken, so at most `total` items are added per round.
    """
    n = q.size
    gains, steps, owners = np.empty(0), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    taken = np.zeros(n, dtype=np.int64)
    frontier = np.arange(n)  # prefixes whose rows grow this round; all have `depth` items built
    following = 1.0 - q  # gain of each prefix's first item not built yet
    depth, width = 0, min(cap, -(-total // max(n, 1)) + 1)
    while frontier.size and width > 0 and total > 0:
        factors = np.empty((frontier.size, width))
        factors[:, 0] = following[frontier]
        factors[:, 1:] = q[frontier, None]
        block = np.cumprod(factors, axis=1)  # the sequential products the greedy would form
        following[frontier] = block[:, -1] * q[frontier]
        rows, cols = np.nonzero(block > 0.0)
        gains = np.concatenate([gains, block[rows, cols]])
        steps = np.concatenate([steps, depth + cols])
        owners = np.concatenate([owners, frontier[rows]])
        depth += width
        taken = np.bincount(owners[_first_items(gains, steps, owners, total)], minlength=n)
        frontier = frontier[(block[:, -1] > 0.0) & (taken[frontier] == depth)]
        width = min(depth, cap - depth)
    return taken


def _first_items(gains: np.ndarray, steps: np.ndarray, owners: np.ndarray, count: int) -> np.ndarray:
    """Indices of the first `count` items (all if fewer) in (−gain, step, owner) order."""
    if gains.size <= count:
        return np.arange(gains.size)
    threshold = np.partition(gains, gains.size - count)[gains.size - count]  # count-th largest
    above = np.flatnonzero(gains > threshold)
    tied = np.flatnonzero(gains == threshold)
    tied = tied[np.lexsort((owners[tied], steps[tied]))][: count - above.size]
    return np.concatenate([above, tied])


def _spread_zero_gains(counts: np.ndarray, left: int, cap: int) -> None:
    """Give `left` zero-gain continuations in (count so far, index) order, in place.

    This is what the greedy's heap does one by one once every gain left is 0: fill level by
    level (no prefix below `cap` gets its (L + 2)-th continuation before every such prefix has
    L + 1), lower index first within a level.
    """
    room = cap - counts

    def filled(level: int) -> np.ndarray:  # continuations that bring each prefix up to `level`
        return np.asarray(np.clip(level - counts, 0, room), dtype=np.int64)

    low, high = int(counts.min()), cap  # filled(low) is all 0; find the top level that fits
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if int(filled(mid).sum()) <= left else (low, mid - 1)
    add = filled(low)
    counts += add
    rest = left - int(add.sum())
    if rest:  # part of the next level, lower index first
        counts[np.flatnonzero(counts == low)[:rest]] += 1


def _repeat_probability(p: np.ndarray, r: np.ndarray) -> np.ndarray:
    """The repeat probability q = r·v + (1 − r)(1 − v): one continuation repeats reward r."""
    return np.asarray(np.clip(r * p + (1.0 - r) * (1.0 - p), 0.0, 1.0), dtype=np.float64)


def _check_root_budget(total: int, n: int, m_max: int, g: int) -> None:
    """Raise BudgetError unless M is a sum of n group sizes in {0} ∪ [g, Mmax]."""
    if total < 0:
        raise BudgetError(f"budget (M={total}) must be >= 0 root rollouts.")
    if total > n * m_max:
        raise BudgetError(
            f"budget (M={total}) cannot be spent on {n} candidates with at most max_per_prompt={m_max} "
            f"rollouts each (at most {n * m_max}). Lower the budget, or add candidates or raise "
            "max_per_prompt."
        )
    k_high = min(n, total // g)  # most prompts that fit at g rollouts each
    if k_high * m_max >= total:  # some k <= k_high has k·g <= M <= k·Mmax
        return
    below = k_high * m_max
    k_above = -(-total // m_max)
    above = max(total, k_above * g)
    raise BudgetError(
        f"budget (M={total}) is not a sum of group sizes in {{0}} ∪ [{g}, {m_max}] over {n} candidates "
        f"(an active prompt gets between min_group={g} and max_per_prompt={m_max} rollouts); the nearest "
        f"budgets that can be spent are {below} and {above}. Use one of them, or lower min_group or "
        "raise max_per_prompt."
    )


def _integer(name: str, value: object) -> int:
    """`value` as an int; ConfigError for bools, floats and other non-integers."""
    if isinstance(value, bool | np.bool_):
        raise ConfigError(f"{name} must be an int, got {value!r}.")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(f"{name} must be an int, got {value!r}.") from None


def _probabilities(name: str, x: ArrayLike, *, one_dimensional: bool) -> np.ndarray:
    """`x` as float64, checked to lie in [0, 1]; the first offender is named in the error."""
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{name} must be an array of probabilities in [0, 1]: {err}") from None
    if one_dimensional and arr.ndim != 1:
        raise ConfigError(f"{name} must be 1-D (one value per candidate), got shape {arr.shape}.")
    bad = ~((arr >= 0.0) & (arr <= 1.0))  # NaN fails both comparisons
    if bad.any():
        flat = int(np.flatnonzero(bad.ravel())[0])
        where = "" if arr.ndim == 0 else f"[{', '.join(map(str, np.unravel_index(flat, arr.shape)))}]"
        value = float(arr.ravel()[flat])
        raise ConfigError(
            f"{name}{where} = {value!r} is not a probability in [0, 1]; check the predictor's "
            "output (clip it, or drop NaN predictions) before allocating."
        )
    return arr


def _counts(name: str, x: ArrayLike) -> np.ndarray:
    """`x` as int64 counts >= 0; ConfigError for negative or fractional values."""
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{name} must be an array of counts: {err}") from None
    if arr.dtype.kind not in "iuf" or (arr.dtype.kind == "f" and not np.all(arr == np.round(arr))):
        raise ConfigError(f"{name} must hold integer counts >= 0, got {x!r}.")
    counts = arr.astype(np.int64)
    if (counts < 0).any():
        raise ConfigError(f"{name} must hold integer counts >= 0, got {x!r}.")
    return counts


def _broadcast_shape(*arrays: tuple[str, np.ndarray]) -> tuple[int, ...]:
    """The common shape of named arrays; ConfigError naming their shapes when there is none."""
    try:
        return np.broadcast_shapes(*(a.shape for _, a in arrays))
    except ValueError:
        shapes = ", ".join(f"{name} {a.shape}" for name, a in arrays)
        raise ConfigError(f"shapes do not broadcast: {shapes}.") from None
