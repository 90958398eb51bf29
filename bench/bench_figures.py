"""Saving a report figure (analysis.figures.save_figure: caption, PDF, 300-dpi PNG), this checkout vs a baseline.

Each round starts one process on the baseline's code (`git archive BASE`, default `main`) and one on this
checkout's, in turn. A process draws an 8-panel curves-sized figure (2 x 4 panels, three arms of 9 steps each, the
report's rc settings) with a caption as long as a curves figure's (its interval text twice), saves it once to warm up,
then `repeats` times, timing each save. Prints min and median seconds per save and their ratios.

    .venv/bin/python bench/bench_figures.py [base=main] [rounds=3] [repeats=3]
"""
from __future__ import annotations

import statistics
import sys

from bench_compose import ROOT, base_tree, bench_args, measure   # (this directory is on sys.path when run as a script)

CHILD = """
import json, sys, tempfile, time
from pathlib import Path
import matplotlib.pyplot as plt
from analysis import figures
caption = ("Shaded: 95% Wilson score interval over items of each checkpoint (n=500 items, one seed); dotted band: "
           "95% simultaneous band over steps (Holm), drawn where a run has >= 2 seeds; dashed line: the anchor model "
           "(Qwen3-4B-Thinking-2507, step 0). x-axis: optimizer steps; a missing point is a gap, never joined. ") * 2
def save(stem):
    with plt.rc_context(figures.RC):
        fig, axes = plt.subplots(2, 4, figsize=(figures.TEXT_WIDTH_IN, figures.PANEL_HEIGHT_IN * 2 + 0.35), squeeze=False)
        for i, ax in enumerate(axes.flat):
            for arm in range(3):
                ax.plot(range(0, 225, 25), [(i + arm + s) % 7 / 10 for s in range(9)], marker="o", label=f"arm{arm}")
            ax.set_title(f"bench {i}")
        info = figures.FigureInfo(paths=[], panels=[], caption=caption)
        t = time.perf_counter()
        figures.save_figure(fig, info, stem, 2)
        return time.perf_counter() - t
out = Path(tempfile.mkdtemp())
save(out / "warm")
times = [save(out / f"f{k}") for k in range(int(sys.argv[2]))]
print(json.dumps({"times": times, "digest": "", "file": figures.__file__}))
"""


def main(argv=None) -> int:
    base, rounds, repeats = bench_args(argv, {"base": "main", "rounds": 3, "repeats": 3})
    with base_tree(base) as (tree, commit, cwd):
        results = {"baseline": [], "this checkout": []}
        for _ in range(rounds):
            for label, where in (("baseline", tree), ("this checkout", ROOT)):
                results[label] += measure(where, repeats, cwd, CHILD, "[]")["times"]
    print(f"a figure saved {rounds} x {repeats} times per side, alternating processes; baseline {base} ({commit})")
    stats = {label: (min(t), statistics.median(t)) for label, t in results.items()}
    for label, (lo, med) in stats.items():
        print(f"{label:>14}: min {lo:6.2f} s  median {med:6.2f} s per save")
    print(f"baseline / this checkout: min {stats['baseline'][0] / stats['this checkout'][0]:.2f}x, "
          f"median {stats['baseline'][1] / stats['this checkout'][1]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
