"""The vLLM tier: sampled generations of `backend=vllm` depend on each request's own seed only
(babyai's per-(episode, step) seeds, evals.babyai.request_seed), not on which other requests share
the engine's batch: the same episodes played together and one at a time give the same rows. With
one seed for the whole batch vLLM draws from one stream and the rows differ."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.vllm

PLAY = """
import json, sys
from evals import babyai
from evals.backends import VLLMBackend
from evals.engine import Lockstep
from evals.scheduler import play_items

if __name__ == "__main__":
    backend = VLLMBackend(sys.argv[1], max_model_len=4096, dtype="float32")
    items = babyai.items(2, 0, samples=2)
    games = babyai.GameRules(max_steps=3, max_new_tokens=24, temperature=1.0).episodes()
    engine = Lockstep(backend)
    together = play_items(items, games, engine, max_model_len=4096)
    alone = [row for it in items for row in play_items([it], games, engine, max_model_len=4096)]
    backend.close()
    print(json.dumps({"together": together, "alone": alone}))
"""


def test_sampled_babyai_rows_do_not_depend_on_the_batch(tmp_path):
    script = tmp_path / "play.py"
    script.write_text(PLAY)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, str(script), str(ROOT / "common" / "tiny_base")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    together, alone = rows["together"], rows["alone"]
    assert len(together) == len(alone) == 4
    first: dict = {}
    for row in together:   # two samples of one level: the same prompt, other seeds -> other replies
        first.setdefault(row["episode"], []).append(row["transcript"][0]["reply"])
    assert all(len(set(v)) == 2 for v in first.values()), f"the samples of one level must differ: {first}"
    for a, b in zip(together, alone):
        assert a == b, f"babyai {a['id']}: a sampled row changed with the batch (per-request seeds not honoured)"
