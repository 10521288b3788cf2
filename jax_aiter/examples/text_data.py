"""Token streams for the real-text convergence benchmark: open a corpus, split it, draw training and held-out windows.

Pure numpy (no jax), so the data layer is testable and deterministic on any machine. Formats (:func:`open_corpus`):

* ``"bytes"``: any file read as bytes, vocabulary 256; a directory is its files in order of relative path (as POSIX
  strings), concatenated;
* ``"uint16"`` / ``"uint32"``: a flat little-endian token file;
* ``"megatron"``: Megatron-LM's indexed dataset, ``<prefix>.idx`` (the MMIDIDX index) + ``<prefix>.bin`` (the
  tokens), the format of MLPerf's preprocessed C4; documents concatenated in order.

Windows are ``seq_len + 1`` tokens (inputs ``[:, :-1]``, targets ``[:, 1:]``) starting at multiples of ``seq_len``,
so neighbouring windows share only their boundary token and no token is a target twice in an epoch.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

KINDS = ("auto", "bytes", "uint16", "uint32", "megatron")
_SUFFIX_KINDS = {".bin": "megatron", ".idx": "megatron", ".u16": "uint16", ".uint16": "uint16",
                 ".u32": "uint32", ".uint32": "uint32"}
BYTE_VOCAB = 256

# Megatron-LM's index: magic, u64 version (1), u8 dtype code, u64 sequence count, u64 document-index length, then
# int32 sizes[sequences], int64 byte pointers[sequences], int64 document index[length] (the first sequence of each
# document, ending with the sequence count), and in multimodal datasets int8 modes[sequences].
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
_MEGATRON_HEADER = struct.Struct("<9sQBQQ")
MEGATRON_DTYPES = {1: np.dtype("u1"), 2: np.dtype("i1"), 3: np.dtype("<i2"), 4: np.dtype("<i4"), 5: np.dtype("<i8"),
                   6: np.dtype("<f8"), 7: np.dtype("<f4"), 8: np.dtype("<u2")}


class _Digest:
    """The sha256 of a corpus's source: its files' bytes in order, or the tokens' bytes when it has no files.
    Shared by a corpus and its split parts, so a large source is hashed at most once."""

    def __init__(self, sources: tuple[Path, ...], tokens: np.ndarray):
        self._sources = sources
        self._tokens = tokens
        self._value: str | None = None

    def value(self) -> str:
        if self._value is None:
            digest = hashlib.sha256()
            if self._sources:
                for source in self._sources:
                    with open(source, "rb") as stream:
                        while chunk := stream.read(1 << 24):
                            digest.update(chunk)
            else:
                digest.update(np.ascontiguousarray(self._tokens).tobytes())
            self._value = digest.hexdigest()
        return self._value


class TokenCorpus:
    """A read-only token stream.

    ``tokens``: 1-D unsigned integers (a read-only array or ``np.memmap``), every one ``< vocab_size``;
    ``name``: what it is (a split part is ``<name>[train]`` / ``<name>[held-out]``);
    ``sources``: the files it was read from, in order; ``span``: ``(start, stop)`` of ``tokens`` in the source's
    token stream; ``sha256``: of the source files' bytes in order (of the tokens' bytes when there are no files),
    computed on first use and shared with the split parts.
    """

    def __init__(self, tokens: np.ndarray, vocab_size: int, name: str, sources: Sequence[str | Path] = ()):
        tokens = _read_only(_unsigned_tokens(tokens))
        vocab_size = _checked_vocab(tokens, vocab_size, name)
        self._init(tokens, vocab_size, name, tuple(Path(s) for s in sources), (0, len(tokens)), None)

    def _init(self, tokens, vocab_size, name, sources, span, digest):
        self.tokens = tokens
        self.vocab_size = vocab_size
        self.name = name
        self.sources = sources
        self.span = span
        self._digest = digest or _Digest(sources, tokens)

    @classmethod
    def _part(cls, whole: TokenCorpus, start: int, stop: int, label: str) -> TokenCorpus:
        part = cls.__new__(cls)
        span = (whole.span[0] + start, whole.span[0] + stop)
        part._init(whole.tokens[start:stop], whole.vocab_size, f"{whole.name}[{label}]", whole.sources, span,
                   whole._digest)
        return part

    @property
    def sha256(self) -> str:
        return self._digest.value()

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        return (f"TokenCorpus(name={self.name!r}, tokens={len(self)}, dtype={self.tokens.dtype}, "
                f"vocab_size={self.vocab_size}, span={self.span})")


def open_corpus(path: str | Path, *, kind: str = "auto", vocab_size: int | None = None) -> TokenCorpus:
    """Open a token corpus (formats in the module docstring). ``kind="auto"`` picks by suffix: ``.bin``/``.idx`` (or a
    prefix with a ``.idx`` beside it) is megatron, ``.u16``/``.uint16`` uint16, ``.u32``/``.uint32`` uint32, anything
    else (a directory too) bytes. ``vocab_size``: every token must be below it; by default 256 for bytes, else the
    largest token + 1."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    path = Path(path)
    if kind == "auto":
        kind = _auto_kind(path)
    if kind == "megatron":
        return _open_megatron(path, vocab_size)
    if not path.exists():
        raise FileNotFoundError(f"path: no such file or directory: {path}")
    if kind == "bytes":
        return _open_bytes(path, vocab_size)
    return _open_flat(path, np.dtype("<u2" if kind == "uint16" else "<u4"), vocab_size)


def split(corpus: TokenCorpus, held_out_fraction: float = 0.05) -> tuple[TokenCorpus, TokenCorpus]:
    """``(train, held_out)``: the first part and the last ``round(len * held_out_fraction)`` tokens, contiguous and
    disjoint, both views of ``corpus.tokens``."""
    _check_corpus(corpus)
    if isinstance(held_out_fraction, bool) or not isinstance(held_out_fraction, (int, float)) \
            or not 0.0 < held_out_fraction < 1.0:
        raise ValueError(f"held_out_fraction must be a number in (0, 1); got {held_out_fraction!r}")
    total = len(corpus)
    held_out = round(total * held_out_fraction)
    if not 0 < held_out < total:
        raise ValueError(f"held_out_fraction={held_out_fraction} of corpus {corpus.name!r} ({total} tokens) leaves "
                         f"{held_out} held-out tokens: one part would be empty")
    boundary = total - held_out
    return TokenCorpus._part(corpus, 0, boundary, "train"), TokenCorpus._part(corpus, boundary, total, "held-out")


def window_count(corpus: TokenCorpus, seq_len: int) -> int:
    """How many windows of ``seq_len + 1`` tokens start at multiples of ``seq_len`` inside ``corpus``."""
    _check_corpus(corpus)
    _check_positive(seq_len, "seq_len")
    return (len(corpus) - 1) // seq_len


def epoch_fraction(corpus: TokenCorpus, steps: int, batch: int, seq_len: int) -> float:
    """The share of ``corpus``'s windows that ``steps`` batches of :func:`train_batches` draw; at most 1.0 means no
    window is drawn twice (the same as ``steps * batch * seq_len < len(corpus)``)."""
    _check_positive(steps, "steps", allow_zero=True)
    _check_positive(batch, "batch")
    return steps * batch / window_count(corpus, seq_len)


def train_batches(corpus: TokenCorpus, batch: int, seq_len: int, seed: int) -> Iterator[np.ndarray]:
    """Endless int32 batches ``[batch, seq_len + 1]`` of training windows.

    Each epoch is a seeded permutation of all :func:`window_count` windows cut into ``window_count // batch``
    batches (the remainder is left out of that epoch); then the next epoch's permutation. The permutation sorts one
    PCG64 raw 64-bit draw per window (SeedSequence-seeded from ``seed``), which numpy keeps identical across
    versions and machines, so the same seed gives the same batches everywhere.
    """
    _check_corpus(corpus)
    _check_positive(batch, "batch")
    _check_positive(seq_len, "seq_len")
    _check_positive(seed, "seed", allow_zero=True)
    _check_int32_vocab(corpus)
    windows = window_count(corpus, seq_len)
    if windows < batch:
        raise ValueError(f"corpus {corpus.name!r} ({len(corpus)} tokens) has {windows} windows of seq_len={seq_len}, "
                         f"fewer than batch={batch}")
    return _epochs(corpus.tokens, windows, batch, seq_len, np.random.PCG64(seed))


def held_out_batches(corpus: TokenCorpus, count: int, batch: int, seq_len: int) -> list[np.ndarray]:
    """``count`` int32 batches ``[batch, seq_len + 1]``: ``count * batch`` windows evenly spaced from the start to
    the end of ``corpus`` (no seed; each token is a target at most once)."""
    _check_corpus(corpus)
    _check_positive(count, "count")
    _check_positive(batch, "batch")
    _check_positive(seq_len, "seq_len")
    _check_int32_vocab(corpus)
    windows = count * batch
    needed = windows * seq_len + 1
    if len(corpus) < needed:
        raise ValueError(f"corpus {corpus.name!r} has {len(corpus)} tokens; count={count} x batch={batch} windows of "
                         f"seq_len={seq_len} need at least {needed}")
    last_start = len(corpus) - seq_len - 1
    stride = last_start // (windows - 1) if windows > 1 else 0
    starts = (np.arange(windows, dtype=np.int64) * stride).reshape(count, batch)
    return [_gather(corpus.tokens, row, seq_len) for row in starts]


def _epochs(tokens: np.ndarray, windows: int, batch: int, seq_len: int, bits: np.random.PCG64):
    steps_per_epoch = windows // batch
    while True:
        order = np.argsort(bits.random_raw(windows), kind="stable")
        for window_ids in order[:steps_per_epoch * batch].reshape(steps_per_epoch, batch):
            yield _gather(tokens, window_ids * seq_len, seq_len)


def _gather(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> np.ndarray:
    return tokens[starts[:, None] + np.arange(seq_len + 1)].astype(np.int32)


def _auto_kind(path: Path) -> str:
    if path.is_dir():
        return "bytes"
    suffix_kind = _SUFFIX_KINDS.get(path.suffix.lower())
    if suffix_kind is not None:
        return suffix_kind
    if not path.exists() and _with_suffix(path, ".idx").is_file():
        return "megatron"
    return "bytes"


def _with_suffix(prefix: Path, suffix: str) -> Path:
    return prefix.with_name(prefix.name + suffix)


def _open_bytes(path: Path, vocab_size: int | None) -> TokenCorpus:
    if path.is_dir():
        files = sorted((p for p in path.rglob("*") if p.is_file()), key=lambda p: p.relative_to(path).as_posix())
    else:
        files = [path]
    if not sum(f.stat().st_size for f in files):
        raise ValueError(f"path: {path} is empty")
    if path.is_dir():
        tokens = np.concatenate([np.fromfile(f, dtype=np.uint8) for f in files])
    else:
        tokens = _memmap(path, np.dtype(np.uint8), path.stat().st_size)
    return TokenCorpus(tokens, BYTE_VOCAB if vocab_size is None else vocab_size, path.name, files)


def _open_flat(path: Path, dtype: np.dtype, vocab_size: int | None) -> TokenCorpus:
    if path.is_dir():
        raise ValueError(f"path: {path} is a directory; a {dtype.name} token file is one flat file")
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise ValueError(f"path: {path} is truncated: {size} bytes is not a whole number of {dtype.name} tokens")
    if not size:
        raise ValueError(f"path: {path} is empty")
    return TokenCorpus(_memmap(path, dtype, size // dtype.itemsize), vocab_size, path.name, [path])


def _open_megatron(path: Path, vocab_size: int | None) -> TokenCorpus:
    prefix = path.with_suffix("") if path.suffix.lower() in (".bin", ".idx") else path
    idx_path, bin_path = _with_suffix(prefix, ".idx"), _with_suffix(prefix, ".bin")
    for required in (idx_path, bin_path):
        if not required.is_file():
            raise FileNotFoundError(f"path: Megatron dataset {prefix} needs {required}, which does not exist")
    idx_size = idx_path.stat().st_size
    if idx_size < _MEGATRON_HEADER.size:
        raise ValueError(f"path: {idx_path} is truncated: {idx_size} bytes, the header alone is "
                         f"{_MEGATRON_HEADER.size}")
    with open(idx_path, "rb") as stream:
        magic, version, code, sequences, index_length = _MEGATRON_HEADER.unpack(stream.read(_MEGATRON_HEADER.size))
    if magic != MEGATRON_MAGIC:
        raise ValueError(f"path: {idx_path} is not a Megatron index: magic {magic!r}, expected {MEGATRON_MAGIC!r}")
    if version != 1:
        raise ValueError(f"path: {idx_path} has index version {version}; only version 1 exists")
    dtype = MEGATRON_DTYPES.get(code)
    if dtype is None or dtype.kind == "f":
        raise ValueError(f"path: {idx_path} has dtype code {code} ({dtype or 'unknown'}); token ids need an integer "
                         f"code of {sorted(c for c, d in MEGATRON_DTYPES.items() if d.kind != 'f')}")
    arrays_end = _MEGATRON_HEADER.size + 12 * sequences + 8 * index_length
    if idx_size not in (arrays_end, arrays_end + sequences):  # the second: a multimodal index (int8 mode per sequence)
        state = "truncated" if idx_size < arrays_end else "longer than its header says"
        raise ValueError(f"path: {idx_path} is {state}: {idx_size} bytes for {sequences} sequences and a document "
                         f"index of {index_length}, expected {arrays_end} (or {arrays_end + sequences} multimodal)")
    index = np.memmap(idx_path, dtype=np.uint8, mode="r")
    offset = _MEGATRON_HEADER.size
    sizes = index[offset:offset + 4 * sequences].view("<i4")
    offset += 4 * sequences
    pointers = index[offset:offset + 8 * sequences].view("<i8")
    offset += 8 * sequences
    document_index = index[offset:offset + 8 * index_length].view("<i8")
    _check_megatron_index(idx_path, sizes, pointers, document_index, dtype.itemsize)

    total = int(sizes.sum(dtype=np.int64))
    bin_size = bin_path.stat().st_size
    if bin_size != total * dtype.itemsize:
        state = "truncated" if bin_size < total * dtype.itemsize else "longer than its index says"
        raise ValueError(f"path: {bin_path} is {state}: {bin_size} bytes, the index lists {total} {dtype.name} "
                         f"tokens ({total * dtype.itemsize} bytes)")
    if not total:
        raise ValueError(f"path: Megatron dataset {prefix} has no tokens")
    tokens = _memmap(bin_path, dtype, total)
    if dtype.kind == "i":
        # Same bytes as unsigned ids; a negative id shows up as one at or above 2**(bits - 1).
        tokens = tokens.view(dtype.str.replace("i", "u"))
        largest = int(tokens.max())
        if largest >= 1 << (8 * dtype.itemsize - 1):
            raise ValueError(f"path: {bin_path} holds a negative token id (position {int(tokens.argmax())})")
    return TokenCorpus(tokens, vocab_size, prefix.name, [idx_path, bin_path])


def _check_megatron_index(idx_path: Path, sizes, pointers, document_index, itemsize: int) -> None:
    if (sizes < 0).any():
        raise ValueError(f"path: {idx_path} has a negative sequence size")
    if not np.array_equal(pointers, (np.cumsum(sizes, dtype=np.int64) - sizes) * itemsize):
        raise ValueError(f"path: {idx_path} has sequence pointers that are not back to back in order; only contiguous "
                         f"datasets (as Megatron's builder writes them) are read")
    if len(document_index) and (document_index[0] != 0 or document_index[-1] != len(sizes)
                                or (np.diff(document_index) < 0).any()):
        raise ValueError(f"path: {idx_path} has a document index that does not run in order from 0 to the "
                         f"sequence count {len(sizes)}")


def _memmap(path: Path, dtype: np.dtype, count: int) -> np.ndarray:
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))


def _unsigned_tokens(tokens) -> np.ndarray:
    if not isinstance(tokens, np.ndarray) or tokens.ndim != 1 or tokens.dtype.kind != "u":
        raise ValueError(f"tokens must be a 1-D numpy array of an unsigned integer dtype; got "
                         f"{getattr(tokens, 'dtype', type(tokens).__name__)} of shape {getattr(tokens, 'shape', '?')}")
    if not len(tokens):
        raise ValueError("tokens is empty")
    return tokens


def _read_only(tokens: np.ndarray) -> np.ndarray:
    if tokens.flags.writeable:
        tokens = tokens.view()
        tokens.flags.writeable = False
    return tokens


def _checked_vocab(tokens: np.ndarray, vocab_size: int | None, name: str) -> int:
    largest = int(tokens.max())
    if vocab_size is None:
        return largest + 1
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive integer or None; got {vocab_size!r}")
    if largest >= vocab_size:
        raise ValueError(f"vocab_size={vocab_size} is too small for {name!r}: token {largest} at position "
                         f"{int(tokens.argmax())}")
    return int(vocab_size)


def _check_corpus(corpus) -> None:
    if not isinstance(corpus, TokenCorpus):
        raise TypeError(f"corpus must be a TokenCorpus; got {type(corpus).__name__}")


def _check_positive(value, name: str, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < (0 if allow_zero else 1):
        raise ValueError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} integer; got {value!r}")


def _check_int32_vocab(corpus: TokenCorpus) -> None:
    if corpus.vocab_size > np.iinfo(np.int32).max + 1:
        raise ValueError(f"corpus {corpus.name!r} has vocab_size={corpus.vocab_size}; batches are int32")
