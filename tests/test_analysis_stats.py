"""CI and bootstrap arithmetic against hand-computed cases."""
import math

import numpy as np
import pytest

from analysis import stats
from analysis.stats import bootstrap_means, paired_bootstrap, percentile_limits, t_interval, t_quantile


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


def test_bootstrap_two_values_hits_the_exact_percentiles():
    # Resample means of [0, 1] are 0, 0.5, 1 with probability 1/4, 1/2, 1/4: 2.5% -> 0, 97.5% -> 1.
    assert percentile_limits(bootstrap_means([0.0, 1.0], n_boot=4000, seed=0), 0.95) == (0.0, 1.0)
    boot = bootstrap_means([0.0, 1.0], n_boot=20000, seed=1)
    assert (boot == 0.5).mean() == pytest.approx(0.5, abs=0.02)


def test_bootstrap_is_seeded_and_chunking_does_not_change_it(monkeypatch):
    x = np.arange(50, dtype=float) % 3
    a = bootstrap_means(x, 500, seed=7)
    assert np.array_equal(a, bootstrap_means(x, 500, seed=7))
    assert not np.array_equal(a, bootstrap_means(x, 500, seed=8))
    # The same draws as a naive one-resample-at-a-time loop with the same generator.
    rng = np.random.default_rng(7)
    naive = np.array([x[rng.integers(0, x.size, size=x.size)].mean() for _ in range(500)])
    assert np.allclose(a, naive)
    monkeypatch.setattr(stats, "_MAX_CELLS", 120)  # 2 resamples per chunk
    assert np.allclose(bootstrap_means(x, 500, seed=7), a)


def test_constant_data_gives_degenerate_interval():
    lo, hi = percentile_limits(bootstrap_means([0.4] * 20, n_boot=300, seed=0), 0.95)
    assert lo == pytest.approx(0.4) and hi == pytest.approx(0.4)


def test_paired_bootstrap_hand_cases():
    # a − b is exactly 0.1 everywhere: delta 0.1, CI collapses.
    r = paired_bootstrap([1.0, 2.0, 3.0], [0.9, 1.9, 2.9], n_boot=500)
    assert r.delta == pytest.approx(0.1) and r.lo == pytest.approx(0.1) and r.hi == pytest.approx(0.1)
    assert r.n == 3 and r.p_le_zero == 0.0
    # differences [0, 1]: delta 0.5, CI [0, 1], P(boot <= 0) = 1/4.
    r = paired_bootstrap([1.0, 1.0], [1.0, 0.0], n_boot=20000, seed=3)
    assert (r.delta, r.lo, r.hi) == (0.5, 0.0, 1.0)
    assert r.p_le_zero == pytest.approx(0.25, abs=0.02)
    # Pairing matters: a shared per-example offset cancels, unpaired it would dominate the CI.
    base = np.linspace(0, 10, 40)
    r = paired_bootstrap(base + 0.5, base, n_boot=300)
    assert r.hi - r.lo == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="equal lengths"):
        paired_bootstrap([1.0], [1.0, 2.0])
