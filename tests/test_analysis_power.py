"""Design power against seeded simulations, and the simultaneous band's coverage under the null."""
import json
import math

import numpy as np
import pytest
from scipy.stats import norm
from test_analysis_helpers import make_run, write_eval

from analysis import power
from launch.analyze import run_analysis

STUDIES = 4000


def _simulated_power(rng, c: power.Components, effect: float, items: int, seeds: int, alpha: float = 0.05) -> float:
    """Studies drawn from the variance model itself (Gaussian components), each tested with its true SE."""
    u = rng.normal(0, math.sqrt(c.item), size=(STUDIES, items, 1))
    v = rng.normal(0, math.sqrt(c.seed), size=(STUDIES, 1, seeds))
    w = rng.normal(0, math.sqrt(c.resid), size=(STUDIES, items, seeds))
    dbar = (effect + u + v + w).mean(axis=(1, 2))
    se = math.sqrt(c.item / items + c.seed / seeds + c.resid / (items * seeds))
    return float((np.abs(dbar) / se > norm.isf(alpha / 2)).mean())


@pytest.mark.parametrize("items,seeds,effect", [(200, 3, 0.04), (120, 2, 0.06), (300, 1, 0.05)])
def test_analytic_power_matches_a_seeded_simulation(items, seeds, effect):
    c = power.Components(item=0.09, seed=0.0004, resid=0.06, how="given")
    rng = np.random.default_rng(items * 31 + seeds)
    analytic = power.power(effect, math.sqrt(c.var(items, seeds)))
    assert 0.2 < analytic < 0.95  # a design in the interesting range, not one saturated at 0 or 1
    assert abs(analytic - _simulated_power(rng, c, effect, items, seeds)) <= 0.02


def test_the_items_needed_reach_the_target_power_in_simulation():
    c = power.Components(item=0.09, seed=0.0004, resid=0.06, how="given")
    n = power.items_needed(c, 0.05, 5)
    assert n is not None and power.design_power(c, 0.05, n, 5) >= 0.8 > power.design_power(c, 0.05, n - 1, 5)
    # the t on the design's df asks for more than the z with a known variance would: the z power is above target
    assert _simulated_power(np.random.default_rng(5), c, 0.05, n, 5) >= 0.8 - 0.02
    # at 3 seeds the seed mean square dominates, the design's t has ~2 df and the target is out of reach
    assert power.items_needed(c, 0.05, 3) is None
    # the seed part alone caps what items can buy: 1 seed with σ²_seed 0.0004 never reaches 0.0125 at 80%
    assert power.items_needed(c, 0.0125, 1) is None
    mde = power.mde(c, n, 5)
    assert power.design_power(c, mde, n, 5) == pytest.approx(0.8, abs=1e-6)


def test_the_anova_recovers_the_components_of_a_large_pilot():
    rng = np.random.default_rng(0)
    items, seeds = 4000, 40
    d = (0.03 + rng.normal(0, 0.3, (items, 1)) + rng.normal(0, 0.05, (1, seeds))
         + rng.normal(0, 0.2, (items, seeds)))
    c = power.estimate(d)
    assert c.item == pytest.approx(0.09, rel=0.06) and c.resid == pytest.approx(0.04, rel=0.03)
    assert c.seed == pytest.approx(0.0025, rel=0.5)


def test_analyze_power_prints_the_design_from_a_pilot_runs_root(tmp_path, capsys):
    root = tmp_path / "runs"
    for seed, value in ((0, 0.5), (1, 0.6)):
        make_run(root, "r2e", seed, [10], evaluated={10: {"nq": value}})
    write_eval(root / "_anchor" / "eval" / "step-000000", {"nq": 0.3})
    assert run_analysis({"runs_root": str(root), "out": str(tmp_path / "o"), "evaluate": False,
                         "power": {"pilot": str(root), "effect": 0.1}}) is None
    text = capsys.readouterr().out
    assert "r2e − anchor × nq: 10 items × 2 seed(s), observed Δ +0.2500" in text
    assert "minimum detectable effect" in text and "1 seed(s):" in text and "10 seed(s):" in text
    assert not (tmp_path / "o").exists()  # a power calculation writes nothing
    write_eval(tmp_path / "one", {"nq": 0.4})  # one evaluation: the anchor alone
    run_analysis({"evaluate": False, "power": {"pilot": str(tmp_path / "one"), "seed_sd": 0.01}})
    text = capsys.readouterr().out
    assert "× nq: 10 items × 1 seed(s)" in text and "σ²_item = 2·Var(y)" in text


POWER_PILOTS, POWER_ITEMS, POWER_SEEDS = 20, 500, 3
TRUTH = {"item": 0.3 ** 2, "seed": 0.01 ** 2, "resid": 0.4 ** 2}   # σ_seed one EM point
EFFECT, MAX_SEEDS = 0.05, 30


def _true_power(items: int, seeds: int) -> float:
    """The oracle: the two-sided 5% z test with the true variance of the known model."""
    se = math.sqrt(TRUTH["item"] / items + TRUTH["seed"] / seeds + TRUTH["resid"] / (items * seeds))
    z = norm.isf(0.025)
    return float(norm.sf(z - EFFECT / se) + norm.cdf(-z - EFFECT / se))


def _true_items(seeds: int) -> int:
    """The fewest items with true power >= 0.8 at `seeds` seeds (bisection on the closed form)."""
    lo, hi = 2, 10 ** 8
    assert _true_power(hi, seeds) >= 0.8
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _true_power(mid, seeds) >= 0.8 else (mid + 1, hi)
    return lo


def test_recommended_designs_reach_their_power_across_pilots_without_asking_for_far_too_much():
    """20 pilots of 3 seeds × 500 items drawn from one known crossed model (σ_item 0.3, σ_seed 0.01, σ_resid
    0.4, Δ 0.05). The recommended design (fewest seeds × items reaching 80% at the seed variance's upper limit,
    <= 30 seeds) has true power >= 0.75 in >= 80% of the pilots (no recommendation counts as a miss), and its
    items are at most 2× the true requirement at its number of seeds in the median (none: infinitely many).
    Today's z test on the point estimate recommends 1-seed designs whenever σ_seed comes out 0."""
    rng = np.random.default_rng(0)
    reached, ratios = 0, []
    for _ in range(POWER_PILOTS):
        d = (EFFECT + rng.normal(0, math.sqrt(TRUTH["item"]), (POWER_ITEMS, 1))
             + rng.normal(0, math.sqrt(TRUTH["seed"]), (1, POWER_SEEDS))
             + rng.normal(0, math.sqrt(TRUTH["resid"]), (POWER_ITEMS, POWER_SEEDS)))
        design = power.recommend(power.estimate(d), EFFECT, MAX_SEEDS)
        if design is None:
            ratios.append(math.inf)
            continue
        seeds, items = design
        reached += _true_power(items, seeds) >= 0.75
        ratios.append(items / _true_items(seeds))
    assert reached >= 0.8 * POWER_PILOTS
    assert np.median(ratios) <= 2.0


def test_a_pilot_without_variance_is_refused_never_power_one(tmp_path, capsys):
    from launch.analyze import main

    with pytest.raises(ValueError, match="without variance"):
        power.power(0.042, 0.0)
    with pytest.raises(power.NoVariance):
        power.from_one_evaluation(np.zeros(50))
    write_eval(tmp_path / "zero", {"nq": 0.0}, n=50)   # a base model that fails every item
    assert main([f"power.pilot={tmp_path / 'zero'}", "evaluate=false"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "every item scored 0: no variance" in err[0] and "1.000" not in err[0]


def test_analyze_power_refuses_a_missing_pilot_in_one_line(tmp_path, capsys):
    from launch.analyze import main

    assert main([f"power.pilot={tmp_path / 'nope'}", "evaluate=false"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "power.pilot=" in err[0] and "no such directory" in err[0]


def test_power_keys_are_documented():
    from launch.analyze import KEYS

    assert {"power.pilot", "power.effect", "power.seed_sd", "axis"} <= set(KEYS)
    assert json.dumps(KEYS["power.effect"])  # plain values, so docs/keys renders them
