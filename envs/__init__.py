"""Closed-book agent environments (no network, no retriever): see `envs.search_plan_act`."""
