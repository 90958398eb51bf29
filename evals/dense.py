"""`retriever=e5`: dense retrieval as Search-R1 does it (its `search_r1/search/retrieval_server.py` and
`index_builder.py`), over a flat inner-product faiss index.

- Encoder: an E5 model (an HF model dir or hub id; Search-R1 serves `intfloat/e5-base-v2`). A query is
  encoded as `query: ` + the query, a passage as `passage: ` + its `contents` (the whole wiki-18 line,
  `"Title"\\ntext`); both truncated at 256 tokens (build_index.sh's `--max_length 256`, the server's
  `retrieval_query_max_length=256`), mean-pooled over the attention mask, L2-normalized, float32.
  On CUDA the encoder runs in fp16, as Search-R1 runs it; on the CPU in fp32.
- Index: a faiss `IndexFlatIP` whose row i is corpus line i (Search-R1's `e5_Flat.index` over wiki-18
  loads as it is), read memory-mapped (`faiss.IO_FLAG_MMAP_IFC`): the pages are the OS page cache's, so
  every process of a node that opens the same file shares one copy (the 21M-passage flat index is
  ~61 GiB). `serve-retriever retriever=e5` serves one per node over HTTP.
  With `index=null` the project builds the index from the corpus (`build_index`; cached under the
  index root, keyed by the corpus file and the encoder's content) — for small corpora.
- Checked at start: the index file's header and size (before faiss reads it), then CHECK_ROWS passages
  re-encoded and compared with their stored rows (`check_rows`, cosine >= MIN_COSINE: an fp16-built
  index passes, another encoder or a reordered corpus is refused naming the first row that differs).
- Passages are read from the corpus jsonl by byte offset (an offsets table built once per corpus
  file, cached beside the index and memory-mapped too), never the whole corpus in memory.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from common import datafetch
from common.io import atomic_dir, sha256_text, write_json
from evals.corpus import RetrieverError, corpus_doc

DEFAULT_ENCODER = "encoder:e5-base-v2"   # intfloat/e5-base-v2, fetched by name (common.datafetch)
QUERY_PREFIX = "query: "       # retrieval_server.py: when the retriever name contains "e5"
PASSAGE_PREFIX = "passage: "   # index_builder.py: retrieval_method "e5"
MAX_LENGTH = 256               # build_index.sh --max_length; retrieval_server.py retrieval_query_max_length
BUILD_BATCH = 64               # passages per encoder call when building
BUILD_LIMIT = 1_000_000        # passages: a larger corpus's index is built once with Search-R1's index_builder.py
BUILD_MAX_BYTES = 1 << 30      # a corpus file larger than this is refused up front for index=null (wiki-18: 14 GB)
INDEX_FILE = "e5_Flat.index"
OFFSETS_FILE = "offsets.npy"
CACHE_FORMAT = 1
# At start, CHECK_ROWS corpus passages are re-encoded and compared with their index rows (check_rows): a
# cosine of at least MIN_COSINE passes. An index built in fp16 (Search-R1's, on its GPUs) read by an fp32
# encoder stays above 0.999 (0.9997 measured on the test encoder); another encoder, or the neighbouring
# passage of a reordered corpus, falls well below (0.96 at most on the test corpus).
CHECK_ROWS = 8
MIN_COSINE = 0.99


class DenseError(RetrieverError):
    """A dense retriever that cannot be set up (missing faiss, a bad index or corpus)."""


def default_index_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dtsft" / "e5"


def _faiss():
    try:
        import faiss
    except ImportError:
        raise DenseError("retriever=e5 needs faiss: pip install -e '.[dense]' (faiss-cpu)") from None
    return faiss


def _device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise DenseError(f"encoder_device={device}: CUDA is not available on this host")
    return str(device)


def encoder_dtype(device: str) -> str:
    """The encoder's dtype on `device` (auto resolved for this host): float16 on CUDA, float32 on the CPU."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return "float16" if str(device).startswith("cuda") else "float32"


class E5Encoder:
    """Search-R1's `Encoder` for an e5 model: prefix, truncate at `max_length`, mean-pool, normalize."""

    def __init__(self, model: str, device: str = "cpu", max_length: int = MAX_LENGTH):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.device = _device(device)
        self.max_length = int(max_length)
        from common.hub import source

        # a hub id at the commit its identity names (evals.identity); while the hub cannot answer its cached copy or one line now
        src = source(model, "encoder", DenseError)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model, use_fast=True, **src)
            self.model = AutoModel.from_pretrained(model, **src, adapter_kwargs={"local_files_only": src["local_files_only"]})
        except (OSError, ValueError) as exc:
            raise DenseError(f"encoder={model}: cannot load it as an HF model ({str(exc).splitlines()[0][:200]})") from None
        self.model.eval().to(self.device)
        if self.device.startswith("cuda"):   # Search-R1 serves and builds in fp16 on its GPUs
            self.model = self.model.to(torch.float16)

    def digest(self) -> str:
        """sha256 of what the vectors depend on: the weights (names, dtypes, bytes) and the tokenizer."""
        import hashlib

        import torch

        h = hashlib.sha256()
        for name, t in sorted(self.model.state_dict().items()):
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        h.update((backend.to_str() if backend is not None else repr(sorted(self.tokenizer.get_vocab().items()))).encode())
        return h.hexdigest()

    def encode(self, texts: list[str], is_query: bool) -> "np.ndarray":  # noqa: F821
        import numpy as np
        import torch

        prefix = QUERY_PREFIX if is_query else PASSAGE_PREFIX
        inputs = self.tokenizer([prefix + t for t in texts], max_length=self.max_length, padding=True,
                                truncation=True, return_tensors="pt")
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        with torch.no_grad():
            hidden = self.model(**inputs, return_dict=True).last_hidden_state
        mask = inputs["attention_mask"]
        pooled = hidden.masked_fill(~mask[..., None].bool(), 0.0).sum(dim=1) / mask.sum(dim=1)[..., None]
        pooled = torch.nn.functional.normalize(pooled, dim=-1)
        return pooled.float().cpu().numpy().astype(np.float32, order="C")


# faiss's file layout of an IndexFlatIP (faiss/impl/index_write.cpp): fourcc "IxFI", d (int32), ntotal (int64),
# two int64 placeholders, is_trained (uint8), metric_type (int32; 0 = inner product), the number of floats in
# the codes (uint64), then ntotal x d float32. Checked before faiss reads it: faiss trusts these fields (a
# file cut at 28-31 bytes crashed the process with SIGSEGV).
_FLAT_IP = struct.Struct("<4siqqqBiQ")


def check_index_file(path: Path) -> tuple[int, int]:
    """(d, ntotal) of a faiss IndexFlatIP file whose header reads and whose size is exactly what the
    header says; DenseError naming the file and what is wrong otherwise (nothing else is read)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(_FLAT_IP.size)
    if len(head) < _FLAT_IP.size:
        raise DenseError(f"index {path}: {size} bytes, shorter than a faiss IndexFlatIP header ({_FLAT_IP.size} bytes): "
                         "truncated, or not a faiss index")
    fourcc, d, ntotal, _, _, trained, metric, floats = _FLAT_IP.unpack(head)
    if fourcc != b"IxFI":
        raise DenseError(f"index {path}: starts with {fourcc!r}, not a faiss IndexFlatIP (b'IxFI'; Search-R1's "
                         "e5_Flat.index is one)")
    if not 0 < d <= 1 << 16 or ntotal < 0 or trained > 1 or metric != 0 or floats != d * ntotal:
        raise DenseError(f"index {path}: a damaged IndexFlatIP header (d={d}, ntotal={ntotal}, metric={metric}, "
                         f"{floats} floats stored)")
    if size != _FLAT_IP.size + 4 * floats:
        raise DenseError(f"index {path}: {size} bytes, but its header says {ntotal} vectors of dimension {d} "
                         f"({_FLAT_IP.size + 4 * floats} bytes): truncated or appended to")
    return d, ntotal


def read_index(path: str | Path):
    """A faiss index from disk, memory-mapped (flat codes in place: no copy in this process's heap),
    after its header and size are checked (check_index_file)."""
    faiss = _faiss()
    path = Path(path)
    if not path.is_file():
        raise DenseError(f"index {path} does not exist")
    check_index_file(path)
    try:
        index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)
    except RuntimeError as exc:
        raise DenseError(f"index {path}: not a faiss index faiss can memory-map ({str(exc).splitlines()[0][:160]})") from None
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise DenseError(f"index {path}: metric {index.metric_type} is not inner product (Search-R1's e5 index is IndexFlatIP)")
    return index


def index_to_gpus(index):
    """The index sharded over every visible GPU in fp16, as Search-R1's `--faiss_gpu` does
    (`GpuMultipleClonerOptions(useFloat16=True, shard=True)`); needs a faiss build with GPU support."""
    faiss = _faiss()
    if not hasattr(faiss, "GpuMultipleClonerOptions") or faiss.get_num_gpus() < 1:
        raise DenseError("faiss_gpu=true: this faiss has no GPU support or sees no GPU (install faiss-gpu, "
                         "e.g. conda's faiss-gpu, or faiss_gpu=false)")
    co = faiss.GpuMultipleClonerOptions()
    co.useFloat16 = True
    co.shard = True
    return faiss.index_cpu_to_all_gpus(index, co=co)


def _cache_key(ident: dict) -> str:
    return sha256_text(json.dumps(ident, sort_keys=True))[:20]


def _corpus_key(corpus: Path) -> dict:
    st = corpus.stat()
    return {"corpus": str(corpus.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def corpus_offsets(corpus: str | Path, root: str | Path | None = None):
    """Byte offset of every line of `corpus` (int64, memory-mapped), built once per corpus file and
    cached under `root/offsets/<key>/`; each line is checked like a BM25 corpus line."""
    import numpy as np

    corpus = Path(corpus)
    if not corpus.is_file():
        raise DenseError(f"corpus {corpus} does not exist")
    where = Path(root or default_index_root()) / "offsets" / _cache_key({**_corpus_key(corpus), "format": CACHE_FORMAT})
    if not (where / OFFSETS_FILE).is_file():
        offsets, seen, pos = [], set(), 0
        with open(corpus, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                if raw.strip():
                    try:
                        corpus_doc(corpus, lineno, raw.decode("utf-8"), seen)
                    except (RetrieverError, UnicodeDecodeError) as exc:
                        raise DenseError(str(exc) if isinstance(exc, RetrieverError)
                                         else f"{corpus}:{lineno}: not UTF-8") from None
                    offsets.append(pos)
                pos += len(raw)
        if not offsets:
            raise DenseError(f"corpus {corpus} has no documents")
        with atomic_dir(where, existing="replace") as tmp:   # a derived cache keyed by the corpus file
            np.save(tmp / OFFSETS_FILE, np.asarray(offsets, dtype=np.int64))
    return np.load(where / OFFSETS_FILE, mmap_mode="r")


def build_index(docs: "CorpusLines", encoder: E5Encoder, out: str | Path, batch: int = BUILD_BATCH) -> Path:
    """index_builder.py's dense build: every corpus line as `passage: ` + contents, encoded in batches,
    into an `IndexFlatIP` written to `out` (a file)."""
    import numpy as np

    faiss = _faiss()
    vectors = [encoder.encode([docs.doc(i)["contents"] for i in range(s, min(s + batch, len(docs)))], is_query=False)
               for s in range(0, len(docs), batch)]
    matrix = np.concatenate(vectors, axis=0)
    index = faiss.IndexFlatIP(matrix.shape[1])
    index.add(matrix)
    faiss.write_index(index, str(out))
    return Path(out)


def check_rows(index, docs: "CorpusLines", encoder: E5Encoder, index_path: Path, encoder_name: str) -> None:
    """Re-encode CHECK_ROWS passages spread over the corpus (first and last included) as the index was
    built (`passage: ` + contents, evals.dense) and compare each with its stored row: a cosine below
    MIN_COSINE is a DenseError naming the first row that differs. Catches an index built by another
    encoder of the same width, or a corpus reordered (or replaced) with the same number of lines; a
    swap of two rows that are not checked goes unseen."""
    import numpy as np

    n = len(docs)
    rows = sorted({round(k * (n - 1) / (CHECK_ROWS - 1)) for k in range(CHECK_ROWS)}) if n else []
    if not rows:
        return
    stored = np.stack([np.asarray(index.reconstruct(i), dtype=np.float32) for i in rows])
    fresh = encoder.encode([docs.doc(i)["contents"] for i in rows], is_query=False)
    norms = np.linalg.norm(stored, axis=1) * np.linalg.norm(fresh, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cosine = (stored * fresh).sum(axis=1) / norms
    for i, c in zip(rows, cosine):
        if not c >= MIN_COSINE:   # nan (a zero row) included
            raise DenseError(
                f"index {index_path} row {i} is not passage {i} of corpus {docs.path} (id {docs.doc(i)['id']!r}) as "
                f"encoder {encoder_name} encodes it: cosine {c:.3f} < {MIN_COSINE} (rows checked: "
                f"{', '.join(map(str, rows))}); the index was built by another encoder or from another order of "
                "this corpus")


class CorpusLines:
    """Corpus line i as `{"id", "contents"}`, read by its byte offset."""

    def __init__(self, corpus: str | Path, offsets):
        self.path, self.offsets = Path(corpus), offsets
        self._file = open(self.path, "rb")

    def __len__(self) -> int:
        return len(self.offsets)

    def doc(self, i: int) -> dict:
        self._file.seek(int(self.offsets[i]))
        row = json.loads(self._file.readline().decode("utf-8"))
        return {"id": str(row["id"]), "contents": row["contents"]}


def fetched(**given) -> dict:
    """{key: value as given, or for a fetch-data name (`corpus:wiki18`, `encoder:e5-base-v2`,
    `index:wiki18_e5_flat`; key = the name's kind) the path of its cached, checked copy}: every name's
    spelling checked first (a mistyped one: did you mean), then each read through common.datafetch
    (fetched on first use; an unpinned one refused until pre-filled)."""
    named = {key: datafetch.named(key, value, key) for key, value in given.items()}
    return {key: str(datafetch.path(value)) if named[key] else value for key, value in given.items()}


class E5Retriever:
    """Search-R1's DenseRetriever: encode the queries, search the flat index, read the passages. The
    corpus, encoder and index may be fetch-data names (`fetched`)."""

    def __init__(self, corpus: str | Path, encoder: str = DEFAULT_ENCODER, index: str | Path | None = None,
                 index_dir: str | Path | None = None, device: str = "cpu"):
        got = fetched(corpus=str(corpus), encoder=encoder, index=index if index is None else str(index))
        corpus, encoder, index = got["corpus"], got["encoder"], got["index"]
        self.corpus_path = Path(corpus)
        if not self.corpus_path.is_file():
            raise DenseError(f"corpus {self.corpus_path} does not exist (pass corpus=PATH)")
        _faiss()
        if index is not None and Path(index).is_file():   # a damaged index is refused before the encoder loads
            check_index_file(Path(index))
        root = Path(index_dir) if index_dir else default_index_root()
        self.encoder = E5Encoder(encoder, device)
        self.built = False
        self.docs = CorpusLines(self.corpus_path, corpus_offsets(self.corpus_path, root))
        if index is None:
            index = self._built_index(root, encoder)
        self.index_path = Path(index)
        self.index = read_index(self.index_path)
        self.num_docs = len(self.docs)
        if self.index.ntotal != self.num_docs:
            raise DenseError(f"index {self.index_path} holds {self.index.ntotal} vectors but corpus {self.corpus_path} "
                             f"has {self.num_docs} passages: row i of the index must be line i of the corpus")
        if self.index.d != self.encoder.model.config.hidden_size:
            raise DenseError(f"index {self.index_path} has dimension {self.index.d}, encoder {encoder} "
                             f"{self.encoder.model.config.hidden_size}: another encoder built it")
        check_rows(self.index, self.docs, self.encoder, self.index_path, encoder)

    def _built_index(self, root: Path, encoder: str) -> Path:
        key = _cache_key({**_corpus_key(self.corpus_path), "encoder": self.encoder.digest(),
                          "max_length": MAX_LENGTH, "format": CACHE_FORMAT})
        where = root / "built" / key
        if not (where / INDEX_FILE).is_file():
            if len(self.docs) > BUILD_LIMIT:
                raise DenseError(f"corpus {self.corpus_path} has {len(self.docs)} passages: index=null builds an index "
                                 f"for at most {BUILD_LIMIT}; pass index=FILE (Search-R1's e5_Flat.index for wiki-18)")
            with atomic_dir(where, existing="replace") as tmp:   # a derived cache keyed by corpus + encoder
                build_index(self.docs, self.encoder, tmp / INDEX_FILE)
                write_json(tmp / "index_meta.json", {"corpus": str(self.corpus_path.resolve()), "encoder": str(encoder),
                                                     "max_length": MAX_LENGTH})
            self.built = True
        return where / INDEX_FILE

    def search(self, queries: list[str], topk: int) -> list[list[dict]]:
        if not queries:
            return []
        scores, rows = self.index.search(self.encoder.encode(list(queries), is_query=True), min(int(topk), self.num_docs))
        return [[{**self.docs.doc(int(r)), "score": float(s)} for r, s in zip(row_r, row_s) if r >= 0]
                for row_r, row_s in zip(rows, scores)]
