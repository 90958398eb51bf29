"""Generation backends: per-request sampling (a request's random stream is its own seed's)."""
from __future__ import annotations

import pytest


def _prompts(backend):
    tok = backend.tokenizer
    return [backend.encode(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True))
            for q in ("hi", "what is the capital of a very long country name here?", "x y z", "count to ten")]


def _reference_sample(model, prompt, cap, temperature, seed, stop_ids):
    """The oracle: one prompt alone, a full forward per step (no cache, no padding), and
    torch.multinomial on softmax(logits / T) drawn from a generator seeded with the request's seed."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = list(prompt)
    out = []
    with torch.inference_mode():
        for _ in range(cap):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            tok = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen))
            out.append(tok)
            ids.append(tok)
            if tok in stop_ids:
                break
    return out


def test_hf_sampling_is_per_request_and_matches_a_reference_loop(tiny_model_dir):
    from evals.backends import HFBackend

    backend = HFBackend(str(tiny_model_dir), micro_batch=4, device="cpu")
    prompts = _prompts(backend)
    caps = [10, 6, 10, 8]
    seeds = [11, 12, 13, 14]
    batched = backend.generate(prompts, caps, temperature=1.5, seeds=seeds)
    for p, cap, s, g in zip(prompts, caps, seeds, batched):
        ref = _reference_sample(backend.model, p, cap, 1.5, s, set(backend.stop_ids))
        assert g == backend._finish(ref, cap)
    # the same request alone, or among others in another order and micro-batch size: the same output
    backend.micro_batch = 2
    shuffled = backend.generate(prompts[::-1], caps[::-1], temperature=1.5, seeds=seeds[::-1])
    assert shuffled[::-1] == batched
    alone = backend.generate([prompts[1]], [caps[1]], temperature=1.5, seeds=[seeds[1]])
    assert alone == [batched[1]]
    # a different seed changes the draw; greedy ignores seeds and is what it was
    other = backend.generate(prompts, caps, temperature=1.5, seeds=[21, 22, 23, 24])
    assert [g.text for g in other] != [g.text for g in batched]
    greedy = backend.generate(prompts, caps)
    assert backend.generate(prompts, caps, temperature=0.0, seeds=seeds) == greedy
    assert [g.text for g in greedy] != [g.text for g in batched]


def test_sampling_arguments_are_checked(tiny_model_dir):
    from evals.backends import BackendError, HFBackend

    backend = HFBackend(str(tiny_model_dir), device="cpu")
    prompts = _prompts(backend)[:2]
    with pytest.raises(BackendError, match="seeds"):
        backend.generate(prompts, [4, 4], temperature=1.0)
    with pytest.raises(BackendError, match="2 prompts but 1 seeds"):
        backend.generate(prompts, [4, 4], temperature=1.0, seeds=[1])
    with pytest.raises(BackendError, match="temperature"):
        backend.generate(prompts, [4, 4], temperature=-1.0, seeds=[1, 2])
