"""analysis: sweep arms × seeds × steps into transfer curves, tables, paper figures and a report.

Entry points: the `analyze` console script (`analysis.cli:main`), the Python API
`analysis.sweep.run_analysis(cfg, evaluator=None)` (the CPU demo that drives it is `python -m demo`, outside this stage).
"""
