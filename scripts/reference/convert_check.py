#!/usr/bin/env python3
"""`redlite convert` against references nobody here wrote: transformers and llama.cpp's own
converter. Needs torch + transformers (the GPU machine's image has them; locally
`REF_WITH_TORCH=1 scripts/reference/setup.sh`) and the llama.cpp sources of the pinned sdist.

1. A tiny qwen3next model as a transformers checkpoint: `redlite synth` (F32, tiny vocabulary)
   turned into Qwen3NextForCausalLM by goldens.py (the converter's transforms undone), saved
   with `save_pretrained` (whatever layout transformers writes, packed experts included), plus
   tokenizer.json / tokenizer_config.json built from the file's vocabulary.
2. `redlite convert` of that folder (F32) and, where its sources are given, llama.cpp's
   `convert_hf_to_gguf.py` of the same folder.
3. Checks: transformers' logits of the saved model against `redlite logits` on the converted
   file (exact CPU products), relative L2 per position; and tensor by tensor, our file against
   llama.cpp's (names, shapes, types, values).

Usage: convert_check.py REDLITE WORK_DIR [--llama-src DIR]   (prints a report; exit 1 on failure)
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import goldens  # noqa: E402


def write_tokenizer(path, out_dir):
    from gguf import GGUFReader
    r = GGUFReader(path)

    def kv(key):
        return r.fields[key].contents()

    tokens, types, merges = kv("tokenizer.ggml.tokens"), kv("tokenizer.ggml.token_type"), kv(
        "tokenizer.ggml.merges")
    vocab = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 1}
    added = [{"id": i, "content": t, "special": ty == 3, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False}
             for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (3, 4)]
    tokenizer = {
        "version": "1.0", "added_tokens": added, "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "vocab": vocab, "merges": merges, "dropout": None,
                  "unk_token": None, "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False},
    }
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    config = {
        "tokenizer_class": "Qwen2Tokenizer", "add_bos_token": False, "bos_token": None,
        "eos_token": tokens[kv("tokenizer.ggml.eos_token_id")],
        "pad_token": tokens[kv("tokenizer.ggml.padding_token_id")],
        "chat_template": kv("tokenizer.chat_template"),
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, ensure_ascii=False)


def gguf_metadata(path):
    from gguf import GGUFReader
    r = GGUFReader(path)
    out = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k.startswith("general."):
            continue
        v = f.contents()
        out[k] = [float(x) if isinstance(x, float) else x for x in v] if isinstance(v, list) else v
    return out


def gguf_tensors(path):
    from gguf import GGUFReader, quants
    r = GGUFReader(path)
    return {t.name: (t.tensor_type.name, np.asarray(quants.dequantize(t.data, t.tensor_type),
                                                    dtype=np.float32)) for t in r.tensors}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("redlite")
    ap.add_argument("work")
    ap.add_argument("--llama-src", help="llama.cpp sources (convert_hf_to_gguf.py, gguf-py)")
    a = ap.parse_args()
    import torch
    os.makedirs(a.work, exist_ok=True)
    synth = os.path.join(a.work, "synth.gguf")
    subprocess.run([a.redlite, "synth", synth, "--preset", "tiny", "--vocab", "tiny",
                    "--recipe", "F32", "--seed", "3"], check=True, stdout=subprocess.DEVNULL)
    c, t, _ = goldens.gguf_model(synth)
    sd, _ = goldens.hf_state_dict(c, t)
    model = goldens.hf_build(c, sd, torch.float32)
    hf = os.path.join(a.work, "hf")
    model.save_pretrained(hf, safe_serialization=True)
    write_tokenizer(synth, hf)
    print("saved:", sorted(os.listdir(hf)))

    ours = os.path.join(a.work, "ours.gguf")
    subprocess.run([a.redlite, "convert", hf, ours, "--type", "f32"], check=True)
    ids = goldens.make_prompt(32)
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].double().numpy()
    out = os.path.join(a.work, "ours.logits")
    env = dict(os.environ, REDLITE_CPU_EXACT="1")
    subprocess.run([a.redlite, "logits", "-m", ours, "--tokens", ",".join(map(str, ids)),
                    "--out", out], check=True, env=env, stdout=subprocess.DEVNULL)
    got = np.fromfile(out, dtype=np.float32).reshape(len(ids), -1).astype(np.float64)
    rel = np.sqrt(((got - ref) ** 2).sum(1) / (ref ** 2).sum(1)).max()
    print(f"transformers vs redlite on the converted file: worst relative L2 {rel:.2e}")
    ok = rel <= 1e-4

    if a.llama_src:
        theirs = os.path.join(a.work, "theirs.gguf")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [a.llama_src, os.path.join(a.llama_src, "gguf-py")]))
        # llama.cpp names a BPE pre-tokenizer by hashing its output on a probe text, and the
        # tiny test vocabulary is not in its list: it is told "qwen2" (what the tiny
        # vocabulary is built for), the rest of its converter runs as shipped.
        runner = ("import runpy, sys\n"
                  "from conversion import base\n"
                  "base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'qwen2'\n"
                  "sys.argv = sys.argv[1:]\n"
                  "runpy.run_path(sys.argv[0], run_name='__main__')\n")
        subprocess.run([sys.executable, "-c", runner,
                        os.path.join(a.llama_src, "convert_hf_to_gguf.py"), hf,
                        "--outtype", "f32", "--outfile", theirs, "--no-mtp"], check=True, env=env)
        mine, other = gguf_tensors(ours), gguf_tensors(theirs)
        if set(mine) != set(other):
            print("tensor names differ:", sorted(set(mine) ^ set(other)))
            ok = False
        for name in sorted(set(mine) & set(other)):
            (ta, va), (tb, vb) = mine[name], other[name]
            if ta != tb or va.shape != vb.shape:
                print(f"{name}: ours {ta} {va.shape}, llama.cpp {tb} {vb.shape}")
                ok = False
            elif not np.allclose(va, vb, rtol=1e-6, atol=0):
                print(f"{name}: values differ by up to {np.abs(va - vb).max():.3e}")
                ok = False
        ma, mb = gguf_metadata(ours), gguf_metadata(theirs)
        for k in sorted(set(ma) | set(mb)):
            if k not in ma or k not in mb:
                print(f"metadata {k}: only in {'ours' if k in ma else 'llama.cpp'}")
                ok = False
            elif ma[k] != mb[k] and not (isinstance(ma[k], float)
                                         and abs(ma[k] - mb[k]) <= 1e-6 * abs(mb[k])):
                print(f"metadata {k}: ours {str(ma[k])[:80]}, llama.cpp {str(mb[k])[:80]}")
                ok = False
        print("llama.cpp's converter and ours:", "same tensors and metadata" if ok else "DIFFER")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
