import math

import numpy as np
import pytest

from trace_gym import ConfigError
from trace_gym.metrics import brier_score, expected_calibration_error


def _ece_by_loops(p, y, w, bins):
    """An independent ECE: loop over bins with explicit edges."""
    total = sum(w)
    ece = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        members = [i for i in range(len(p)) if lo <= p[i] < hi or (b == bins - 1 and p[i] == 1.0)]
        weight = sum(w[i] for i in members)
        if weight == 0:
            continue
        mean_p = sum(w[i] * p[i] for i in members) / weight
        mean_y = sum(w[i] * y[i] for i in members) / weight
        ece += weight / total * abs(mean_y - mean_p)
    return ece


def test_brier_hand_computed():
    assert brier_score([0.8, 0.4], [1.0, 0.0]) == pytest.approx((0.04 + 0.16) / 2)
    assert brier_score([0.5], [0.25]) == 0.0625  # soft target


def test_brier_respects_weights():
    # weight 3 on the first example: (3 * 0.04 + 1 * 0.16) / 4
    assert brier_score([0.8, 0.4], [1.0, 0.0], [3.0, 1.0]) == pytest.approx(0.07)
    assert brier_score([0.8, 0.4], [1.0, 0.0], [1.0, 0.0]) == pytest.approx(0.04)
    # integer weights equal repeating the examples
    assert brier_score([0.8, 0.4], [1.0, 0.0], [2, 1]) == pytest.approx(
        brier_score([0.8, 0.8, 0.4], [1, 1, 0])
    )


def test_empty_or_weightless_gives_nan():
    assert math.isnan(brier_score([], []))
    assert math.isnan(expected_calibration_error([], []))
    assert math.isnan(brier_score([0.5], [1.0], [0.0]))
    assert math.isnan(expected_calibration_error([0.5], [1.0], [0.0]))


def test_ece_hand_computed():
    # bins of width 0.5: bin 0 holds p = 0.25, 0.25 (targets 0, 1), bin 1 holds p = 0.75, 0.75 (targets 1, 1)
    p, y = [0.25, 0.25, 0.75, 0.75], [0.0, 1.0, 1.0, 1.0]
    assert expected_calibration_error(p, y, bins=2) == pytest.approx(0.5 * 0.25 + 0.5 * 0.25)
    # one bin: |mean target - mean prediction|
    assert expected_calibration_error(p, y, bins=1) == pytest.approx(abs(0.75 - 0.5))


def test_ece_respects_weights():
    p, y = [0.25, 0.25, 0.75], [0.0, 1.0, 1.0]
    # bin 0 has weight 1 + 3 (mean target 0.75, gap 0.5); bin 1 has weight 4 (gap 0.25)
    expected = 4 / 8 * 0.5 + 4 / 8 * 0.25
    assert expected_calibration_error(p, y, [1.0, 3.0, 4.0], bins=2) == pytest.approx(expected)


def test_perfect_calibration_has_zero_ece():
    # within each bin the mean target equals the mean prediction
    p = [0.15, 0.15, 0.15, 0.15, 0.55, 0.55, 0.95, 1.0]
    y = [0.0, 0.0, 0.6, 0.0, 0.3, 0.8, 0.95, 1.0]
    assert expected_calibration_error(p, y) == pytest.approx(0.0, abs=1e-12)
    assert expected_calibration_error(p, p) == 0.0
    assert brier_score(p, p) == 0.0


def test_edges_fall_in_the_right_bins():
    # p = 1.0 joins the last bin (with 0.95): one gap |0.95 - 0.975|, not two
    assert expected_calibration_error([1.0, 0.95], [0.9, 1.0], bins=10) == pytest.approx(0.025)
    # p = 0.5 opens the second of two bins: gaps 0.5 and -0.1 do not cancel
    assert expected_calibration_error([0.5, 0.1], [1.0, 0.0], bins=2) == pytest.approx(0.3)


@pytest.mark.parametrize("seed", range(5))
def test_ece_matches_a_loop_implementation(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    p = rng.random(n).round(2)  # repeated values and bin edges happen
    y = rng.random(n)
    w = rng.integers(0, 4, n).astype(float)
    w[0] = 1.0
    bins = int(rng.integers(1, 15))
    assert expected_calibration_error(p, y, w, bins) == pytest.approx(_ece_by_loops(p, y, w, bins))
    assert brier_score(p, y, w) == pytest.approx(np.average((p - y) ** 2, weights=w))


def test_bad_inputs_are_refused():
    with pytest.raises(ConfigError, match="got lengths 2, 1 and 2"):
        brier_score([0.1, 0.2], [1.0])
    with pytest.raises(ConfigError, match="weights must be >= 0"):
        expected_calibration_error([0.1], [1.0], [-1.0])
    with pytest.raises(ConfigError, match=r"prediction 1 is 1\.5"):
        expected_calibration_error([0.1, 1.5], [1.0, 0.0])
    with pytest.raises(ConfigError, match="bins must be an int >= 1"):
        expected_calibration_error([0.1], [1.0], bins=0)
