"""retriever=e5 (evals.dense) given the wrong files (issue Trust V): a faiss index cut short is one line and
exit 2, never a crash of the process (28-31 bytes crashed faiss with SIGSEGV); an index built by another
encoder of the same width, or over a reordered corpus, is refused at start naming the first row that
differs, while an index built in fp16 (as Search-R1 builds its own, on GPUs) is accepted."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT

faiss = pytest.importorskip("faiss")

DATA = ROOT / "tests" / "data" / "search_r1_e5"
ENCODER, CORPUS, THEIRS = DATA / "encoder", DATA / "corpus.jsonl", DATA / "e5_Flat.index"

PROBE = """
import sys
from evals.dense import DenseError, read_index
for path in sys.argv[1:]:
    try:
        index = read_index(path)
        print("read", index.ntotal, flush=True)
    except DenseError as exc:
        print("DenseError", exc, flush=True)
"""


def test_an_index_cut_or_padded_anywhere_is_one_line_never_a_crash(tmp_path, capsys):
    whole = THEIRS.read_bytes()
    cuts = [0, 3, 4, 12, 28, 29, 30, 31, 36, 44, 45, 52, len(whole) - 1]
    paths = []
    for n in cuts:
        paths.append(tmp_path / f"cut{n}.index")
        paths[-1].write_bytes(whole[:n])
    paths.append(tmp_path / "padded.index")
    paths[-1].write_bytes(whole + b"\0" * 4)
    proc = subprocess.run([sys.executable, "-c", PROBE, *map(str, paths)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"exit {proc.returncode} (-11: SIGSEGV) after {proc.stdout.splitlines()[-1:]}"
    lines = proc.stdout.splitlines()
    assert len(lines) == len(paths) and all(line.startswith("DenseError index ") for line in lines), lines
    assert "cut30.index: 30 bytes, shorter than a faiss IndexFlatIP header" in lines[cuts.index(30)]
    assert "cut52.index: 52 bytes, but its header says 120 vectors of dimension 64 (30765 bytes)" in lines[cuts.index(52)]
    # at the command line: one line, exit 2
    from evals.server import main as serve_main

    capsys.readouterr()
    assert serve_main([f"corpus={CORPUS}", "retriever=e5", f"encoder={ENCODER}", f"index={paths[cuts.index(29)]}",
                       f"index_dir={tmp_path / 'idx'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cut29.index: 29 bytes, shorter than a faiss IndexFlatIP header" in err[0], err


def _index_of(vectors: np.ndarray, path) -> str:
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    faiss.write_index(index, str(path))
    return str(path)


def test_an_fp16_built_index_passes_another_encoder_or_a_reordered_corpus_is_refused(tmp_path):
    import torch
    from transformers import AutoModel

    from evals.dense import DenseError, E5Encoder, E5Retriever

    lines = CORPUS.read_text().splitlines(keepends=True)
    half = E5Encoder(str(ENCODER), "cpu")
    half.model = half.model.half()   # as Search-R1 builds its index, on GPUs
    passages = [json.loads(line)["contents"] for line in lines]
    fp16 = _index_of(np.concatenate([half.encode(passages[s:s + 64], is_query=False) for s in range(0, 120, 64)]),
                     tmp_path / "fp16.index")
    r = E5Retriever(CORPUS, encoder=str(ENCODER), index=fp16, index_dir=tmp_path / "idx")
    assert r.search(["x"], 1)[0]
    # another encoder of the same width (64) over Search-R1's own index
    other = AutoModel.from_pretrained(str(ENCODER))
    torch.manual_seed(1)
    for p in other.parameters():
        torch.nn.init.normal_(p, std=0.5)
    other_dir = tmp_path / "other_encoder"
    other.save_pretrained(other_dir)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (other_dir / f).write_bytes((ENCODER / f).read_bytes())
    with pytest.raises(DenseError, match=rf"index {THEIRS} row 0 is not passage 0 of corpus {CORPUS} \(id '0'\) as "
                                         rf"encoder {other_dir} encodes it: cosine 0\.\d+ < 0\.99"):
        E5Retriever(CORPUS, encoder=str(other_dir), index=THEIRS, index_dir=tmp_path / "idx")
    # the same corpus, one line moved from the end to the front: same row count, every row shifted
    moved = tmp_path / "moved.jsonl"
    moved.write_text("".join(lines[-1:] + lines[:-1]))
    with pytest.raises(DenseError, match=r"row 0 is not passage 0 of corpus .*moved.jsonl \(id '119'\)"):
        E5Retriever(moved, encoder=str(ENCODER), index=THEIRS, index_dir=tmp_path / "idx")
