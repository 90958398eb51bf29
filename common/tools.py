"""The canonical search tool: training data (the search readers, envs exports) and evaluation
(evals, rl) use exactly this spec, so a model sees at evaluation the tool block it was trained with."""
from __future__ import annotations

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the document corpus. Returns the top documents as lines `Doc i(Title: T) text`.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "The search query."}},
            "required": ["query"],
        },
    },
}
