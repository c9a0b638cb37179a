#!/usr/bin/env python3
"""Trains redlite's demo model: a small Qwen3-Next (the exact qwen3next layer pattern: Gated
DeltaNet and gated attention layers, a MoE with a shared expert in every layer) with its MTP head,
on the corpus of tools/train/corpus.sh. Runs on one GPU in about 15 minutes (or, with --steps 20,
on a CPU as a smoke test).

Writes a Hugging Face checkpoint folder that `redlite convert` (and llama.cpp's converter) read:
config.json + model.safetensors (transformers' save_pretrained) + mtp.safetensors (the MTP block
under `mtp.*`, as Qwen ships it: transformers has no MTP module), tokenizer.json and
tokenizer_config.json (a byte-level BPE vocabulary trained here with the Qwen2 pre-tokenizer split,
Qwen's special tokens and chat template), and train_log.json.

The MTP head (spec §4.2): u = fc([enorm(embed(x_{t+1})); hnorm(h_t)]) with h_t the trunk's final-
normed hidden state, one full-attention decoder layer at position t, logits = lm_head(norm(u)),
trained on x_{t+2} with its own cross-entropy (weight --mtp-weight) next to the trunk's.

Usage: train.py --corpus DIR --out DIR [--steps N] [--minutes M] [--device cuda|cpu]
"""
import argparse
import json
import math
import os
import time

import torch
import torch.nn.functional as F

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen's added tokens: (text, special). The first three are the ones the chat template uses.
ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
         ("<think>", False), ("</think>", False), ("<tool_call>", False), ("</tool_call>", False),
         ("<tool_response>", False), ("</tool_response>", False)]


def train_tokenizer(corpus, vocab_size):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(ADDED), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([os.path.join(corpus, "train.txt")], trainer)
    tok.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in ADDED])
    return tok


def model_config(vocab, args):
    from transformers import Qwen3NextConfig
    layers = args.layers
    return Qwen3NextConfig(
        vocab_size=vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25},
        linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4, decoder_sparse_step=1,
        moe_intermediate_size=args.hidden, shared_expert_intermediate_size=args.hidden,
        num_experts_per_tok=args.top_k, num_experts=args.experts, norm_topk_prob=True,
        mlp_only_layers=[],
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                     for i in range(layers)],
        bos_token_id=None, eos_token_id=None, pad_token_id=None)


class Mtp(torch.nn.Module):
    """Qwen3-Next's MTP block, named as Qwen's checkpoints name it (`mtp.*`)."""

    def __init__(self, config):
        super().__init__()
        from transformers.models.qwen3_next.modeling_qwen3_next import (
            Qwen3NextDecoderLayer, Qwen3NextRMSNorm)
        e = config.hidden_size
        self.fc = torch.nn.Linear(2 * e, e, bias=False)
        self.pre_fc_norm_embedding = Qwen3NextRMSNorm(e, eps=config.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3NextRMSNorm(e, eps=config.rms_norm_eps)
        attention = config.layer_types.index("full_attention")
        self.layers = torch.nn.ModuleList([Qwen3NextDecoderLayer(config, attention)])
        self.norm = Qwen3NextRMSNorm(e, eps=config.rms_norm_eps)

    def forward(self, embeds, hidden, position_embeddings):
        u = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds),
                               self.pre_fc_norm_hidden(hidden)], dim=-1))
        u = self.layers[0](u, position_embeddings=position_embeddings, attention_mask=None)
        if isinstance(u, tuple):
            u = u[0]
        return self.norm(u)


def losses(model, mtp, ids):
    """Trunk next-token loss and MTP next-next-token loss over a batch [B, T + 2]."""
    inputs = ids[:, :-2]
    out = model.model(input_ids=inputs)
    hidden = out.last_hidden_state                        # final-normed, [B, T, e]
    logits = model.lm_head(hidden)
    trunk = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:-1].flatten())
    t = inputs.shape[1]
    positions = torch.arange(t, device=ids.device).unsqueeze(0)
    cos_sin = model.model.rotary_emb(hidden, positions)
    embeds = model.model.embed_tokens(ids[:, 1:-1])       # x_{t+1}
    u = mtp(embeds, hidden, cos_sin)
    mtp_logits = model.lm_head(u)
    draft = F.cross_entropy(mtp_logits.float().flatten(0, 1), ids[:, 2:].flatten())
    return trunk, draft


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--save-dtype", choices=["f32", "bf16"], default="f32",
                    help="bf16 halves the checkpoint (the device machine returns at most 64 MiB)")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    start = time.time()

    tok = train_tokenizer(args.corpus, args.vocab)
    text = open(os.path.join(args.corpus, "train.txt"), encoding="utf-8").read()
    held = open(os.path.join(args.corpus, "heldout.txt"), encoding="utf-8").read()
    data = torch.tensor(tok.encode(text).ids, dtype=torch.long)
    held_ids = torch.tensor(tok.encode(held).ids, dtype=torch.long)
    print(f"tokenizer: {tok.get_vocab_size()} tokens; corpus {len(data)} train / "
          f"{len(held_ids)} held-out tokens ({time.time() - start:.0f} s)", flush=True)

    from transformers import Qwen3NextForCausalLM
    config = model_config(args.vocab, args)
    config._attn_implementation = "sdpa"
    model = Qwen3NextForCausalLM(config).to(args.device)
    mtp = Mtp(config).to(args.device)
    params = list(model.parameters()) + list(mtp.parameters())
    n_params = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    print(f"model: {n_params / 1e6:.1f} M parameters + MTP {n_mtp / 1e6:.1f} M", flush=True)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if args.device == "cuda" else \
        torch.autocast("cpu", enabled=False)

    def batch(source, n):
        starts = torch.randint(0, len(source) - args.seq - 3, (n,))
        return torch.stack([source[s:s + args.seq + 2] for s in starts]).to(args.device)

    def evaluate():
        model.eval()
        with torch.no_grad(), amp:
            g = torch.Generator().manual_seed(0)
            starts = torch.randint(0, len(held_ids) - args.seq - 3, (64,), generator=g)
            ids = torch.stack([held_ids[s:s + args.seq + 2] for s in starts]).to(args.device)
            trunk, draft = losses(model, mtp, ids)
        model.train()
        return trunk.item(), draft.item()

    # A 4 MB corpus is small for 30 M parameters: keep the weights of the best held-out loss.
    log, step, warmup = [], 0, 100
    best = {"heldout": float("inf"), "step": 0, "state": None}
    budget = args.minutes * 60
    train_start = time.time()
    while step < args.steps and time.time() - train_start < budget:
        frac = min(1.0, (time.time() - train_start) / budget, step / max(args.steps, 1))
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for group in opt.param_groups:
            group["lr"] = lr
        with amp:
            trunk, draft = losses(model, mtp, batch(data, args.batch))
            loss = trunk + args.mtp_weight * draft
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % 100 == 0 or step == args.steps:
            ev = evaluate()
            entry = {"step": step, "seconds": round(time.time() - train_start, 1), "lr": lr,
                     "train": trunk.item(), "train_mtp": draft.item(),
                     "heldout": ev[0], "heldout_mtp": ev[1]}
            log.append(entry)
            print(json.dumps(entry), flush=True)
            if ev[0] < best["heldout"]:
                best.update(heldout=ev[0], step=step,
                            state=[{k: v.detach().to("cpu", copy=True) for k, v in m.state_dict().items()}
                                   for m in (model, mtp)])

    trunk_eval, draft_eval = evaluate()
    kept_step = step
    if best["state"] is not None and best["heldout"] < trunk_eval:
        model.load_state_dict(best["state"][0])
        mtp.load_state_dict(best["state"][1])
        trunk_eval, draft_eval = evaluate()
        kept_step = best["step"]
    summary = {"steps": step, "kept_step": kept_step,
               "train_seconds": round(time.time() - train_start, 1),
               "parameters": n_params, "mtp_parameters": n_mtp,
               "heldout_loss": trunk_eval, "heldout_ppl": math.exp(trunk_eval),
               "heldout_mtp_loss": draft_eval, "args": vars(args), "log": log}
    print(json.dumps({k: v for k, v in summary.items() if k != "log"}), flush=True)

    # The checkpoint: the trunk as transformers saves it, the MTP block beside it.
    config.bos_token_id = config.pad_token_id = tok.token_to_id("<|endoftext|>")
    config.eos_token_id = tok.token_to_id("<|im_end|>")
    dtype = torch.bfloat16 if args.save_dtype == "bf16" else torch.float32
    model.to(dtype).save_pretrained(args.out, safe_serialization=True)
    from safetensors.torch import save_file
    save_file({f"mtp.{k}": v.detach().to(dtype).contiguous().cpu() for k, v in mtp.state_dict().items()},
              os.path.join(args.out, "mtp.safetensors"))
    tok.save(os.path.join(args.out, "tokenizer.json"))
    template_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                 "assets", "chat", "Qwen-Qwen3-0.6B.jinja")
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "Qwen2Tokenizer", "add_bos_token": False,
                   "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "chat_template": open(template_path).read()}, f, ensure_ascii=False)
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"wrote {args.out} in {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
