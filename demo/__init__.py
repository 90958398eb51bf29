"""The CPU demo (`make demo`, `python -m demo`): a driver over the stages, not a stage itself. It
runs `launch`, `data_prep`, `sft` and `analysis` in order on the embedded default; no stage imports it."""
