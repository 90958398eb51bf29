"""CI arithmetic against hand-computed cases."""
import math

import pytest

from analysis.stats import t_interval, t_quantile


@pytest.mark.parametrize("df,expected", [(1, 12.7062047), (2, 4.3026527), (4, 2.7764451), (9, 2.2621572), (30, 2.0422725)])
def test_t_quantile_matches_tables(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-6)
    assert t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-6)


def test_t_interval_hand_computed():
    # mean 2, s = 1, n = 3: half-width = t(0.975, 2) / sqrt(3) = 4.3026527 / 1.7320508 = 2.4841377
    iv = t_interval([1.0, 2.0, 3.0])
    assert (iv.mean, iv.n, iv.method) == (2.0, 3, "t")
    assert iv.lo == pytest.approx(2 - 2.4841377, abs=1e-6) and iv.hi == pytest.approx(2 + 2.4841377, abs=1e-6)
    # two seeds 0.30, 0.34: s = 0.0282843, half = 12.7062047 * 0.0282843 / sqrt(2) = 0.2541241
    iv = t_interval([0.30, 0.34])
    assert iv.hi - iv.mean == pytest.approx(0.2541241, abs=1e-6)
    one = t_interval([0.5, math.nan])
    assert (one.mean, one.lo, one.hi, one.method) == (0.5, 0.5, 0.5, "point")
