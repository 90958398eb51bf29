"""Design power against seeded simulations, and the simultaneous band's coverage under the null."""
import json
import math
import re

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
    assert "minimum detectable effect" in text and "2–10 seed(s): unreachable" in text
    assert "1 seed(s): not recommended (a 1-seed study cannot measure its own seed variance" in text
    # 2 seeds bound σ²_seed at 63× its mean square: no design within the default 10 seeds, and the line says
    # how many it takes (the fewest seeds, and the fewest evaluations beyond the limit)
    m = re.search(r"recommended: no design within 10 seeds: needs >= (\d+) seeds \(\1 seed\(s\) × (\d+) items\); "
                  r"the fewest evaluations: (\d+) seed\(s\) × (\d+) items", text)
    assert m and 10 < int(m[1]) <= int(m[3]) and int(m[3]) * int(m[4]) <= int(m[1]) * int(m[2])
    assert not (tmp_path / "o").exists()  # a power calculation writes nothing
    write_eval(tmp_path / "one", {"nq": 0.4})  # one evaluation: the anchor alone
    run_analysis({"evaluate": False, "power": {"pilot": str(tmp_path / "one"), "seed_sd": 0.01}})
    text = capsys.readouterr().out
    assert "× nq: 10 items × 1 seed(s)" in text and "σ²_item = 2·Var(y)" in text
    # seed variance assumed, not measured: no 1-seed design, the fewest evaluations within 10 seeds
    assert "1 seed(s): not recommended (a 1-seed study" in text
    assert re.search(r"recommended: 2 seed\(s\) × \d+ items \(the fewest evaluations", text)


POWER_PILOTS, POWER_ITEMS, POWER_SEEDS = 20, 500, 3
SIGMA_ITEM, SIGMA_RESID = 0.3, 0.4   # of the per-item arm − anchor differences (EM units)


def _defaults() -> dict:
    """What `analyze power.pilot=...` uses unless told otherwise (launch.analyze's KEYS)."""
    from launch.analyze import KEYS

    return {k: KEYS[f"power.{k}"].default for k in ("effect", "power", "alpha", "max_seeds")}


def _true_power(sigma_seed: float, effect: float, items: int, seeds: int) -> float:
    """The oracle: the two-sided 5% z test with the true variance of the known model."""
    se = math.sqrt(SIGMA_ITEM ** 2 / items + sigma_seed ** 2 / seeds + SIGMA_RESID ** 2 / (items * seeds))
    z = norm.isf(0.025)
    return float(norm.sf(z - effect / se) + norm.cdf(-z - effect / se))


def _true_items(sigma_seed: float, effect: float, seeds: int) -> float:
    """The fewest items with true power >= 0.8 at `seeds` seeds (bisection on the closed form; inf: none)."""
    lo, hi = 2, 10 ** 9
    if _true_power(sigma_seed, effect, hi, seeds) < 0.8:
        return math.inf
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _true_power(sigma_seed, effect, mid, seeds) >= 0.8 else (mid + 1, hi)
    return lo


@pytest.mark.parametrize("sigma_seed", [0.01, 0.0165, 0.034])
def test_recommended_designs_reach_their_power_across_pilots_without_asking_for_far_too_much(sigma_seed):
    """20 pilots of 3 seeds × 500 items drawn from one known crossed model (σ_item 0.3, σ_resid 0.4, σ_seed 1,
    1.65 or 3.4 EM points; Δ = the default power.effect 0.042), sized with analyze's defaults (power 0.8, alpha
    0.05, max_seeds 10). The recommended design — the fewest evaluations within max_seeds, else the fewest
    beyond it that the report prints after "no design within 10 seeds" — has true power >= 0.75 (the closed
    form above) in >= 80% of the pilots (no design counts as a miss), and its items are at most 2× the true
    requirement at its number of seeds in the median (no design, or seeds where no item count reaches: ∞).
    Here 20/20, 20/20 and 19/20 reach it, at medians 1.91, 1.94 and 1.88; over 400 pilots per σ_seed the
    shares are 1.00, 0.955 and 0.953, medians 1.85–1.87. Before (σ²_seed's 80% limit, no design beyond 10
    seeds, 1-seed designs): 9/20, 11/20 and 0/20."""
    defaults = _defaults()
    effect = defaults["effect"]
    rng = np.random.default_rng(0)
    reached, ratios = 0, []
    for _ in range(POWER_PILOTS):
        d = (effect + rng.normal(0, SIGMA_ITEM, (POWER_ITEMS, 1)) + rng.normal(0, sigma_seed, (1, POWER_SEEDS))
             + rng.normal(0, SIGMA_RESID, (POWER_ITEMS, POWER_SEEDS)))
        c = power.estimate(d)
        advice = power.advise(c, effect, defaults["max_seeds"], defaults["power"], defaults["alpha"])
        if advice.design is None:
            ratios.append(math.inf)
            continue
        seeds, items = advice.design
        # never a design whose power at the seed variance's upper limit is below the target
        assert power.design_power(c, effect, items, seeds, defaults["alpha"]) >= defaults["power"]
        assert advice.within == (seeds <= defaults["max_seeds"])
        assert seeds >= 2   # a 1-seed study's intervals cover the items only: not the test its power is for
        reached += _true_power(sigma_seed, effect, items, seeds) >= 0.75
        ratios.append(items / _true_items(sigma_seed, effect, seeds))
    assert reached >= 0.8 * POWER_PILOTS
    assert np.median(ratios) <= 2.0


def test_no_design_within_max_seeds_names_the_fewest_seeds_that_reach_and_the_cheapest_beyond():
    c = power.Components(item=0.09, seed=0.0004, resid=0.16, how="given", seed_upper=0.004, seed_measured=True,
                         seed_df=2)
    advice = power.advise(c, 0.042, 10)
    assert not advice.within and advice.design is not None
    (k, n), (seeds, items) = advice.fewest_seeds, advice.design
    # K is the fewest: one seed fewer reaches the target with no number of items; the cheapest is beyond K
    assert 10 < k <= seeds and power.items_needed(c, 0.042, k - 1) is None and power.items_needed(c, 0.042, k) == n
    assert seeds * items <= k * n and power.recommend(c, 0.042, 10) is None
    assert power.design_power(c, 0.042, items, seeds) >= 0.8
    # an effect no design within 1,000 seeds × 10⁶ items can see: none at all, said so
    assert power.advise(c, 1e-4, 10) == power.Advice(None, False, None)
    text = power.report([power.Pilot("A − anchor", "nq", np.random.default_rng(0).normal(0, 0.3, (50, 3)), False)],
                        effect=1e-4, target=0.8, alpha=0.05, seed_sd=0.0, max_seeds=10)
    assert "recommended: no design within 10 seeds, nor within 1000" in text


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


def test_a_pilot_bench_that_was_not_measured_is_refused_naming_why(tmp_path, capsys):
    """A pilot whose bench evaluate gave no score (none of its items generated a token: max_model_len below its
    prompts) is refused in one line with the reason, never its 0s read as the pilot's item scores."""
    import json

    from launch.analyze import main

    write_eval(tmp_path / "one", {"nq": 0.5}, n=50)
    path = tmp_path / "one" / "summary.json"
    summary = json.loads(path.read_text())
    summary["nq"] = {**summary["nq"], "em": None, "f1": None, "null_reason": "not measured: 50 of 50 items never "
                     "generated a token: a first prompt of up to 300 tokens does not fit max_model_len=64"}
    path.write_text(json.dumps(summary))
    assert main([f"power.pilot={tmp_path / 'one'}", "evaluate=false"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nq: no score: not measured: 50 of 50 items never generated a token" in err[0], err


def test_analyze_power_refuses_a_missing_pilot_in_one_line(tmp_path, capsys):
    from launch.analyze import main

    assert main([f"power.pilot={tmp_path / 'nope'}", "evaluate=false"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "power.pilot=" in err[0] and "no such directory" in err[0]
    assert main([f"power.pilot={tmp_path / 'nope'}", "power.effect=0", "evaluate=false"]) == 2   # the field's rule
    assert capsys.readouterr().err.strip() == "error: power.effect=0: expected a number other than 0 (the effect to detect)"


def test_power_keys_are_documented():
    from launch.analyze import KEYS

    assert {"power.pilot", "power.effect", "power.seed_sd", "axis"} <= set(KEYS)
    assert json.dumps(KEYS["power.effect"].default)  # a plain value, so docs/keys renders it


def test_a_pilot_arm_a_seed_cannot_pair_is_named_and_its_seeds_final_steps_said(tmp_path, capsys):
    """search/seed0's final evaluation has no nq: search × nq gets a `not computed` line naming it (before: the pair was
    left out, not a word printed); r2e's seeds end at steps 20, 20 and 10 (seed 2 still training): the line says
    which checkpoint each seed's difference comes from (before: `10 items × 3 seed(s)`, no step named)."""
    root = tmp_path / "runs"
    make_run(root, "r2e", 0, [10, 20], evaluated={10: {"nq": 0.5, "hotpotqa": 0.5}, 20: {"nq": 0.6, "hotpotqa": 0.5}})
    make_run(root, "r2e", 1, [10, 20], evaluated={10: {"nq": 0.5, "hotpotqa": 0.6}, 20: {"nq": 0.7, "hotpotqa": 0.6}})
    make_run(root, "r2e", 2, [10], evaluated={10: {"nq": 0.2, "hotpotqa": 0.6}}, horizon=20, save_steps=[10, 20],
             done=False)
    make_run(root, "search", 0, [10], evaluated={10: {"hotpotqa": 0.6}})
    make_run(root, "search", 1, [10], evaluated={10: {"nq": 0.4, "hotpotqa": 0.6}})
    write_eval(root / "_anchor" / "eval" / "step-000000", {"nq": 0.3, "hotpotqa": 0.3})
    run_analysis({"runs_root": str(root), "out": str(tmp_path / "o"), "evaluate": False, "benches": ["nq", "hotpotqa"],
                  "power": {"pilot": str(root), "effect": 0.1}})
    text = capsys.readouterr().out
    assert ("r2e − anchor × nq: 10 items × 3 seed(s), observed Δ +0.2000 (each seed at its final evaluation: seed0, "
            "seed1 at step 20, seed2 at step 10)") in text
    assert "search − anchor × hotpotqa: 10 items × 2 seed(s), observed Δ +0.3000 (each seed at its final evaluation: " \
           "step 10)" in text
    assert ("search − anchor × nq: not computed: no per-item em of nq at search/seed0/step-000010 (its final "
            "evaluation)") in text
