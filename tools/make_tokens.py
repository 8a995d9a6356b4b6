#!/usr/bin/env python3
"""make_tokens.py: write cpgen token shards (docs/DATA.md: 32-byte header "CPGTOK01", u32 version 2, u32 token
bytes, u64 count, u64 end-of-document id + 1, then little-endian tokens) from text, with an end-of-document token
after every document, optionally holding documents out for validation shards. The header records the
end-of-document id, so cpgen finds where documents begin (data.documents = "mask").

    # train a byte-level BPE tokenizer of 32K tokens on the inputs (needs the `tokenizers` package, no network),
    # hold out 2% of the documents for validation
    python3 tools/make_tokens.py --train-bpe 32000 --val-fraction 0.02 --out data/py/text \\
        --include '*.py' /usr/lib/python3.12
    # one token per byte (vocabulary 256 + the end-of-document token): no package needed
    python3 tools/make_tokens.py --byte-level --out data/bytes/text notes/ 'docs/**/*.md'
    # a Hugging Face tokenizer by name or folder (needs `transformers`, and the network for a name)
    python3 tools/make_tokens.py --tokenizer meta-llama/Llama-3.1-8B --out data/shard *.txt
    # llm.c shards (fineweb_train_000001.bin, ...) converted without re-tokenising
    # (--eod 50256: their GPT-2 <|endoftext|>, which separates documents, recorded in the headers)
    python3 tools/make_tokens.py --from-llmc --eod 50256 --out data/shard fineweb_train_*.bin

Inputs are files, folders (searched recursively; --include and --exclude choose files by name or path) and glob
patterns (`**` matches folders at any depth). Each file is one document; a file that is not UTF-8 text (or holds a
NUL byte) is skipped, and so is a second path to a file already taken (a link) or a copy of one (the same bytes).
Documents are taken in the byte order of their paths, so the same inputs give the same shards on any machine; with
--shuffle each side is written in the order of the SHA-256 of "shuffle:" and the path instead, as fixed, but with the
folders' documents spread through the shards (a run reading them in order then sees a mix in every stretch, not one
folder's kind of text after another's). --piece-bytes N cuts each document, once it is on its side, into pieces of
at most N bytes at line ends, each a document of its own (path#0, path#1, ... for --shuffle): a document of
megabytes otherwise fills a stretch of consecutive sequences, dozens of steps of one kind of text.

Writes <out>_000000.bin, <out>_000001.bin, ... (train with data.source = "tokens:<out>_[0-9]*.bin"), with
--val-fraction F also <out>_val_000000.bin, ... from the held-out documents (data.val = "tokens:<out>_val_*.bin"),
and <out>.json: the tokenizer, its vocabulary size, the end-of-document id, the model.vocab to train with (the
vocabulary rounded up to a multiple of 64; cpgen needs a multiple of 8), documents and tokens per split, and the
data sources. --train-bpe also writes the tokenizer as tokenizer.json in the shards' folder. Uses only the
standard library; --train-bpe needs `tokenizers`, --tokenizer `transformers`."""
import argparse
import array
import fnmatch
import glob
import hashlib
import json
import os
import struct
import sys

EOD_TOKEN = "<|endoftext|>"
MAGIC = b"CPGTOK01"


def fail(msg):
    sys.exit(f"make_tokens.py: {msg}")


# ---------------------------------------------------------------------------------------------------------------
# inputs


def wanted(path, include, exclude):
    name = os.path.basename(path)
    if any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(name, p) for p in exclude):
        return False
    return not include or any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(path, p) for p in include)


def list_inputs(inputs, include, exclude):
    """Every file the inputs name, each once (by its real path), in the byte order of the paths."""
    found = []
    for arg in inputs:
        if os.path.isdir(arg):
            for top, dirs, files in os.walk(arg):  # links to folders are not followed: no loops, no duplicates
                dirs.sort()
                found += [os.path.join(top, f) for f in files if wanted(os.path.join(top, f), include, exclude)]
        elif os.path.exists(arg):
            found.append(arg)  # named: taken whatever --include says
        else:
            matches = [m for m in glob.glob(arg, recursive=True)]
            if not matches:
                fail(f"{arg}: no such file or folder, and no file matches it as a pattern")
            for m in matches:
                if os.path.isdir(m):
                    found += list_inputs([m], include, exclude)
                elif wanted(m, include, exclude):
                    found.append(m)
    seen, out = set(), []
    for p in sorted(found, key=lambda p: os.fsencode(p)):
        real = os.path.realpath(p)
        if real in seen or not os.path.isfile(real):
            continue
        seen.add(real)
        out.append(p)
    return out


def read_documents(paths, max_file_bytes, max_bytes):
    """(path, text) of every input that is UTF-8 text without NUL bytes, up to max_bytes in all; and what was
    skipped, by reason."""
    docs, skipped, total, digests = [], {}, 0, set()
    for p in paths:
        try:
            size = os.path.getsize(p)
            if size > max_file_bytes:
                skipped["larger than --max-file-bytes"] = skipped.get("larger than --max-file-bytes", 0) + 1
                continue
            with open(p, "rb") as f:
                raw = f.read()
        except OSError:
            skipped["unreadable"] = skipped.get("unreadable", 0) + 1
            continue
        if b"\0" in raw:
            skipped["not text"] = skipped.get("not text", 0) + 1
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            skipped["not text"] = skipped.get("not text", 0) + 1
            continue
        if not text.strip():
            skipped["empty"] = skipped.get("empty", 0) + 1
            continue
        digest = hashlib.sha256(raw).digest()
        if digest in digests:  # a copy of a file already taken (licences and changelogs ship in several packages)
            skipped["a copy of another"] = skipped.get("a copy of another", 0) + 1
            continue
        if max_bytes and total + len(raw) > max_bytes:
            skipped["past --max-bytes"] = skipped.get("past --max-bytes", 0) + 1
            continue
        digests.add(digest)
        total += len(raw)
        docs.append((p, text))
    return docs, skipped, total


def split_documents(docs, fraction):
    """(train, val): round(fraction x n) documents held out (at least one when fraction > 0 and there are two), chosen
    by the SHA-256 of their paths, so that the choice does not depend on the listing and a document stays on its side
    when others are added; each side keeps the path order."""
    if fraction <= 0 or len(docs) < 2:
        return docs, []
    k = min(len(docs) - 1, max(1, round(fraction * len(docs))))
    ranked = sorted(range(len(docs)), key=lambda i: hashlib.sha256(os.fsencode(docs[i][0])).digest())
    held = set(ranked[:k])
    return [d for i, d in enumerate(docs) if i not in held], [d for i, d in enumerate(docs) if i in held]


def pieces(docs, piece_bytes):
    """docs with each one cut into pieces of at most piece_bytes of UTF-8, each piece ending at the last line end
    that fits (a line longer than that is cut at a character boundary), named path#0, path#1, ...: a run that reads
    shuffled pieces meets a long document a piece at a time, spread through the run, not as a stretch of steps."""
    out = []
    for path, text in docs:
        raw = text.encode("utf-8")
        at, k = 0, 0
        while at < len(raw):
            end = min(len(raw), at + piece_bytes)
            if end < len(raw):
                nl = raw.rfind(b"\n", at, end)
                if nl >= at:
                    end = nl + 1
                else:
                    while raw[end] & 0xC0 == 0x80:  # not inside a character
                        end -= 1
            out.append((f"{path}#{k}", raw[at:end].decode("utf-8")))
            at, k = end, k + 1
    return out


def shuffled(docs):
    """docs in the order of the SHA-256 of "shuffle:" and their paths: fixed for given paths, unrelated to path order
    and to which documents split_documents holds out"""
    return sorted(docs, key=lambda d: hashlib.sha256(b"shuffle:" + os.fsencode(d[0])).digest())


# ---------------------------------------------------------------------------------------------------------------
# tokenizers: each a name, a vocabulary size, the end-of-document id and a function from texts to lists of ids


class ByteLevel:
    name = "byte-level"
    vocab_size = 257
    eod_id = 256
    eod_token = EOD_TOKEN

    def encode(self, texts):
        return [t.encode("utf-8") for t in texts]  # bytes: a sequence of ids 0..255


class Bpe:
    def __init__(self, vocab, texts, path):
        try:
            from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        except ImportError:
            fail("--train-bpe needs the `tokenizers` package (pip install tokenizers); --byte-level needs nothing")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOD_TOKEN], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
        tok.save(path)
        self.tok, self.path = tok, path
        self.name = f"byte-level BPE trained here ({os.path.basename(path)})"
        self.vocab_size = tok.get_vocab_size()
        self.eod_id, self.eod_token = tok.token_to_id(EOD_TOKEN), EOD_TOKEN

    def encode(self, texts):
        return [e.ids for e in self.tok.encode_batch(texts)]


class HuggingFace:
    def __init__(self, name):
        try:
            from transformers import AutoTokenizer
        except ImportError:
            fail("--tokenizer needs the `transformers` package; --train-bpe or --byte-level make a tokenizer here")
        self.tok = AutoTokenizer.from_pretrained(name)
        self.name = name
        self.vocab_size = len(self.tok)
        eos = self.tok.eos_token_id is not None
        self.eod_id = self.tok.eos_token_id if eos else self.tok.bos_token_id
        self.eod_token = self.tok.eos_token if eos else self.tok.bos_token
        if self.eod_id is None:
            fail(f"{name}: the tokenizer has neither an EOS nor a BOS token to end documents with")

    def encode(self, texts):
        return self.tok(texts, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------------------------------------------------
# shards


def write_shard(path, tokens, width, eod):
    """Version 2: the last header field is the end-of-document id + 1 (0: none)."""
    a = array.array("H" if width == 2 else "I", tokens)
    assert a.itemsize == width
    if sys.byteorder == "big":
        a.byteswap()
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(MAGIC + struct.pack("<IIQQ", 2, width, len(a), 0 if eod is None else eod + 1))
        f.write(a.tobytes())
    os.replace(tmp, path)  # atomic: a reader never sees half a shard


class ShardWriter:
    """Tokens in, shards of shard_tokens out; the last shard, when shorter than half of that, joins the one before
    (a short shard holds no long sequence: cpgen refuses a shard of fewer than seq_len + 1 tokens)."""

    def __init__(self, prefix, shard_tokens, width, eod):
        self.prefix, self.n, self.width, self.eod = prefix, shard_tokens, width, eod
        self.buf = array.array("I")
        self.paths, self.counts = [], []
        self.pending = None  # the last full shard, held until the remainder is known

    def add(self, ids):
        self.buf.extend(ids)
        while len(self.buf) >= 2 * self.n:
            self._emit(self.buf[: self.n])
            self.buf = self.buf[self.n:]

    def _emit(self, tokens):
        if self.pending is not None:
            self._write(self.pending)
        self.pending = tokens

    def _write(self, tokens):
        path = f"{self.prefix}_{len(self.paths):06d}.bin"
        write_shard(path, tokens, self.width, self.eod)
        self.paths.append(path)
        self.counts.append(len(tokens))

    def close(self):
        if len(self.buf) >= self.n:
            self._emit(self.buf[: self.n])
            self.buf = self.buf[self.n:]
        rest = self.buf
        if self.pending is not None and len(rest) < self.n // 2:
            self._write(self.pending + rest)
        else:
            if self.pending is not None:
                self._write(self.pending)
            if len(rest):
                self._write(rest)
        return self.paths, self.counts


def tokenize_split(docs, tok, prefix, shard_tokens, width, batch=256):
    w = ShardWriter(prefix, shard_tokens, width, tok.eod_id)
    for at in range(0, len(docs), batch):
        for ids in tok.encode([t for _, t in docs[at:at + batch]]):
            if len(ids) and max(ids) >= tok.vocab_size:
                fail(f"a token id {max(ids)} is not below the vocabulary size {tok.vocab_size}")
            w.add(ids)
            w.add((tok.eod_id,))
    return w.close()


def llmc_header(f, path):
    raw = f.read(256 * 4)
    header = array.array("i")
    header.frombytes(raw[: len(raw) // 4 * 4])
    if sys.byteorder == "big":
        header.byteswap()
    if len(header) < 256 or header[0] != 20240520 or header[1] not in (1, 2):
        fail(f"{path}: not an llm.c token file (magic {header[0] if header else '?'})")
    return header


def read_llmc(path):
    """The file's tokens, as 4-byte ids."""
    with open(path, "rb") as f:
        header = llmc_header(f, path)
        a = array.array("H" if header[1] == 1 else "I")
        data = f.read(header[2] * a.itemsize)
        if len(data) != header[2] * a.itemsize:
            fail(f"{path}: the header says {header[2]} tokens, the file holds fewer")
        a.frombytes(data)
        if sys.byteorder == "big":
            a.byteswap()
        return a if a.typecode == "I" else array.array("I", a)


def llmc_width(paths):
    """2 when every file holds 2-byte tokens (version 1), else 4."""
    width = 2
    for p in paths:
        with open(p, "rb") as f:
            width = max(width, 2 if llmc_header(f, p)[1] == 1 else 4)
    return width


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="text files, folders or glob patterns; llm.c .bin files with --from-llmc")
    ap.add_argument("--out", required=True, help="shard path prefix: <out>_000000.bin, ..., <out>.json")
    how = ap.add_mutually_exclusive_group(required=True)
    how.add_argument("--train-bpe", type=int, metavar="VOCAB", help="train a byte-level BPE tokenizer of VOCAB tokens")
    how.add_argument("--byte-level", action="store_true", help="one token per byte, vocabulary 256 + end of document")
    how.add_argument("--tokenizer", help="a Hugging Face tokenizer's name or folder")
    how.add_argument("--from-llmc", action="store_true", help="inputs are llm.c token files")
    ap.add_argument("--eod", type=int, help="with --from-llmc: the id that separates their documents (50256 for "
                    "GPT-2's), recorded in the headers; without it the shards carry no document boundaries")
    ap.add_argument("--val-fraction", type=float, default=0.0, help="documents held out for <out>_val_*.bin")
    ap.add_argument("--shuffle", action="store_true", help="documents of each side in a fixed order unrelated to "
                    "their paths (default: path order)")
    ap.add_argument("--piece-bytes", type=int, default=0, help="cut every document into pieces of at most this "
                    "many bytes, at line ends, each followed by the end-of-document token (after the validation "
                    "split, before --shuffle; default 0: whole documents)")
    ap.add_argument("--include", action="append", default=[], help="file name or path pattern to take in folders "
                    "and patterns (repeatable; default: every file)")
    ap.add_argument("--exclude", action="append", default=[], help="file name or path pattern to leave out")
    ap.add_argument("--shard-tokens", type=int, default=100_000_000)
    ap.add_argument("--max-file-bytes", type=int, default=16 << 20, help="skip larger files (default 16 MiB)")
    ap.add_argument("--max-bytes", type=int, default=0, help="stop taking documents past this many bytes (0: all)")
    a = ap.parse_args()
    if not 0 <= a.val_fraction < 1:
        fail(f"--val-fraction {a.val_fraction}: give a fraction in [0, 1)")
    if a.piece_bytes and a.piece_bytes < 4:
        fail(f"--piece-bytes {a.piece_bytes}: give at least 4 (one UTF-8 character), or 0 for whole documents")
    if a.shard_tokens < 1:
        fail("--shard-tokens must be at least 1")
    if a.train_bpe is not None and not 257 <= a.train_bpe <= 1 << 24:
        fail(f"--train-bpe {a.train_bpe}: a vocabulary of 257 (the bytes and the end of document) to 16M tokens")
    folder = os.path.dirname(a.out) or "."
    os.makedirs(folder, exist_ok=True)
    meta = {"format": "cpgen token shards", "shards": {}}

    if a.eod is not None and not a.from_llmc:
        fail("--eod names the separator of llm.c files (--from-llmc); text gets its tokenizer's own")
    if a.from_llmc:
        if a.shuffle:
            fail("--shuffle orders text documents; llm.c files are converted in the order given")
        if a.val_fraction:
            fail("--val-fraction holds out text documents; llm.c files come tokenised: convert their val files alone")
        if a.piece_bytes:
            fail("--piece-bytes cuts text documents; llm.c files are converted as they are")
        files = sorted(a.inputs, key=os.fsencode)
        width = llmc_width(files)
        if a.eod is not None and not 0 <= a.eod < 1 << (8 * width):
            fail(f"--eod {a.eod}: not a token id of these {width}-byte files")
        w = ShardWriter(a.out, a.shard_tokens, width, a.eod)
        for path in files:
            w.add(read_llmc(path))
        paths, counts = w.close()
        meta.update(tokenizer="llm.c shards (their own tokenizer)")
        if a.eod is not None:
            meta["eod_id"] = a.eod
        meta["shards"]["train"] = {"files": [os.path.basename(p) for p in paths], "tokens": sum(counts)}
        meta["data_source"] = f"tokens:{a.out}_[0-9]*.bin"
    else:
        paths = list_inputs(a.inputs, a.include, a.exclude)
        docs, skipped, nbytes = read_documents(paths, a.max_file_bytes, a.max_bytes)
        if not docs:
            fail(f"no text document among {len(paths)} files ({', '.join(f'{v} {k}' for k, v in skipped.items())})")
        train, val = split_documents(docs, a.val_fraction)
        ndocs = {"train": len(train), "val": len(val)}
        if a.piece_bytes:
            train, val = pieces(train, a.piece_bytes), pieces(val, a.piece_bytes)
        if a.shuffle:
            train, val = shuffled(train), shuffled(val)
        if a.byte_level:
            tok = ByteLevel()
        elif a.train_bpe is not None:
            tok = Bpe(a.train_bpe, [t for _, t in train], os.path.join(folder, "tokenizer.json"))
        else:
            tok = HuggingFace(a.tokenizer)
        width = 2 if tok.vocab_size <= 1 << 16 else 4
        meta.update(tokenizer=tok.name, vocab_size=tok.vocab_size, model_vocab=(tok.vocab_size + 63) // 64 * 64,
                    eod_id=tok.eod_id, eod_token=tok.eod_token,
                    inputs={"files": len(paths), "documents": len(docs), "bytes": nbytes, "skipped": skipped})
        if isinstance(tok, Bpe):
            meta["tokenizer_file"] = os.path.basename(tok.path)
        for split, part, prefix in (("train", train, a.out), ("val", val, f"{a.out}_val")):
            if not part:
                continue
            sp, counts = tokenize_split(part, tok, prefix, a.shard_tokens, width)
            meta["shards"][split] = {"documents": ndocs[split], "tokens": sum(counts),
                                     "files": [os.path.basename(p) for p in sp], "counts": counts}
            if a.piece_bytes:
                meta["shards"][split]["pieces"] = len(part)
        meta["data_source"] = f"tokens:{a.out}_[0-9]*.bin"
        if val:
            meta["val_source"] = f"tokens:{a.out}_val_*.bin"
    with open(f"{a.out}.json.tmp", "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    os.replace(f"{a.out}.json.tmp", f"{a.out}.json")
    for split, s in meta["shards"].items():
        print(f"{split}: {s['tokens']:,} tokens in {len(s['files'])} shard(s)"
              + (f" from {s['documents']:,} documents" if "documents" in s else "")
              + (f" in {s['pieces']:,} pieces" if "pieces" in s else ""))
    if "vocab_size" in meta:
        print(f"tokenizer: {meta['tokenizer']}, vocabulary {meta['vocab_size']:,} (train with model.vocab = "
              f"{meta['model_vocab']}); end of document: id {meta['eod_id']}")
        skipped = meta["inputs"]["skipped"]
        print(f"inputs: {meta['inputs']['documents']:,} documents of {meta['inputs']['files']:,} files, "
              f"{meta['inputs']['bytes']:,} bytes" + (f"; skipped {', '.join(f'{v} {k}' for k, v in skipped.items())}"
                                                       if skipped else ""))
    print(f"wrote {a.out}.json; data.source = \"{meta['data_source']}\""
          + (f", data.val = \"{meta['val_source']}\"" if "val_source" in meta else ""))


if __name__ == "__main__":
    main()
