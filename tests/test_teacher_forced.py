"""Teacher-forced span losses: the same tokens, masks and loss as training, split by message field."""
import json

import numpy as np
import pytest
import torch

from data_prep.render import ChatRenderer
from data_prep.spans import SPAN_KINDS, SpanTokenizer, char_kinds
from evals.teacher_forced import record_losses


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from data_prep.build import build_arm

    out = tmp_path_factory.mktemp("tf") / "data"
    build_arm({"kind": "synthetic", "n": 6, "max_seq_len": 4096}, arm="mixed", seed=0, tokenizer="tiny", out=out,
              progress=False, num_proc=1)
    import datasets

    return datasets.load_from_disk(str(out))


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    from common.tiny import resolve_model_path

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-base"), dtype=torch.float32).eval()


def test_span_losses_add_up_to_the_trainers_loss_on_the_same_record(dataset, model, tiny_tokenizer):
    from sft.data import collate
    from sft.train import micro_batch_loss

    from data_prep.schema import ROW_SEP

    span_rows = SpanTokenizer(tiny_tokenizer)   # rendered and tokenized as data-prep does for training
    records: dict[str, list[dict]] = {}
    for row in dataset:  # a record the template rewrites is trained in several rows: all of them
        records.setdefault(row["id"].split(ROW_SEP)[0], []).append(row)
    seen_domains, seen_kinds = set(), set()
    for rows in records.values():
        rec = json.loads(rows[0]["messages"])
        spans = record_losses(model, span_rows(rec))
        loss_sum, n = 0.0, 0
        for row in rows:
            mb = collate([(np.asarray(row["input_ids"]), np.asarray(row["labels"]))])
            with torch.no_grad():  # the trainer's loss of this row alone: sum of its token losses / its count
                loss_sum += micro_batch_loss(model, mb, torch.tensor(mb.num_trainable)).loss.item() * mb.num_trainable
            n += mb.num_trainable
            assert mb.num_trainable == row["num_trainable"]
        assert spans.n == n
        # fp32: the trainer sums its token losses in fp32, whose resolution at a loss of 10 is ~1e-6
        assert spans.total / spans.n == pytest.approx(loss_sum / n, rel=1e-6)
        assert sum(spans.loss[k] for k in SPAN_KINDS) == pytest.approx(spans.total, abs=1e-9)
        seen_domains.add(rec["domain"])
        seen_kinds |= {k for k in SPAN_KINDS if spans.tokens[k]}
    assert seen_domains == {"search", "code"}
    assert {"reasoning", "tool_name", "tool_arguments", "final_answer", "finish_call", "template"} <= seen_kinds


def test_each_kind_is_the_text_of_its_message_field(dataset, tiny_tokenizer):
    renderer = ChatRenderer(tiny_tokenizer)
    rec = next(json.loads(r["messages"]) for r in dataset if json.loads(r["messages"])["domain"] == "search")
    (row, kinds), *_ = char_kinds(renderer, rec)

    def text_of(kind):
        return "".join(ch for ch, k in zip(row.text, kinds) if k == SPAN_KINDS.index(kind))

    calls = [c["function"] for m in rec["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert text_of("tool_name") == "".join(c["name"] for c in calls)
    assert text_of("tool_arguments") == "".join(json.dumps(c["arguments"], ensure_ascii=False) for c in calls)
    final = [m["content"] for m in rec["messages"] if m["role"] == "assistant"][-1]
    assert text_of("final_answer") == final[final.index("Final answer:"):].strip()
    assert (kinds >= 0).sum() == sum(b - a for a, b in row.spans)
