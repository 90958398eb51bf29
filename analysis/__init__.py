"""analysis: sweep arms × seeds × steps into transfer curves, tables, paper figures and a report.

It only reads eval dirs and writes reports (`analysis.sweep.write_analysis`); what to evaluate, and
evaluating it, is launch's: the `analyze` console script (`launch.analyze:main`) and its Python API
`launch.analyze.run_analysis(cfg, evaluator=None)` (the CPU demo that drives it is `python -m demo`, outside this stage).
"""
