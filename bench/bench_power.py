"""The power tool against known truth: pilots drawn from crossed items × seeds models, the tool's recommended
design, and that design's true power (closed form: the two-sided z test with the model's true variance).

    python bench/bench_power.py [pilots=100] [seed=0] [max_seeds=10]

Per model (σ_item, σ_seed, σ_resid of the per-item arm − anchor differences, the effect Δ; the pilot's items ×
seeds), over `pilots` pilots, with analyze's defaults (power 0.8, alpha 0.05, max_seeds 10): the share given a
design within max_seeds (the others get the report's "no design within N seeds: needs >= K seeds" and the
fewest evaluations beyond it, which is the design scored), the share whose design reaches true power >= 0.75
(no design at all counts as a miss), the median true power at the designs, the median of recommended items /
the true items needed at the recommended seeds (none, or seeds where no item count reaches the target: ∞),
the median recommended seeds and the share of 1-seed designs. Beside it, in the same run on the same pilots:
the tool with σ²_seed's 80% limit and no design beyond max_seeds (the confidence and the cap before; its
other rules today's, no 1-seed design: `80% limit`) and the point-estimate z tool before that (the pilot's
own seeds, σ²_seed at its estimate, items from the z formula: `baseline`). `power_summaries()` returns them
as numbers for another benchmark to print (bench/bench_coverage.py registers them). Not a test: it prints
what it measured."""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from analysis import power

# (label, σ_item, σ_seed, σ_resid, Δ, pilot items, pilot seeds): EM-scale differences (σ_seed in EM units)
MODELS = (
    ("σ_seed 0", 0.3, 0.0, 0.4, 0.042, 500, 3),
    ("σ_seed 1 EM point", 0.3, 0.01, 0.4, 0.042, 500, 3),
    ("σ_seed 1.65 EM points", 0.3, 0.0165, 0.4, 0.042, 500, 3),
    ("σ_seed 3.4 EM points", 0.3, 0.034, 0.4, 0.042, 500, 3),
    ("σ_seed 1.65 EM points, 5-seed pilot", 0.3, 0.0165, 0.4, 0.042, 500, 5),
)
TARGET, ALPHA = 0.8, 0.05


def true_power(model, items: int, seeds: int) -> float:
    _, si, ss, sr, effect, _, _ = model
    se = math.sqrt(si ** 2 / items + ss ** 2 / seeds + sr ** 2 / (items * seeds))
    z = norm.isf(ALPHA / 2)
    return float(norm.sf(z - effect / se) + norm.cdf(-z - effect / se))


def true_items(model, seeds: int) -> float:
    """The fewest items with true power >= TARGET at `seeds` (inf: unreachable)."""
    lo, hi = 2, 10 ** 9
    if true_power(model, hi, seeds) < TARGET:
        return math.inf
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if true_power(model, mid, seeds) >= TARGET else (mid + 1, hi)
    return lo


def baseline(c: power.Components, effect: float, seeds: int) -> int | None:
    """The replaced tool: z test, σ²_seed at its point estimate, items at the pilot's seeds."""
    k = norm.isf(ALPHA / 2) + norm.isf(1 - TARGET)
    room = (effect / k) ** 2 - c.seed / seeds
    return None if room <= 0 else max(2, math.ceil((c.item + c.resid / seeds) / room))


@dataclass
class Summary:
    """One model × tool over its pilots (no recommendation: a miss, items / need ∞)."""

    model: str          # "<label> (<pilot items> × <pilot seeds>)"
    tool: str
    recommended: float  # share of pilots given a design within max_seeds
    reached: float      # share whose design has true power >= 0.75
    median_power: float  # at the recommendations (nan: none)
    median_items: float  # recommended items (nan: none)
    median_need: float   # the true items needed at the recommended seeds (nan: none)
    median_ratio: float  # of recommended items / true need, misses ∞
    one_seed: float      # share of 1-seed recommendations
    median_seeds: float  # recommended seeds (nan: none)

    def cells(self) -> list[str]:
        return [self.model, self.tool, f"{self.recommended:.2f}", f"{self.reached:.2f}",
                f"{self.median_power:.3f}" if math.isfinite(self.median_power) else "–", f"{self.median_ratio:.2f}",
                f"{self.median_seeds:.0f}" if math.isfinite(self.median_seeds) else "–", f"{self.one_seed:.2f}"]


def _median(xs: list) -> float:
    return float(np.median(xs)) if xs else math.nan


def _summary(model, name: str, designs: list, within: list[bool]) -> Summary:
    got = [d for d in designs if d is not None]
    powers = [true_power(model, n, s) for s, n in got]
    # a design at seeds where no number of items reaches the target is a miss too (∞, not n / ∞ = 0)
    ratios = [n / need if math.isfinite(need := true_items(model, s)) else math.inf for s, n in got]
    ratios += [math.inf] * (len(designs) - len(got))
    label, *_, items, seeds = model
    return Summary(f"{label} ({items} × {seeds})", name, sum(within) / len(designs),
                   sum(p >= 0.75 for p in powers) / len(designs), _median(powers), _median([n for _, n in got]),
                   _median([true_items(model, s) for s, _ in got]), float(np.median(ratios)),
                   sum(s == 1 for s, _ in got) / len(designs), _median([s for s, _ in got]))


def power_summaries(rng: np.random.Generator, pilots: int = 100, max_seeds: int = 10) -> list[Summary]:
    """Per model, over `pilots` pilots drawn with `rng`: the power tool's, the 80% limit's and the baseline's
    summaries (the three on the same pilots)."""
    out = []
    for model in MODELS:
        _, si, ss, sr, effect, items, seeds = model
        runs = {"power tool (90% limit)": ([], []), "80% limit, none beyond max_seeds": ([], []),
                "baseline (z, point σ_seed)": ([], [])}
        for _ in range(pilots):
            d = (effect + rng.normal(0, si, (items, 1)) + rng.normal(0, ss, (1, seeds))
                 + rng.normal(0, sr, (items, seeds)))
            advice = power.advise(power.estimate(d), effect, max_seeds, TARGET, ALPHA)
            old = power.recommend(power.estimate(d, seed_conf=0.8), effect, max_seeds, TARGET, ALPHA)
            n = baseline(power.estimate(d), effect, seeds)
            for (designs, within), (design, inside) in zip(runs.values(), (
                    (advice.design, advice.within), (old, old is not None),
                    (None if n is None else (seeds, n), n is not None))):
                designs.append(design)
                within.append(inside)
        out += [_summary(model, name, designs, within) for name, (designs, within) in runs.items()]
    return out


def power_rows(pilots: int = 100, seed: int = 0, max_seeds: int = 10) -> list[list[str]]:
    """One row per model × tool: [model, tool, within max_seeds share, power >= 0.75 share, median true power,
    median items / true need, median seeds, 1-seed share]."""
    return [s.cells() for s in power_summaries(np.random.default_rng(seed), pilots, max_seeds)]


HEADER = ["model (pilot items × seeds)", "tool", "design within max_seeds", "power >= 0.75", "median true power",
          "median items / true need", "median seeds", "1-seed"]


def main(argv: list[str]) -> int:
    opts = dict(a.split("=", 1) for a in argv)
    start = time.perf_counter()
    rows = power_rows(int(opts.get("pilots", 100)), int(opts.get("seed", 0)), int(opts.get("max_seeds", 10)))
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print(f"\n{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
