"""data_prep: raw agent trajectories -> canonical records -> arms -> tokenized, loss-masked datasets."""
