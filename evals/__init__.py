"""The agentic evaluation harness (see README `## evals`).

Public API: `evals.run.evaluate(cfg) -> summary`, the `evaluate` CLI (`evals.cli:main`),
`serve-retriever` (`evals.server:main`), `evals.metrics.{exact_match, f1, cover_em}`,
`evals.extract.extract_answer`, `evals.toolcalls.parse_tool_calls`, `evals.retrievers.make_retriever`
(bm25, e5 — `evals.dense`, Search-R1's dense retrieval —, http).
"""
