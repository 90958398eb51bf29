"""Speed benchmarks (scripts that print ratios against a named baseline; not tests)."""
