"""The Search-R1 7-bench names, one definition for every stage (evals scores them, data_prep
decontaminates training data against them)."""
from __future__ import annotations

SEARCH7 = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
