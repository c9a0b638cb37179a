#!/usr/bin/env python3
"""Compare `redlite inspect --json FILE` with the gguf Python package's reader (what
`gguf-dump` prints): tensor count, names, types, shapes and byte sizes, and key metadata.

Usage: compare_inspect.py REDLITE_BINARY FILE.gguf   (exit 1 on any difference)
Run with the venv of scripts/reference/setup.sh (gguf==0.19.0).
"""
import json
import subprocess
import sys

import gguf


def main():
    redlite, path = sys.argv[1], sys.argv[2]
    ours = json.loads(subprocess.run([redlite, "inspect", "--json", path], check=True,
                                     capture_output=True, text=True).stdout)
    reader = gguf.GGUFReader(path)
    theirs = {}
    for t in reader.tensors:
        # gguf-py lists shapes fastest-first (as gguf-dump prints them); ours are outermost-first.
        theirs[t.name] = (t.tensor_type.name, [int(d) for d in reversed(t.shape.tolist())], int(t.n_bytes))
    problems = []
    if ours["tensor_count"] != len(reader.tensors):
        problems.append(f"tensor count: redlite {ours['tensor_count']}, gguf-py {len(reader.tensors)}")
    for row in ours["tensors"]:
        ref = theirs.get(row["name"])
        mine = (row["type"], row["shape"], row["bytes"])
        if ref is None:
            problems.append(f"{row['name']}: not listed by gguf-py")
        elif ref != mine:
            problems.append(f"{row['name']}: redlite {mine}, gguf-py {ref}")
    for key in ["general.architecture", "qwen3next.block_count", "qwen3next.embedding_length",
                "tokenizer.ggml.model", "tokenizer.ggml.pre"]:
        field = reader.get_field(key)
        if field is None:
            continue
        v = field.contents()
        if key == "general.architecture" and v != ours["architecture"]:
            problems.append(f"{key}: redlite {ours['architecture']}, gguf-py {v}")
    n_tokens = reader.get_field("tokenizer.ggml.tokens")
    if n_tokens is not None and len(n_tokens.data) != ours["tokenizer"]["tokens"]:
        problems.append(f"tokens: redlite {ours['tokenizer']['tokens']}, gguf-py {len(n_tokens.data)}")
    types = {}
    for name, (ty, _, nbytes) in theirs.items():
        c, b = types.get(ty, (0, 0))
        types[ty] = (c + 1, b + nbytes)
    for ty, (count, nbytes) in types.items():
        mine = ours["types"].get(ty)
        if mine is None or mine["tensors"] != count or mine["bytes"] != nbytes:
            problems.append(f"type {ty}: redlite {mine}, gguf-py {count} tensors {nbytes} bytes")
    if problems:
        print(f"MISMATCH {path}:\n  " + "\n  ".join(problems[:20]))
        sys.exit(1)
    summary = ", ".join(f"{ty} x{c}" for ty, (c, _) in sorted(types.items()))
    print(f"agree {path}: {len(reader.tensors)} tensors ({summary})")


if __name__ == "__main__":
    main()
