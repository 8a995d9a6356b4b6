#!/usr/bin/env python3
"""make_tokens.py: write cpgen token shards (docs/DATA.md: 32-byte header "CPGTOK01", u32 version 1, u32 token
bytes, u64 count, u64 reserved 0, then little-endian tokens).

    # tokenise text files with a Hugging Face tokenizer (needs `transformers`), 100M tokens per shard
    python3 tools/make_tokens.py --tokenizer meta-llama/Llama-3.1-8B --out data/shard --shard-tokens 100000000 *.txt
    # convert llm.c shards (fineweb_train_000001.bin, ...) without re-tokenising
    python3 tools/make_tokens.py --from-llmc --out data/shard fineweb_train_*.bin

Shards are data/shard_000000.bin, data/shard_000001.bin, ...; train with data.source = "tokens:data/shard_*.bin".
Each document is preceded by the tokenizer's BOS token when it has one. Needs numpy."""
import argparse
import os
import struct
import sys

import numpy as np


def write_shard(path, tokens):
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 2**32):
        sys.exit(f"make_tokens.py: {path}: token ids must be in [0, 2^32)")
    width = 2 if tokens.size == 0 or tokens.max() < 2**16 else 4
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"CPGTOK01" + struct.pack("<IIQQ", 1, width, tokens.size, 0))
        f.write(tokens.astype("<u2" if width == 2 else "<u4").tobytes())
    os.replace(tmp, path)  # atomic: a reader never sees half a shard
    print(f"{path}: {tokens.size:,} tokens, {width} bytes each")


def read_llmc(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(256 * 4), dtype="<i4")
        if header[0] != 20240520 or header[1] not in (1, 2):
            sys.exit(f"make_tokens.py: {path}: not an llm.c token file (magic {header[0]}, version {header[1]})")
        return np.frombuffer(f.read(), dtype="<u2" if header[1] == 1 else "<u4")[: header[2]]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="text files, or llm.c .bin files with --from-llmc")
    ap.add_argument("--out", required=True, help="shard path prefix: <out>_000000.bin, ...")
    ap.add_argument("--tokenizer", help="Hugging Face tokenizer name or folder")
    ap.add_argument("--from-llmc", action="store_true", help="inputs are llm.c token files")
    ap.add_argument("--shard-tokens", type=int, default=100_000_000)
    a = ap.parse_args()
    if not a.from_llmc and not a.tokenizer:
        sys.exit("make_tokens.py: give --tokenizer (or --from-llmc for llm.c files)")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    tok = None
    if a.tokenizer:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(a.tokenizer)
    buf, n = [], 0
    for path in a.inputs:
        if a.from_llmc:
            ids = read_llmc(path)
        else:
            with open(path, encoding="utf-8") as f:
                ids = tok(f.read(), add_special_tokens=False)["input_ids"]
            ids = ([tok.bos_token_id] if tok.bos_token_id is not None else []) + list(ids)
        buf.extend(np.asarray(ids, dtype=np.int64).tolist())
        while len(buf) >= a.shard_tokens:
            write_shard(f"{a.out}_{n:06d}.bin", buf[: a.shard_tokens])
            buf, n = buf[a.shard_tokens:], n + 1
    if buf:
        write_shard(f"{a.out}_{n:06d}.bin", buf)


if __name__ == "__main__":
    main()
