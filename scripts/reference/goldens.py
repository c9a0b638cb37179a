#!/usr/bin/env python3
"""Golden logits for small qwen3next GGUF files from two independent implementations.

For every model of the golden set (written by `redlite synth`, see make_goldens.sh) and every
prompt of PROMPTS:

* llama.cpp: all-position logits through the llama-cpp-python ctypes bindings (logits_all,
  one batch, F32 K/V cache) and, for the agreement table only, one token per decode call;
* transformers: Qwen3NextForCausalLM (eager attention, eager experts) built from the same file:
  every tensor dequantized by the `gguf` package, the converter's transforms undone (norm weights
  minus 1 except ssm_norm, ssm_a -> A_log, attn_qkv+attn_gate / ssm_in -> in_proj_qkvz,
  attn_q left per-head interleaved), run in float32 and in float64; the residual stream after the
  embedding and after every layer is captured with forward hooks.

The stored reference ("hf") is the float64 run rounded to float32. transformers 5.24 casts to
float32 inside RMSNorm, the gated RMSNorm, the gated-delta-rule kernels, the router softmax and the
rotary tables even for a float64 model; for the float64 run those casts are redirected to float64
(see `true_f64`), so "hf" is the model's math to ~1e-12, not a mixed-precision result.

Writes OUT/<model>.bin (format: tests/golden/README.md), OUT/manifest.json and an agreement
table (markdown) to stdout / --table.

Usage: goldens.py MODELS_DIR OUT_DIR [--table FILE] [--threads N] [--only NAME,...]
       goldens.py --list      (the golden set: name and `redlite synth` arguments per line)
  MODELS_DIR holds <name>.gguf for every name in MODELS (make_goldens.sh writes them).
"""
import argparse
import contextlib
import hashlib
import json
import os
import platform
import struct
import sys
import time

import numpy as np

# ----------------------------------------------------------------------------------------------
# The golden set. synth arguments are appended to `redlite synth OUT.gguf`.
# full_logits: store the whole vocabulary row of the hf logits for every prompt.
# hidden: prompt lengths whose per-layer residual stream (hf) is stored.
MODELS = [
    {"name": "tiny-F32", "synth": ["--recipe", "F32"], "full_logits": True, "hidden": [1, 7, 64, 200]},
    {"name": "tiny-F16", "synth": ["--recipe", "F16"], "full_logits": False, "hidden": [7]},
    {"name": "tiny-Q4_K_M", "synth": ["--recipe", "Q4_K_M"], "full_logits": False, "hidden": [7]},
    {"name": "tiny-IQ2_XXS", "synth": ["--recipe", "IQ2_XXS"], "full_logits": False, "hidden": [7]},
    {"name": "tiny-IQ2_XS", "synth": ["--recipe", "IQ2_XS"], "full_logits": False, "hidden": [7]},
    {"name": "tiny-IQ1_M", "synth": ["--recipe", "IQ1_M"], "full_logits": False, "hidden": [7]},
    {"name": "tiny-F32-legacy", "synth": ["--recipe", "F32", "--layout", "legacy"], "full_logits": False,
     "hidden": [7]},
    {"name": "tiny-F32-mtp", "synth": ["--recipe", "F32", "--mtp"], "full_logits": False, "hidden": [7]},
]
COMMON_SYNTH = ["--preset", "tiny", "--vocab", "tiny", "--seed", "1"]
PROMPT_LENGTHS = [1, 7, 64, 200]
TOPK = 32
SPECIAL = range(512, 538)  # tiny vocabulary: <|endoftext|> .. </think>
IM_START = 513


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return state, z ^ (z >> 31)


def make_prompt(n, n_vocab=1024):
    """n token ids: splitmix64 seeded with n, ids uniform over the non-special ids
    (0..511, 538..1023; `x % 998`, skipping 512..537); prompts of 7+ tokens start with <|im_start|>."""
    allowed = [i for i in range(n_vocab) if i not in SPECIAL]
    st, out = n, []
    while len(out) < n:
        st, z = splitmix64(st)
        out.append(allowed[z % len(allowed)])
    if n >= 7:
        out[0] = IM_START
    return out


# ----------------------------------------------------------------------------------------------
# golden container (see tests/golden/README.md)
MAGIC = b"RLGOLD1\n"
DTYPES = {np.dtype("<f4"): 0, np.dtype("<i4"): 1}


def write_golden(path, entries):
    """entries: list of (name, np.ndarray float32|int32), written in this order."""
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<II", 1, len(entries)))
        for name, a in entries:
            a = np.ascontiguousarray(a)
            a = a.astype("<f4") if a.dtype.kind == "f" else a.astype("<i4")
            nb = name.encode("ascii")
            f.write(struct.pack("<H", len(nb)) + nb)
            f.write(struct.pack("<BB", DTYPES[a.dtype], a.ndim))
            f.write(struct.pack("<%dI" % a.ndim, *a.shape))
            data = a.tobytes()
            f.write(struct.pack("<Q", len(data)))
            f.write(data)


def read_golden(path):
    out = {}
    with open(path, "rb") as f:
        assert f.read(8) == MAGIC
        version, n = struct.unpack("<II", f.read(8))
        assert version == 1
        for _ in range(n):
            (ln,) = struct.unpack("<H", f.read(2))
            name = f.read(ln).decode("ascii")
            dt, nd = struct.unpack("<BB", f.read(2))
            shape = struct.unpack("<%dI" % nd, f.read(4 * nd))
            (nbytes,) = struct.unpack("<Q", f.read(8))
            a = np.frombuffer(f.read(nbytes), dtype="<f4" if dt == 0 else "<i4").reshape(shape)
            out[name] = a
    return out


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------
# GGUF -> HF
def gguf_model(path):
    from gguf import GGUFReader, quants
    r = GGUFReader(path)

    def kv(key, default=None):
        f = r.fields.get(key)
        return default if f is None else f.contents()

    a = kv("general.architecture")
    assert a == "qwen3next", a
    p = a + "."
    n_block = kv(p + "block_count")
    n_mtp = kv(p + "nextn_predict_layers", 0)
    n_layer = n_block - n_mtp
    recurrent = kv(p + "attention.recurrent_layers")
    if recurrent is None:  # older files (e.g. the legacy-layout one): derive from the interval
        iv = kv(p + "full_attention_interval", 4)
        recurrent = [(i + 1) % iv != 0 for i in range(n_layer)]
    cfg = {
        "n_layer": n_layer,
        "n_mtp": n_mtp,
        "n_embd": kv(p + "embedding_length"),
        "n_ff": kv(p + "feed_forward_length"),
        "n_head": kv(p + "attention.head_count"),
        "n_head_kv": kv(p + "attention.head_count_kv"),
        "head_dim": kv(p + "attention.key_length"),
        "rope_dim": kv(p + "rope.dimension_count"),
        "rope_base": kv(p + "rope.freq_base"),
        "eps": kv(p + "attention.layer_norm_rms_epsilon"),
        "n_expert": kv(p + "expert_count"),
        "n_expert_used": kv(p + "expert_used_count"),
        "expert_ff": kv(p + "expert_feed_forward_length"),
        "shared_ff": kv(p + "expert_shared_feed_forward_length"),
        "conv_kernel": kv(p + "ssm.conv_kernel"),
        "ssm_d_state": kv(p + "ssm.state_size"),
        "ssm_n_group": kv(p + "ssm.group_count"),
        "ssm_dt_rank": kv(p + "ssm.time_step_rank"),
        "ssm_inner": kv(p + "ssm.inner_size"),
        "recurrent": [bool(x) for x in recurrent[:n_layer]],
        "bos": kv("tokenizer.ggml.bos_token_id"),
        "eos": kv("tokenizer.ggml.eos_token_id"),
        "pad": kv("tokenizer.ggml.padding_token_id"),
    }
    tensors, types = {}, {}
    for t in r.tensors:
        tensors[t.name] = np.asarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float64)
        types[t.name] = t.tensor_type.name
    cfg["n_vocab"] = tensors["token_embd.weight"].shape[0]
    return cfg, tensors, types


def hf_config(c):
    from transformers import Qwen3NextConfig
    hc = Qwen3NextConfig(
        vocab_size=c["n_vocab"], hidden_size=c["n_embd"], intermediate_size=c["n_ff"],
        num_hidden_layers=c["n_layer"], num_attention_heads=c["n_head"],
        num_key_value_heads=c["n_head_kv"], head_dim=c["head_dim"], hidden_act="silu",
        max_position_embeddings=4096, rms_norm_eps=float(c["eps"]), tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": float(c["rope_base"]),
                         "partial_rotary_factor": c["rope_dim"] / c["head_dim"]},
        attention_bias=False, linear_conv_kernel_dim=c["conv_kernel"],
        linear_key_head_dim=c["ssm_d_state"], linear_value_head_dim=c["ssm_inner"] // c["ssm_dt_rank"],
        linear_num_key_heads=c["ssm_n_group"], linear_num_value_heads=c["ssm_dt_rank"],
        decoder_sparse_step=1, moe_intermediate_size=c["expert_ff"],
        shared_expert_intermediate_size=c["shared_ff"], num_experts_per_tok=c["n_expert_used"],
        num_experts=c["n_expert"], norm_topk_prob=True, mlp_only_layers=[],
        layer_types=["linear_attention" if r else "full_attention" for r in c["recurrent"]],
        bos_token_id=c["bos"], eos_token_id=c["eos"], pad_token_id=c["pad"],
    )
    return hc


def hf_state_dict(c, t):
    """Undo the HF->GGUF converter (spec §2.5). Returns float64 numpy arrays under HF names."""
    sd = {}
    used = set()

    def g(name):
        used.add(name)
        return t[name]

    sd["model.embed_tokens.weight"] = g("token_embd.weight")
    sd["model.norm.weight"] = g("output_norm.weight") - 1.0
    sd["lm_head.weight"] = g("output.weight")
    nk, dk = c["ssm_n_group"], c["ssm_d_state"]
    nv, dv = c["ssm_dt_rank"], c["ssm_inner"] // c["ssm_dt_rank"]
    r = nv // nk
    for i in range(c["n_layer"]):
        b, h = f"blk.{i}.", f"model.layers.{i}."
        sd[h + "input_layernorm.weight"] = g(b + "attn_norm.weight") - 1.0
        sd[h + "post_attention_layernorm.weight"] = g(b + "post_attention_norm.weight") - 1.0
        m = h + "mlp."
        sd[m + "gate.weight"] = g(b + "ffn_gate_inp.weight")
        sd[m + "experts.gate_up_proj"] = np.concatenate(
            [g(b + "ffn_gate_exps.weight"), g(b + "ffn_up_exps.weight")], axis=1)
        sd[m + "experts.down_proj"] = g(b + "ffn_down_exps.weight")
        sd[m + "shared_expert_gate.weight"] = g(b + "ffn_gate_inp_shexp.weight").reshape(1, -1)
        for p in ("gate", "up", "down"):
            sd[m + f"shared_expert.{p}_proj.weight"] = g(b + f"ffn_{p}_shexp.weight")
        if c["recurrent"][i]:
            la = h + "linear_attn."
            if b + "attn_qkv.weight" in t:  # split layout: re-interleave per key-head group
                qkv, z = g(b + "attn_qkv.weight"), g(b + "attn_gate.weight")
                q, k, v = qkv[: nk * dk], qkv[nk * dk: 2 * nk * dk], qkv[2 * nk * dk:]
                hid = qkv.shape[1]
                qkvz = np.concatenate([
                    q.reshape(nk, dk, hid), k.reshape(nk, dk, hid),
                    v.reshape(nk, r * dv, hid), z.reshape(nk, r * dv, hid)], axis=1).reshape(-1, hid)
            else:  # legacy layout: ssm_in is in_proj_qkvz as is
                qkvz = g(b + "ssm_in.weight")
            sd[la + "in_proj_qkvz.weight"] = qkvz
            sd[la + "in_proj_ba.weight"] = g(b + "ssm_ba.weight")
            conv = g(b + "ssm_conv1d.weight")  # (channels, kernel)
            sd[la + "conv1d.weight"] = conv.reshape(conv.shape[0], 1, conv.shape[1])
            sd[la + "dt_bias"] = g(b + "ssm_dt.bias")
            sd[la + "A_log"] = np.log(-g(b + "ssm_a"))
            sd[la + "norm.weight"] = g(b + "ssm_norm.weight")  # gated norm: no +1 fold to undo
            sd[la + "out_proj.weight"] = g(b + "ssm_out.weight")
        else:
            sa = h + "self_attn."
            sd[sa + "q_proj.weight"] = g(b + "attn_q.weight")  # per-head [query | gate], as HF expects
            sd[sa + "k_proj.weight"] = g(b + "attn_k.weight")
            sd[sa + "v_proj.weight"] = g(b + "attn_v.weight")
            sd[sa + "o_proj.weight"] = g(b + "attn_output.weight")
            sd[sa + "q_norm.weight"] = g(b + "attn_q_norm.weight") - 1.0
            sd[sa + "k_norm.weight"] = g(b + "attn_k_norm.weight") - 1.0
    unused = sorted(set(t) - used)
    # only the MTP block (blk.<n_layer>.*) may be left over: transformers has no MTP
    assert all(u.startswith(f"blk.{c['n_layer']}.") for u in unused), unused
    return sd, unused


class _TorchF64:
    """Stands in for the `torch` module inside modeling_qwen3_next during the float64 run."""

    def __init__(self, torch):
        self._torch = torch

    def __getattr__(self, name):
        if name in ("float32", "float"):
            return self._torch.float64
        return getattr(self._torch, name)


@contextlib.contextmanager
def true_f64():
    """transformers' Qwen3Next upcasts to float32 in several places (`x.float()`, `torch.float32`):
    redirect both to float64 so a float64 model computes in float64 throughout."""
    import torch
    import transformers.models.qwen3_next.modeling_qwen3_next as M
    saved_torch, saved_float = M.torch, torch.Tensor.float
    M.torch = _TorchF64(torch)
    torch.Tensor.float = lambda self, memory_format=torch.preserve_format: self.to(torch.float64)
    try:
        yield
    finally:
        M.torch = saved_torch
        torch.Tensor.float = saved_float


def hf_build(c, sd, dtype):
    import torch
    from transformers import Qwen3NextForCausalLM
    torch.manual_seed(0)
    cfg = hf_config(c)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    m = Qwen3NextForCausalLM(cfg).to(dtype).eval()
    state = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dtype) for k, v in sd.items()}
    missing, unexpected = m.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("inv_freq")]
    assert not missing and not unexpected, (missing, unexpected)
    # rotary table from scratch in the model's dtype (transformers computes it in float32)
    rot = m.model.rotary_emb
    dim = int(round(c["head_dim"] * cfg.rope_parameters["partial_rotary_factor"]))
    inv = 1.0 / (float(c["rope_base"]) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    rot.inv_freq = inv.to(dtype)
    rot.original_inv_freq = rot.inv_freq
    return m


def hf_run(m, ids, f64, emulate=None):
    """logits [T, V] and residual stream [n_layer+1, T, n_embd], as float64 numpy.
    emulate=(c, types): round matmul inputs as llama.cpp does (llamacpp_activations)."""
    import torch
    hidden = []

    def hook(_mod, _inp, out):
        hidden.append((out[0] if isinstance(out, tuple) else out)[0].detach().to(torch.float64).numpy())

    routes = []  # per layer: selected experts [T, k], sorted

    def route_hook(_mod, _inp, out):
        routes.append(np.sort(out[2].detach().numpy(), -1))

    hs = [m.model.embed_tokens.register_forward_hook(hook)]
    hs += [layer.register_forward_hook(hook) for layer in m.model.layers]
    hs += [layer.mlp.gate.register_forward_hook(route_hook) for layer in m.model.layers]
    try:
        with torch.no_grad(), (true_f64() if f64 else contextlib.nullcontext()), \
                (llamacpp_activations(m, *emulate) if emulate else contextlib.nullcontext()):
            logits = m(torch.tensor([ids]), use_cache=False).logits[0]
    finally:
        for h in hs:
            h.remove()
    m.last_routes = np.stack(routes)  # [n_layer, T, k]
    return logits.to(torch.float64).numpy(), np.stack(hidden)


# ----------------------------------------------------------------------------------------------
# Emulation of llama.cpp's CPU matmul inputs (explains the quantized-file disagreement): ggml-cpu
# converts the activation operand of every mul_mat / mul_mat_id to the weight type's vec_dot_type
# before the dot products: F16 weights -> F16 activations, K-quants and IQ* -> Q8_K (256-blocks,
# one f32 scale), Q4_0/Q5_0/Q8_0/IQ4_NL -> Q8_0 (32-blocks, f16 scale). F32 weights -> F32.
VEC_DOT = {"F32": "F32", "F16": "F16", "Q4_0": "Q8_0", "Q5_0": "Q8_0", "Q8_0": "Q8_0", "IQ4_NL": "Q8_0"}
for _t in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
           "IQ1_S", "IQ1_M", "IQ4_XS"):
    VEC_DOT[_t] = "Q8_K"


def act_quant(x, vdt):
    import torch
    if vdt == "F32":
        return x
    dt = x.dtype
    x32 = x.to(torch.float32)
    if vdt == "F16":
        return x32.to(torch.float16).to(dt)
    if vdt == "Q8_K":  # quantize_row_q8_K_ref
        b = x32.reshape(*x32.shape[:-1], -1, 256)
        idx = b.abs().argmax(-1, keepdim=True)
        mx = torch.take_along_dim(b, idx, -1)
        iscale = torch.where(mx != 0, -127.0 / mx, torch.zeros_like(mx))
        q = torch.clamp(torch.round(iscale * b), max=127)
        d = torch.where(mx != 0, 1.0 / iscale, torch.zeros_like(mx))
        return (q * d).reshape(x.shape).to(dt)
    if vdt == "Q8_0":  # quantize_row_q8_0_ref
        b = x32.reshape(*x32.shape[:-1], -1, 32)
        d = b.abs().amax(-1, keepdim=True) / 127.0
        idv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
        q = torch.round(b * idv)
        return (q * d.to(torch.float16).to(torch.float32)).reshape(x.shape).to(dt)
    raise ValueError(vdt)


@contextlib.contextmanager
def llamacpp_activations(m, c, types):
    """Round every matmul input of the HF model as llama.cpp's CPU backend does for these types."""
    import torch
    import transformers.models.qwen3_next.modeling_qwen3_next as M

    def vdt(*names):
        v = {VEC_DOT[types[n]] for n in names if n in types}
        assert len(v) == 1, (names, v)
        return v.pop()

    hooks = []

    def on(mod, kind):
        hooks.append(mod.register_forward_pre_hook(lambda _m, inp: (act_quant(inp[0], kind),) + inp[1:]))

    on(m.lm_head, vdt("output.weight"))
    for i, layer in enumerate(m.model.layers):
        b = f"blk.{i}."
        if c["recurrent"][i]:
            la = layer.linear_attn
            on(la.in_proj_qkvz, vdt(b + "attn_qkv.weight", b + "attn_gate.weight", b + "ssm_in.weight"))
            on(la.in_proj_ba, vdt(b + "ssm_ba.weight"))
            on(la.out_proj, vdt(b + "ssm_out.weight"))
        else:
            sa = layer.self_attn
            for mod, t in ((sa.q_proj, "attn_q"), (sa.k_proj, "attn_k"), (sa.v_proj, "attn_v"),
                           (sa.o_proj, "attn_output")):
                on(mod, vdt(b + t + ".weight"))
        mlp = layer.mlp
        on(mlp.shared_expert_gate, vdt(b + "ffn_gate_inp_shexp.weight"))
        for p in ("gate", "up", "down"):
            on(getattr(mlp.shared_expert, p + "_proj"), vdt(b + f"ffn_{p}_shexp.weight"))
        mlp.experts._aq = (vdt(b + "ffn_gate_exps.weight", b + "ffn_up_exps.weight"),
                           vdt(b + "ffn_down_exps.weight"))
        assert VEC_DOT[types[b + "ffn_gate_inp.weight"]] == "F32"  # router: HF F.linear, not hooked

    def experts_forward(self, hidden_states, top_k_index, top_k_weights):
        a_in, a_down = self._aq
        final = torch.zeros_like(hidden_states)
        for e in range(self.num_experts):
            token_idx, top_k_pos = torch.where(top_k_index == e)
            if token_idx.numel() == 0:
                continue
            x = act_quant(hidden_states[token_idx], a_in)
            gate, up = torch.nn.functional.linear(x, self.gate_up_proj[e]).chunk(2, dim=-1)
            h = act_quant(self.act_fn(gate) * up, a_down)
            h = torch.nn.functional.linear(h, self.down_proj[e]) * top_k_weights[token_idx, top_k_pos, None]
            final.index_add_(0, token_idx, h.to(final.dtype))
        return final

    saved = M.Qwen3NextExperts.forward
    M.Qwen3NextExperts.forward = experts_forward
    try:
        yield
    finally:
        M.Qwen3NextExperts.forward = saved
        for h in hooks:
            h.remove()


# ----------------------------------------------------------------------------------------------
# llama.cpp
def llama_open(path, n_ctx, threads):
    import llama_cpp
    return llama_cpp.Llama(path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
                           n_threads=threads, n_threads_batch=threads, seed=0, verbose=False,
                           type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)


def llama_batch(llm, ids):
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def llama_stepwise(llm, ids):
    llm.reset()
    rows = []
    for t in ids:
        llm.eval([t])
        rows.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32))
    return np.stack(rows)


# ----------------------------------------------------------------------------------------------
# statistics
def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def compare(a, ref):
    """a vs ref, [T, V] each: per-position relative L2, top-1 agreement, KL(ref || a)."""
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    rel = np.linalg.norm(a - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
    lr, la = log_softmax(ref), log_softmax(a)
    kl = (np.exp(lr) * (lr - la)).sum(-1)
    return {"rel_l2": rel, "top1": a.argmax(-1) == ref.argmax(-1), "kl": kl,
            "max_abs": np.abs(a - ref).max(-1)}


def summarize(parts):
    rel = np.concatenate([p["rel_l2"] for p in parts])
    top1 = np.concatenate([p["top1"] for p in parts])
    kl = np.concatenate([p["kl"] for p in parts])
    mab = np.concatenate([p["max_abs"] for p in parts])
    return {"rel_l2_max": float(rel.max()), "rel_l2_mean": float(rel.mean()),
            "top1_agree": int(top1.sum()), "positions": int(top1.size),
            "kl_mean": float(kl.mean()), "kl_max": float(kl.max()), "max_abs": float(mab.max())}


def sig(x, n=4):
    return float(f"{x:.{n}g}") if isinstance(x, float) else x


def topk_entries(prefix, logits):
    """top-k ids/values (descending value, ties by lower id) + logsumexp, L2 norm, sum over the
    whole row (float64 arithmetic, stored as float32)."""
    l64 = np.asarray(logits, np.float64)
    l32 = l64.astype(np.float32)
    T, V = l32.shape
    order = np.lexsort((np.broadcast_to(np.arange(V), (T, V)), -l32), axis=-1)[:, :TOPK]
    m = l64.max(-1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(l64 - m).sum(-1)))
    return [
        (prefix + "topk_ids", order.astype(np.int32)),
        (prefix + "topk_vals", np.take_along_axis(l32, order, axis=-1)),
        (prefix + "lse", lse.astype(np.float32)),
        (prefix + "l2", np.linalg.norm(l64, axis=-1).astype(np.float32)),
        (prefix + "sum", l64.sum(-1).astype(np.float32)),
    ]


def versions():
    import gguf
    import torch
    import transformers
    import llama_cpp
    v = {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__,
         "transformers": transformers.__version__, "llama_cpp_python": llama_cpp.__version__}
    try:
        from importlib.metadata import version
        v["gguf"] = version("gguf")
    except Exception:
        v["gguf"] = getattr(gguf, "__version__", "?")
    return v


def main():
    if sys.argv[1:] == ["--list"]:  # for make_goldens.sh: one line per model, name then synth args
        for spec in MODELS:
            print(" ".join([spec["name"]] + COMMON_SYNTH + spec["synth"]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("models_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--table", help="write the agreement table (markdown) here")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("THREADS", "2")))
    ap.add_argument("--only", help="comma-separated model names (default: all)")
    ap.add_argument("--llama-commit", default=os.environ.get("LLAMA_COMMIT", ""))
    ap.add_argument("--sdist-sha256", default=os.environ.get("LCP_SDIST_SHA256", ""))
    args = ap.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    os.makedirs(args.out_dir, exist_ok=True)

    prompts = {n: make_prompt(n) for n in PROMPT_LENGTHS}
    tv = versions()
    if args.llama_commit:
        tv["llama_cpp_vendored_commit"] = args.llama_commit
    if args.sdist_sha256:
        tv["llama_cpp_python_sdist_sha256"] = args.sdist_sha256
    manifest = {
        "format": "redlite-golden-v1 (tests/golden/README.md)",
        "generator": "scripts/reference/make_goldens.sh",
        "tools": tv,
        "synth_common_args": COMMON_SYNTH,
        "topk": TOPK,
        "hf_reference": "transformers Qwen3NextForCausalLM, eager, float64 throughout, rounded to float32",
        "llamacpp_settings": {"logits_all": True, "n_batch": 256, "type_k": "F32", "type_v": "F32",
                              "n_threads": args.threads},
        "prompts": {f"t{n}": ids for n, ids in prompts.items()},
        "models": [],
    }
    only = set(args.only.split(",")) if args.only else None
    rows = []
    for spec in MODELS:
        name = spec["name"]
        if only and name not in only:
            continue
        t0 = time.time()
        path = os.path.join(args.models_dir, name + ".gguf")
        c, tensors, types = gguf_model(path)
        sd, unused = hf_state_dict(c, tensors)
        m64 = hf_build(c, sd, torch.float64)
        m32 = hf_build(c, sd, torch.float32)
        llm = llama_open(path, 256, args.threads)
        route_info = []
        entries, cmp = [], {"llamacpp_vs_hf64": [], "hf32_vs_hf64": [], "llamacpp_vs_hf32": [],
                            "llamacpp_step_vs_batch": [], "llamacpp_vs_hf64_actq": [],
                            "hf64_actq_vs_hf64": [], "llamacpp_rerun_max_abs": 0.0}
        for n in PROMPT_LENGTHS:
            ids = prompts[n]
            l64, h64 = hf_run(m64, ids, True)
            l32, _ = hf_run(m32, ids, False)
            lc = llama_batch(llm, ids)
            lc2 = llama_batch(llm, ids)
            ls = llama_stepwise(llm, ids)
            cmp["llamacpp_vs_hf64"].append(compare(lc, l64))
            cmp["hf32_vs_hf64"].append(compare(l32, l64))
            cmp["llamacpp_vs_hf32"].append(compare(lc, l32))
            cmp["llamacpp_step_vs_batch"].append(compare(ls, lc))
            r64 = m64.last_routes
            la, _ = hf_run(m64, ids, True, emulate=(c, types))
            cmp["llamacpp_vs_hf64_actq"].append(compare(lc, la))
            cmp["hf64_actq_vs_hf64"].append(compare(la, l64))
            # MoE top-k selections that the activation rounding changes (discrete jumps)
            diff = (m64.last_routes != r64).any(-1)  # [n_layer, T]
            flips = [(int(li), int(ti)) for li, ti in zip(*np.nonzero(diff))]
            first = min([ti for _, ti in flips], default=n)
            pre = compare(lc[:first], la[:first])["rel_l2"] if first > 0 else np.zeros(1)
            route_info.append({"prompt": f"t{n}", "route_flips_exact_vs_rounded": len(flips),
                               "first_flip_position": None if first == n else first,
                               "llamacpp_vs_hf64_actq_rel_l2_max_before_first_flip": sig(float(pre.max()))})
            cmp["llamacpp_rerun_max_abs"] = max(cmp["llamacpp_rerun_max_abs"], float(np.abs(lc - lc2).max()))
            p = f"t{n}/"
            entries.append((p + "tokens", np.array(ids, np.int32)))
            if spec["full_logits"]:
                entries.append((p + "hf/logits", l64.astype(np.float32)))
            entries += topk_entries(p + "hf/", l64)
            if n in spec["hidden"]:
                entries.append((p + "hf/hidden", h64.astype(np.float32)))
            entries += topk_entries(p + "llamacpp/", lc)
        del llm
        out = os.path.join(args.out_dir, name + ".bin")
        write_golden(out, entries)
        back = read_golden(out)
        assert list(back) == [e[0] for e in entries]
        agreement = {k: {kk: sig(vv) for kk, vv in summarize(v).items()} for k, v in cmp.items()
                     if k != "llamacpp_rerun_max_abs"}
        agreement["llamacpp_rerun_max_abs"] = cmp["llamacpp_rerun_max_abs"]
        agreement["moe_routing_vs_activation_rounding"] = route_info
        agreement["per_prompt_llamacpp_vs_hf64"] = {
            f"t{n}": {kk: sig(vv) for kk, vv in summarize([p]).items()}
            for n, p in zip(PROMPT_LENGTHS, cmp["llamacpp_vs_hf64"])}
        hist = {}
        for ty in types.values():
            hist[ty] = hist.get(ty, 0) + 1
        manifest["models"].append({
            "name": name,
            "gguf": name + ".gguf",
            "synth_args": COMMON_SYNTH + spec["synth"],
            "gguf_sha256": sha256(path),
            "gguf_bytes": os.path.getsize(path),
            "tensor_types": dict(sorted(hist.items())),
            "ignored_by_hf": unused,
            "config": {k: v for k, v in c.items() if k not in ("bos", "eos", "pad")},
            "golden": name + ".bin",
            "golden_sha256": sha256(out),
            "golden_bytes": os.path.getsize(out),
            "entries": [{"name": e[0], "dtype": "i32" if e[1].dtype.kind == "i" else "f32",
                         "shape": list(e[1].shape)} for e in entries],
            "agreement": agreement,
        })
        rows.append((name, agreement))
        print(f"{name}: {time.time() - t0:.1f} s, golden {os.path.getsize(out)} bytes", file=sys.stderr)
        for k in ("llamacpp_vs_hf64", "hf32_vs_hf64", "llamacpp_step_vs_batch", "llamacpp_vs_hf64_actq",
                  "moe_routing_vs_activation_rounding"):
            print(f"   {k}: {agreement[k]}", file=sys.stderr)

    with open(os.path.join(args.out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    table = agreement_table(rows)
    print(table)
    if args.table:
        with open(args.table, "w") as f:
            f.write(table)


def agreement_table(rows):
    out = ["| model | comparison | rel L2 max | rel L2 mean | top-1 | KL mean | KL max | max abs |",
           "|---|---|---|---|---|---|---|---|"]
    labels = [("llamacpp_vs_hf64", "llama.cpp vs HF f64"), ("llamacpp_vs_hf32", "llama.cpp vs HF f32"),
              ("hf32_vs_hf64", "HF f32 vs HF f64"), ("llamacpp_step_vs_batch", "llama.cpp 1-token steps vs batch"),
              ("llamacpp_vs_hf64_actq", "llama.cpp vs HF f64 + llama.cpp's activation rounding"),
              ("hf64_actq_vs_hf64", "HF f64 + activation rounding vs HF f64")]
    for name, a in rows:
        for k, lab in labels:
            s = a[k]
            out.append(f"| {name} | {lab} | {s['rel_l2_max']:.3g} | {s['rel_l2_mean']:.3g} | "
                       f"{s['top1_agree']}/{s['positions']} | {s['kl_mean']:.3g} | {s['kl_max']:.3g} | "
                       f"{s['max_abs']:.3g} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
