"""Record dense-retrieval reference data from Search-R1's own code (not part of the package; run by hand).

It makes a tiny E5-style encoder (a BERT config with random weights, seeded, and a WordPiece
tokenizer built from the corpus words: nothing downloaded), a small wiki-18 style corpus and a set of
queries, then runs Search-R1 (PeterGriffinJin/Search-R1, the commit in COMMITS.md) from source:

  search_r1/search/index_builder.py    `Index_Builder(retrieval_method="e5", ...).build_index()` with the
                                       arguments of its build_index.sh (max_length 256, mean pooling,
                                       faiss_type Flat), fp32 (no --use_fp16) -> e5_Flat.index
  search_r1/search/retrieval_server.py its `DenseRetriever` behind its own `retrieve_endpoint`, configured
                                       as its `__main__` does for retrieval_launch.sh (retriever_name e5,
                                       pooling mean, query max length 256), fp32, faiss on CPU

Both files are run from a patched copy: the only edits are their `.cuda()` / `.to('cuda')` calls
(removed, so everything runs on the CPU); the script checks that each edit applies exactly as often
as expected and prints them. Written to --out:

  encoder/              the tiny encoder (config.json, model.safetensors, WordPiece tokenizer files)
  corpus.jsonl          {"id", "contents"} per line, contents = '"Title"\\ntext' as in wiki-18
  queries.json          the queries (a list of strings)
  e5_Flat.index         the faiss index Search-R1's builder wrote (faiss's own binary format)
  index_vectors.npy     its vectors (float32 [passages, hidden], row i = corpus line i)
  query_vectors.npy     the server's encoder's query vectors (float32 [queries, hidden])
  topk.json             the server's answer per query for topk 1 and 3: doc ids in rank order and scores

    python tools/search_r1_reference/make_reference.py --search-r1 DIR --commit SHA --out tests/data/search_r1_e5

DIR: a checkout of Search-R1 (its `search_r1/search/` is read from there). The interpreter needs
torch, transformers, datasets, faiss-cpu, numpy, tqdm, fastapi, pydantic and uvicorn (COMMITS.md: versions).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

SEED = 20260402
N_PASSAGES = 120
N_LONG = 8          # passages longer than 256 tokens: the builder's truncation is exercised
MAX_LENGTH = 256    # build_index.sh's --max_length; the server's retrieval_query_max_length

# Each file's edits: (old, new, times). Only the device moves are removed.
PATCHES = {
    "index_builder.py": [
        ("    model.cuda()\n", "    pass  # patched out: model.cuda()\n", 1),
        (").to('cuda')", ")  # patched out: .to('cuda')", 1),
        ("inputs = {k: v.cuda() for k, v in inputs.items()}", "inputs = {k: v for k, v in inputs.items()}  # patched out: v.cuda()", 1),
    ],
    "retrieval_server.py": [
        ("    model.cuda()\n", "    pass  # patched out: model.cuda()\n", 1),
        ("inputs = {k: v.cuda() for k, v in inputs.items()}", "inputs = {k: v for k, v in inputs.items()}  # patched out: v.cuda()", 1),
    ],
}

PEOPLE = ["Aldous", "Berenice", "Cassius", "Delphine", "Evander", "Fenella", "Gideon", "Honora", "Ignatius",
          "Jocasta", "Lysander", "Marisol", "Nikolai", "Ottoline", "Peregrine", "Rosalind", "Sebastian", "Thessaly"]
SURNAMES = ["Ashcombe", "Blackwood", "Carrow", "Dunmore", "Ellery", "Fairbairn", "Greaves", "Holloway", "Ingram",
            "Jardine", "Kestrel", "Lockhart", "Marwood", "Northcott", "Oakley", "Pendleton"]
PLACES = ["Avalmere", "Brightwater", "Coldharbour", "Dunstable", "Eastmarch", "Foxhollow", "Greystone", "Harrowgate",
          "Ivybridge", "Juniper Falls", "Kingsreach", "Larkspur", "Millbrook", "Northwold", "Oxmoor", "Pinecrest"]
THINGS = ["river", "cathedral", "railway", "observatory", "library", "harbour", "bridge", "university", "opera house",
          "lighthouse", "museum", "vineyard", "monastery", "canal", "fortress", "botanical garden"]
FIELDS = ["astronomy", "botany", "chemistry", "poetry", "architecture", "cartography", "music", "medicine",
          "geology", "mathematics", "painting", "navigation"]
VERBS = ["founded", "designed", "restored", "studied", "described", "mapped", "painted", "funded"]
FILLER = ["The records of the period are incomplete", "Local historians disagree about the exact date",
          "The event was reported in several newspapers", "A plaque now marks the site",
          "The collection was later moved to a larger building", "Visitors still come to see it every summer",
          "Its original plans were lost in a fire", "The work took more than a decade to finish"]


def make_corpus(rng: random.Random) -> tuple[list[dict], list[str]]:
    """Passages about made-up people, places and landmarks (ids "0".."N-1") and queries about them."""
    docs, facts = [], []
    for i in range(N_PASSAGES):
        person = f"{rng.choice(PEOPLE)} {rng.choice(SURNAMES)}"
        place, thing, field = rng.choice(PLACES), rng.choice(THINGS), rng.choice(FIELDS)
        verb, year = rng.choice(VERBS), rng.randint(1500, 1990)
        kind = i % 3
        if kind == 0:
            title = person
            body = [f"{person} was a scholar of {field} born in {place} in {year}.",
                    f"{person.split()[0]} {verb} the {thing} of {place}."]
            facts.append((f"who {verb} the {thing} of {place}", f"{field} scholar born in {place} in {year}"))
        elif kind == 1:
            title = f"{place} {thing.title()}"
            body = [f"The {thing} of {place} was {verb} by {person} in {year}.",
                    f"It is known for its connection to {field}."]
            facts.append((f"when was the {thing} of {place} {verb}", f"{thing} in {place} and {field}"))
        else:
            title = place
            body = [f"{place} is a town known for its {thing} and its school of {field}.",
                    f"In {year} {person} {verb} much of it."]
            facts.append((f"which town has a {thing} and a school of {field}", f"{person} in {year}"))
        body += rng.sample(FILLER, 2)
        if i < N_LONG:  # long enough to pass 256 tokens: truncation decides what the vector sees
            body += [f"{rng.choice(FILLER)} ({rng.choice(PLACES)}, {rng.randint(1500, 1990)})." for _ in range(40)]
        docs.append({"id": str(i), "contents": f'"{title}"\n' + " ".join(body)})
    picked = rng.sample(range(N_PASSAGES), 22)
    queries = [facts[k][0] + "?" for k in picked[:14]] + [facts[k][1] for k in picked[14:]]
    queries.append("Tell me about " + " and ".join(f"the {t} of {p}" for t, p in zip(THINGS, PLACES * 3)) * 4)  # > 256 tokens
    queries.append("lighthouse")
    return docs, queries


def build_encoder(out: Path, texts: list[str], seed: int) -> None:
    """A BERT-style encoder (random weights from a config) and a WordPiece tokenizer over `texts`' words."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    words = Counter(w for t in texts for w in re.findall(r"\w+|[^\w\s]", t.lower()))
    chars = sorted({c for t in texts for c in t.lower() if not c.isspace()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars + [f"##{c}" for c in chars]
    vocab += [w for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0])) if w not in vocab][:600]
    out.mkdir(parents=True, exist_ok=True)
    ids = {w: i for i, w in enumerate(vocab)}
    core = Tokenizer(models.WordPiece(vocab=ids, unk_token="[UNK]", max_input_chars_per_word=100))
    core.normalizer = normalizers.BertNormalizer(lowercase=True)
    core.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    core.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                  sep_token="[SEP]", mask_token="[MASK]", model_max_length=512)
    tok.save_pretrained(out)
    torch.manual_seed(seed)
    # a wider initialization than BERT's 0.02, so that a random encoder tells passages apart by their words
    config = BertConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=512, type_vocab_size=2,
                        initializer_range=0.5)
    model = BertModel(config)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)


def load_patched(src_dir: Path, name: str, work: Path):
    """Search-R1's `name` with only its device moves removed (each edit checked), imported as a module."""
    text = (src_dir / name).read_text()
    for old, new, times in PATCHES[name]:
        found = text.count(old)
        if found != times:
            sys.exit(f"{name}: expected {times} occurrence(s) of {old!r}, found {found}: another commit?")
        text = text.replace(old, new)
        print(f"patched {name}: {old.strip()!r} -> {new.strip()!r}")
    if ".cuda()" in text.replace("# patched out: model.cuda()", "").replace("# patched out: v.cuda()", ""):
        sys.exit(f"{name}: a .cuda() call is left")
    path = work / name
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"sr1_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--search-r1", required=True, type=Path, help="Search-R1 checkout (its search_r1/search/)")
    ap.add_argument("--commit", required=True, help="the Search-R1 commit DIR holds (recorded in topk.json)")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    import faiss
    import numpy as np
    import torch

    torch.set_num_threads(1)
    src = args.search_r1 / "search_r1" / "search"
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    docs, queries = make_corpus(random.Random(SEED))
    with open(out / "corpus.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps(d) + "\n")
    (out / "queries.json").write_text(json.dumps(queries, indent=1) + "\n")
    build_encoder(out / "encoder", [f"passage: {d['contents']}" for d in docs] + [f"query: {q}" for q in queries], SEED)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["HF_DATASETS_CACHE"] = str(work / "hf_datasets")
        builder_mod = load_patched(src, "index_builder.py", work)
        server_mod = load_patched(src, "retrieval_server.py", work)

        # index_builder.py's main() with build_index.sh's arguments, fp32 (no --use_fp16), e5's pooling
        builder = builder_mod.Index_Builder(
            retrieval_method="e5", model_path=str(out / "encoder"), corpus_path=str(out / "corpus.jsonl"),
            save_dir=str(work / "index"), max_length=MAX_LENGTH, batch_size=512, use_fp16=False,
            pooling_method="mean", faiss_type="Flat", embedding_path=None, save_embedding=False, faiss_gpu=False)
        builder.build_index()
        index_file = work / "index" / "e5_Flat.index"
        index = faiss.read_index(str(index_file))
        vectors = index.reconstruct_n(0, index.ntotal)
        (out / "e5_Flat.index").write_bytes(index_file.read_bytes())
        np.save(out / "index_vectors.npy", vectors.astype(np.float32))

        # retrieval_server.py's __main__ for retrieval_launch.sh (retriever_name e5), fp32, faiss on CPU
        config = server_mod.Config(
            retrieval_method="e5", index_path=str(index_file), corpus_path=str(out / "corpus.jsonl"),
            retrieval_topk=3, faiss_gpu=False, retrieval_model_path=str(out / "encoder"),
            retrieval_pooling_method="mean", retrieval_query_max_length=MAX_LENGTH, retrieval_use_fp16=False,
            retrieval_batch_size=512)
        server_mod.config = config
        server_mod.retriever = server_mod.get_retriever(config)
        np.save(out / "query_vectors.npy", server_mod.retriever.encoder.encode(queries).astype(np.float32))
        topk = {"search_r1_commit": args.commit, "queries": len(queries)}
        for k in (1, 3):
            resp = server_mod.retrieve_endpoint(server_mod.QueryRequest(queries=queries, topk=k, return_scores=True))
            topk[f"k{k}"] = {"ids": [[hit["document"]["id"] for hit in row] for row in resp["result"]],
                             "scores": [[float(hit["score"]) for hit in row] for row in resp["result"]]}
        # how close a tie is: the gap between the last passage returned and the next one, per query
        scores_all, _ = index.search(server_mod.retriever.encoder.encode(queries), 4)
        gaps = {k: float(np.min(scores_all[:, k - 1] - scores_all[:, k])) for k in (1, 3)}
        topk["min_gap"] = gaps
        print(f"{len(docs)} passages, {len(queries)} queries, dim {vectors.shape[1]}; smallest score gap "
              f"after rank 1: {gaps[1]:.2e}, after rank 3: {gaps[3]:.2e}")
        (out / "topk.json").write_text(json.dumps(topk, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
