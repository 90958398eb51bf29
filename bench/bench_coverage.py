"""The simulation study behind the report's intervals: crossed items × seeds designs with known truth.

    python bench/bench_coverage.py [replicates=2000]

Each check simulates `replicates` studies from one generative model and runs the interval the report
uses (analysis.variance: the crossed model, as analysis.aggregate calls it) on every study, then prints
its empirical coverage of the true value (or, under a true null, its type-I error) and its median width
against the oracle's (±z × the estimate's SD across the simulated studies; for a band, that SD times the
95% quantile of the largest |z| over steps). docs/benchmarks.md and docs/stages/analyze.md quote the table.

Generative model (parameters below): item difficulty on the logit scale ~ N(logit(P0), ITEM_SD²); each arm
adds an item-specific gain ~ N(GAIN, GAIN_SD²) and a seed effect per seed whose SD on the EM scale is
σ_seed; a score is Bernoulli(expit(difficulty + gain + seed effect)). The anchor is one draw per item with
no seed. Items are drawn anew in each study (the estimand is over the item population), so are seeds.

Checks are a registry (`CHECKS`, filled by `@check`): the power tool's study (bench/bench_power.py) registers
its rows the same way (`power_tool`), so one command prints every interval's coverage and the power tool's
true power at its recommendations in one table.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import expit, logit
from scipy.stats import norm, t as student_t

from analysis.variance import Term, crossed_parts, limits

SEED = 20261206
P0 = 0.3            # the base model's EM on a typical item
ITEM_SD = 1.5       # item difficulty spread (logit)
GAIN = 0.2          # an arm's mean gain over the base (logit), for the non-null checks
GAIN_SD = 0.8       # item-specific gain spread (logit)
CONF = 0.95
TRUTH_ITEMS = 400_000   # items (and seeds) drawn to compute a population mean


@dataclass
class Row:
    check: str       # which interval of the report
    design: str      # items × seeds, and the seed SD
    target: str      # "coverage" or "type-I error"
    nominal: float
    empirical: float
    width: float     # median width (the power tool: median recommended items)
    oracle: float    # the oracle's width (the power tool: median true items needed at the recommended seeds)
    ratio: float | None = None   # width / oracle unless given (the power tool: the median of per-pilot ratios)

    def line(self) -> str:
        ratio = self.ratio if self.ratio is not None else (self.width / self.oracle if self.oracle > 0
                                                           else float("nan"))
        return (f"| {self.check} | {self.design} | {self.target} | {self.nominal:.3f} | {self.empirical:.3f} | "
                f"{_num(self.width)} | {_num(self.oracle)} | {ratio:.2f} |")


def _num(x: float) -> str:
    """A width as a fraction (4 decimals), an item count as an integer."""
    return f"{x:.4f}" if not np.isfinite(x) or abs(x) < 10 else f"{x:,.0f}"


CHECKS: list[Callable[[np.random.Generator, int], list[Row]]] = []


def check(fn: Callable[[np.random.Generator, int], list[Row]]):
    """Register a check: fn(rng, replicates) -> its table rows."""
    CHECKS.append(fn)
    return fn


def seed_logit_sd(p: np.ndarray, seed_em_sd: float) -> np.ndarray:
    """The seed effect's logit SD that moves a mean EM by `seed_em_sd` (first order: / mean p(1 − p))."""
    return seed_em_sd / (p * (1 - p)).mean(axis=-2, keepdims=True)


def arm_scores(rng, difficulty: np.ndarray, seeds: int, seed_em_sd: float, gain: float = 0.0) -> np.ndarray:
    """(replicates, items, seeds) 0/1 scores of one arm."""
    g = gain + rng.normal(0, GAIN_SD, size=difficulty.shape)
    sd = seed_logit_sd(expit(difficulty + g), seed_em_sd)
    effect = rng.normal(0, 1, size=(difficulty.shape[0], 1, seeds)) * sd
    return (rng.random(difficulty.shape[:2] + (seeds,)) < expit(difficulty + g + effect)).astype(float)


def population_mean(rng, seed_em_sd: float, gain: float | None = None, centre: float = logit(P0),
                    item_sd: float = ITEM_SD) -> float:
    """E over items and seeds of a score (one fresh item and seed per draw); `gain` None: the anchor (no
    gain, no seed)."""
    d = rng.normal(centre, item_sd, size=(TRUTH_ITEMS, 1))
    if gain is None:
        return float(expit(d).mean())
    g = gain + rng.normal(0, GAIN_SD, size=d.shape)
    sd = seed_logit_sd(expit(d + g), seed_em_sd)
    return float(expit(d + g + rng.normal(0, 1, size=d.shape) * sd).mean())


def oracle_width(est: np.ndarray) -> float:
    return float(2 * norm.isf((1 - CONF) / 2) * est.std())


def _rate(lo, hi, truth) -> float:
    return float(((lo <= truth) & (truth <= hi)).mean())


@check
def arm_vs_arm(rng, replicates):
    """compare=[[A,B]]: a true null (A and B of one law), 3 seeds × 500 items, two seed SDs; and the
    items-only interval (per-item differences averaged over seeds, t over items) beside it."""
    rows = []
    for seed_sd in (0.0165, 0.034):
        d = rng.normal(logit(P0), ITEM_SD, size=(replicates, 500, 1))
        a, b = arm_scores(rng, d, 3, seed_sd), arm_scores(rng, d, 3, seed_sd)
        parts = crossed_parts([[Term("A", 1.0, a), Term("B", -1.0, b)]])
        lo, hi = limits(parts, CONF)
        design = f"500 items × 3 seeds per arm, σ_seed {100 * seed_sd:.2f} EM points"
        rows.append(Row("A − B (compare), crossed", design, "type-I error", 1 - CONF, 1 - _rate(lo, hi, 0.0),
                        float(np.median(hi - lo)), oracle_width(parts.est)))
        diff = (a - b).mean(axis=2)
        half = student_t.isf((1 - CONF) / 2, 499) * diff.std(axis=1, ddof=1) / np.sqrt(500)
        m = diff.mean(axis=1)
        rows.append(Row("A − B, items only (the rule before)", design, "type-I error", 1 - CONF,
                        1 - _rate(m - half, m + half, 0.0), float(np.median(2 * half)), oracle_width(parts.est)))
    return rows


@check
def arm_vs_anchor(rng, replicates):
    """The paired table: the arm's final checkpoint minus the greedy anchor (no seed variance)."""
    rows = []
    truth_rng = np.random.default_rng(SEED + 1)
    for items, seeds, seed_sd in ((500, 3, 0.034), (1637, 1, 0.034)):
        truth = population_mean(truth_rng, seed_sd, GAIN) - population_mean(truth_rng, 0.0, None)
        d = rng.normal(logit(P0), ITEM_SD, size=(replicates, items, 1))
        arm = arm_scores(rng, d, seeds, seed_sd, GAIN)
        anchor = (rng.random(d.shape) < expit(d)).astype(float)
        parts = crossed_parts([[Term("A", 1.0, arm), Term("anchor", -1.0, anchor, random_seeds=False)]])
        lo, hi = limits(parts, CONF)
        covers = "items+seeds" if seeds >= 2 else "items only"
        rows.append(Row(f"arm − anchor (paired), {covers}", f"{items} items × {seeds} seed(s), σ_seed "
                        f"{100 * seed_sd:.1f} EM points", "coverage", CONF, _rate(lo, hi, truth),
                        float(np.median(hi - lo)), oracle_width(parts.est)))
    return rows


@check
def curve_point(rng, replicates):
    """One arm at one step (the shaded band, the main table): 3 seeds × 500 items, Wilson on the effective n."""
    truth_rng = np.random.default_rng(SEED + 2)
    truth = population_mean(truth_rng, 0.034, GAIN)
    d = rng.normal(logit(P0), ITEM_SD, size=(replicates, 500, 1))
    y = arm_scores(rng, d, 3, 0.034, GAIN)
    parts = crossed_parts([[Term("A", 1.0, y)]])
    lo, hi = limits(parts, CONF, binary=True)
    return [Row("one arm's score (curve, main table)", "500 items × 3 seeds, σ_seed 3.4 EM points", "coverage",
                CONF, _rate(lo, hi, truth), float(np.median(hi - lo)), oracle_width(parts.est))]


@check
def bands(rng, replicates):
    """The dotted simultaneous band over 8 steps, the first at EM ≈ 1% (no gain spread: one arm's curve):
    one seed × 200 items, and two seeds (σ_seed 1 EM point, each checkpoint its own seed effect)."""
    rows, steps, items, item_sd = [], 8, 200, 1.0
    centre = np.linspace(logit(0.008), logit(0.3), steps)
    truth_rng = np.random.default_rng(SEED + 3)
    for seeds, seed_sd in ((1, 0.0), (2, 0.01)):
        pop = truth_rng.normal(0, item_sd, size=(TRUTH_ITEMS, 1))
        p = expit(centre + pop)
        truth = expit(centre + pop + truth_rng.normal(0, 1, size=pop.shape) * seed_logit_sd(p, seed_sd)).mean(axis=0)
        base = centre[None, :, None, None] + rng.normal(0, item_sd, size=(replicates, 1, items, 1))
        base = base + rng.normal(0, 1, size=(replicates, steps, 1, seeds)) * seed_logit_sd(expit(base), seed_sd)
        y = (rng.random((replicates, steps, items, seeds)) < expit(base)).astype(float)
        parts = crossed_parts([[Term("A", 1.0, y)]])
        lo, hi = limits(parts, 1 - (1 - CONF) / steps, binary=True)
        covered = float(((lo <= truth) & (truth <= hi)).all(axis=1).mean())
        sd_est = parts.est.std(axis=0)
        crit = np.quantile((np.abs(parts.est - truth) / sd_est).max(axis=1), CONF)
        rows.append(Row("simultaneous band over 8 steps", f"{items} items × {seeds} seed(s), first step EM "
                        f"{truth[0]:.3f}", "coverage", CONF, covered, float(np.median((hi - lo).mean(axis=1))),
                        float((2 * crit * sd_est).mean())))
    return rows


@check
def transition_part(rng, replicates):
    """A transition-table part (analysis.behaviour.part_intervals): every item malformed and wrong before (the
    anchor), well-formed and right after with the arm's probability; "newly well-formed and right" is the mean
    over items × seeds of the 0/1 contribution, its interval the crossed model's t (not Wilson: a part is a
    contrast, it may be negative)."""
    truth = population_mean(np.random.default_rng(SEED + 4), 0.034, GAIN)
    rows = []
    for items, seeds in ((500, 3), (500, 1)):
        d = rng.normal(logit(P0), ITEM_SD, size=(replicates, items, 1))
        parts = crossed_parts([[Term("post − pre", 1.0, arm_scores(rng, d, seeds, 0.034, GAIN))]])
        lo, hi = limits(parts, CONF)
        covers = "items+seeds" if seeds >= 2 else "items only"
        rows.append(Row(f"transition part (M0 → W1), {covers}", f"{items} items × {seeds} seed(s), σ_seed 3.4 EM "
                        "points", "coverage", CONF, _rate(lo, hi, truth), float(np.median(hi - lo)),
                        oracle_width(parts.est)))
    return rows


@check
def power_tool(rng, replicates):
    """The power tool (bench/bench_power.py's models and pilots, replicates // 20 pilots per model, at least
    20; analyze's defaults, max_seeds 10): the true power of its recommended design (beyond max_seeds where
    the report says "no design within 10 seeds" and prints the fewest evaluations beyond). empirical: the
    median true power at the designs (nominal: the target); width: median recommended items; oracle: median
    true items needed at the recommended seeds; ratio: the median of recommended / needed per pilot (no
    design: ∞). Beside it, on the same pilots, the 80% limit without designs beyond max_seeds (the confidence
    and the cap before) and the point-estimate z tool before that."""
    from bench_power import TARGET, power_summaries

    rows = []
    for s in power_summaries(rng, max(20, replicates // 20)):
        seeds = f"median {s.median_seeds:.0f} seed(s)" if np.isfinite(s.median_seeds) else "no design"
        rows.append(Row(f"{s.tool}: true power at its design", s.model,
                        f"true power (≥ 0.75 in {s.reached:.2f} of pilots; {seeds}, "
                        f"{s.recommended:.2f} within 10)", TARGET, s.median_power, s.median_items, s.median_need,
                        s.median_ratio))
    return rows


def main(argv: list[str]) -> int:
    replicates = 2000
    for arg in argv:
        key, _, value = arg.partition("=")
        if key != "replicates" or not value.isdigit() or int(value) < 10:
            print(f"bench_coverage: {arg!r}: expected replicates=N (N >= 10)", file=sys.stderr)
            return 2
        replicates = int(value)
    rng = np.random.default_rng(SEED)
    start = time.perf_counter()
    print(f"{replicates} simulated studies per row, seed {SEED}; width: median; oracle: ±z × the estimate's SD "
          "across studies (bands: × the 95% quantile of max |z| over steps)\n")
    print("| interval | design | measures | nominal | empirical | width | oracle width | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for fn in CHECKS:
        for row in fn(rng, replicates):
            print(row.line(), flush=True)
    print(f"\n{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
