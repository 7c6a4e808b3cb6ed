#!/usr/bin/env python3
"""Golden logits for the CPU reference, from Hugging Face transformers' DeepseekV4ForCausalLM.

Runs where PyTorch and transformers >= 5.17 are installed (the H200 machine). Loads a checkpoint written by
dsv4-make-checkpoint, dequantises every tensor itself (numpy; FP8 block-128, MXFP4, NVFP4, BF16), renames
them onto transformers' module names (dsv4-decode.md section 6.9), runs the model in fp32 on the GPU (torch's
CPU top-k breaks indexer ties arbitrarily) and writes, for a few fixed token sequences that cross the
128-token window, the indexer's top-k and two ratio-128 rows:
  tokens.npy     int32 [sum rows]           prompt + greedy continuation of every sequence, concatenated
  logits_q.npy   int16 [sum rows, vocab]    logits / row_scale, rounded (row_scale = max|logit| / 32767)
  row_stats.npy  float32 [sum rows, 3]      row_scale, golden top-2 margin, golden argmax
  golden.json    sequence offsets, prompt lengths, versions, the command, self-checks
Usage: python3 make_golden.py --checkpoint DIR --out DIR [--new-tokens 8] [--dry-run]
--dry-run stops after dequantising and renaming (needs numpy only), to check a checkpoint here.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np

PROMPT_LENS = (320, 324, 330)
SEQ_SEED = 20240611


# ---------------------------------------------------------------- safetensors + formats (numpy only)
def _e4m3_table():
    t = np.zeros(256, np.float32)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 7
        if e == 0xF and m == 7:
            t[b] = np.nan
        elif e == 0:
            t[b] = s * m * 2.0 ** -9
        else:
            t[b] = s * (1 + m / 8) * 2.0 ** (e - 7)
    return t


E4M3 = _e4m3_table()
E8M0 = np.array([2.0 ** (b - 127) if b != 255 else np.nan for b in range(256)], np.float64).astype(np.float32)
E8M0[0] = np.float32(2.0 ** -127)
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
NP_DTYPES = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16, "F8_E4M3": np.uint8, "F8_E8M0": np.uint8,
             "U8": np.uint8, "I8": np.uint8, "I64": np.int64, "I32": np.int32}


class Safetensors:
    """All tensors of a checkpoint folder (single file or index + shards), as raw numpy arrays + dtype names."""

    def __init__(self, folder):
        index = os.path.join(folder, "model.safetensors.index.json")
        files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else [
            "model.safetensors"]
        self.tensors = {}
        for f in files:
            raw = np.memmap(os.path.join(folder, f), dtype=np.uint8, mode="r")
            (hlen,) = struct.unpack("<Q", bytes(raw[:8]))
            header = json.loads(bytes(raw[8:8 + hlen]))
            base = 8 + hlen
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                a, b = info["data_offsets"]
                arr = np.frombuffer(raw[base + a:base + b].tobytes(), dtype=NP_DTYPES[info["dtype"]])
                self.tensors[name] = (info["dtype"], arr.reshape(info["shape"]) if info["shape"] else arr.reshape(()))

    def has(self, name):
        return name in self.tensors

    def plain(self, name):
        dtype, a = self.tensors[name]
        if dtype == "F32":
            return a.astype(np.float32)
        if dtype == "BF16":
            return (a.astype(np.uint32) << 16).view(np.float32)
        if dtype in ("I64", "I32"):
            return a.astype(np.int64)
        raise ValueError(f"{name}: unexpected dtype {dtype} for a plain tensor")

    def linear(self, base):
        """Dequantised [N, K] fp32 weight of linear `base` in any of the checkpoint formats."""
        dtype, w = self.tensors[base + ".weight"]
        if dtype in ("F32", "BF16"):
            return self.plain(base + ".weight")
        if dtype == "F8_E4M3":  # FP8 block-128 with ue8m0 scales
            s = E8M0[self.tensors[base + ".scale"][1]]
            n, k = w.shape
            full = np.repeat(np.repeat(s, 128, axis=0), 128, axis=1)[:n, :k]
            return E4M3[w] * full
        codes = np.empty((w.shape[0], w.shape[1] * 2), np.uint8)
        codes[:, 0::2] = w & 0xF
        codes[:, 1::2] = w >> 4
        vals = E2M1[codes]
        if self.has(base + ".weight_scale"):  # NVFP4: e4m3 per 16 along K, times the per-tensor scale_2
            s = E4M3[self.tensors[base + ".weight_scale"][1]]
            s2 = float(self.plain(base + ".weight_scale_2").reshape(-1)[0])
            return vals * np.repeat(s, 16, axis=1) * np.float32(s2)
        s = E8M0[self.tensors[base + ".scale"][1]]  # MXFP4: ue8m0 per 32 along K
        return vals * np.repeat(s, 32, axis=1)


# ---------------------------------------------------------------- names (dsv4-decode.md section 6.9)
def hf_state_dict(st, cfg):
    """Official checkpoint names -> transformers DeepseekV4ForCausalLM parameter names, fp32 numpy."""
    sd = {"model.embed_tokens.weight": st.linear("embed"), "lm_head.weight": st.linear("head"),
          "model.norm.weight": st.plain("norm.weight"), "model.hc_head.hc_fn": st.plain("hc_head_fn"),
          "model.hc_head.hc_base": st.plain("hc_head_base"),
          "model.hc_head.hc_scale": st.plain("hc_head_scale").reshape(1)}
    ratios = cfg["compress_ratios"]
    n_hash = cfg.get("num_hash_layers", 3)
    for l in range(cfg["num_hidden_layers"]):
        p, q = f"layers.{l}.", f"model.layers.{l}."
        sd[q + "input_layernorm.weight"] = st.plain(p + "attn_norm.weight")
        sd[q + "post_attention_layernorm.weight"] = st.plain(p + "ffn_norm.weight")
        for site in ("attn", "ffn"):
            for part in ("fn", "base", "scale"):
                sd[f"{q}{site}_hc.{part}"] = st.plain(f"{p}hc_{site}_{part}")
        a, qa = p + "attn.", q + "self_attn."
        for src, dst in (("wq_a", "q_a_proj"), ("wq_b", "q_b_proj"), ("wkv", "kv_proj"), ("wo_a", "o_a_proj"),
                         ("wo_b", "o_b_proj")):
            sd[qa + dst + ".weight"] = st.linear(a + src)
        sd[qa + "q_a_norm.weight"] = st.plain(a + "q_norm.weight")
        sd[qa + "kv_norm.weight"] = st.plain(a + "kv_norm.weight")
        sd[qa + "sinks"] = st.plain(a + "attn_sink")

        def compressor(src, dst):
            sd[dst + "kv_proj.weight"] = st.linear(src + "wkv")
            sd[dst + "gate_proj.weight"] = st.linear(src + "wgate")
            sd[dst + "position_bias"] = st.plain(src + "ape")
            sd[dst + "kv_norm.weight"] = st.plain(src + "norm.weight")

        if ratios[l] > 0:
            compressor(a + "compressor.", qa + "compressor.")
        if ratios[l] == 4:
            compressor(a + "indexer.compressor.", qa + "compressor.indexer.")
            sd[qa + "compressor.indexer.q_b_proj.weight"] = st.linear(a + "indexer.wq_b")
            sd[qa + "compressor.indexer.scorer.weights_proj.weight"] = st.linear(a + "indexer.weights_proj")
        f, qf = p + "ffn.", q + "mlp."
        sd[qf + "gate.weight"] = st.linear(f + "gate")
        if l < n_hash:
            sd[qf + "gate.tid2eid"] = st.plain(f + "gate.tid2eid")
        else:
            sd[qf + "gate.e_score_correction_bias"] = st.plain(f + "gate.bias")
        E = cfg["n_routed_experts"]
        sd[qf + "experts.gate_up_proj"] = np.stack(
            [np.concatenate([st.linear(f"{f}experts.{e}.w1"), st.linear(f"{f}experts.{e}.w3")]) for e in range(E)])
        sd[qf + "experts.down_proj"] = np.stack([st.linear(f"{f}experts.{e}.w2") for e in range(E)])
        for src, dst in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
            sd[f"{qf}shared_experts.{dst}.weight"] = st.linear(f"{f}shared_experts.{src}")
    for k, v in sd.items():
        if v.dtype != np.int64 and not np.all(np.isfinite(v)):
            raise ValueError(f"{k}: non-finite values after dequantisation")
    return sd


def yarn_inv_freq(theta, dims, rs):
    """dsv4-decode.md section 2.3, for the self-check of transformers' table."""
    f = 1.0 / theta ** (np.arange(0, dims, 2) / dims)
    d = lambda n: dims * math.log(rs["original_max_position_embeddings"] / (2 * math.pi * n)) / (2 * math.log(theta))
    lo, hi = max(math.floor(d(rs["beta_fast"])), 0), min(math.ceil(d(rs["beta_slow"])), dims - 1)
    g = np.clip((np.arange(dims // 2) - lo) / (hi - lo), 0, 1)
    return f * (1 - g) + f / rs["factor"] * g


def sequences(vocab):
    rng = np.random.default_rng(SEQ_SEED)
    return [rng.integers(2, vocab, size=n).astype(np.int64) for n in PROMPT_LENS]


# ---------------------------------------------------------------- transformers
def build_model(cfg, sd, log):
    import torch
    import transformers
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
    hf = {k: v for k, v in cfg.items() if k not in ("quantization_config", "expert_dtype", "architectures",
                                                    "torch_dtype", "dtype", "auto_map", "transformers_version")}
    config = DeepseekV4Config(**hf)
    config._attn_implementation = "eager"
    log(f"transformers {transformers.__version__} torch {torch.__version__}")
    log(f"layer_types {config.layer_types} mlp_layer_types {config.mlp_layer_types}")
    log(f"rope_parameters {config.rope_parameters}")
    torch.manual_seed(0)
    model = DeepseekV4ForCausalLM(config).to(dtype=torch.float32)
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    log(f"load_state_dict missing={missing} unexpected={unexpected}")
    if unexpected or [m for m in missing if "inv_freq" not in m]:
        raise RuntimeError(f"name mapping incomplete: missing {missing}, unexpected {unexpected}")
    model = model.cuda().eval()
    # The engine implements YaRN with attention factor 1 (dsv4-decode.md 6.4): check transformers agrees.
    for name, mod in model.named_modules():
        if type(mod).__name__ == "DeepseekV4RotaryEmbedding":
            for lt in mod.layer_types:
                sc = getattr(mod, f"{lt}_attention_scaling")
                if abs(sc - 1.0) > 0:
                    log(f"WARNING {name}.{lt}_attention_scaling = {sc}; forcing 1.0 (spec 6.4)")
                    setattr(mod, f"{lt}_attention_scaling", 1.0)
    rot = model.model.rotary_emb
    if cfg.get("rope_scaling"):
        want = yarn_inv_freq(cfg["compress_rope_theta"], cfg.get("qk_rope_head_dim", 64), cfg["rope_scaling"])
        got = rot.compress_inv_freq.double().cpu().numpy()
        log(f"compress inv_freq max rel diff vs spec YaRN: {np.max(np.abs(got - want) / want):.3e}")
    return model


def run(args):
    t0 = time.time()
    lines = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)

    cfg = json.load(open(os.path.join(args.checkpoint, "config.json")))
    st = Safetensors(args.checkpoint)
    sd = hf_state_dict(st, cfg)
    log(f"dequantised {len(sd)} tensors from {len(st.tensors)} checkpoint tensors in {time.time() - t0:.1f}s")
    seqs = sequences(cfg["vocab_size"])
    if args.dry_run:
        log("dry run: " + ", ".join(f"{k} {list(v.shape)}" for k, v in list(sd.items())[:6]) + " ...")
        return
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = build_model(cfg, sd, log)
    all_tokens, all_logits, meta = [], [], []
    with torch.no_grad():
        for i, prompt in enumerate(seqs):
            ids = torch.tensor(prompt, device="cuda")[None]
            for _ in range(args.new_tokens):  # greedy, full recompute each step (no cache state involved)
                nxt = model(input_ids=ids, use_cache=False).logits[0, -1].argmax()
                ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
            logits = model(input_ids=ids, use_cache=False).logits[0].float()
            # Self-check: transformers' own cached decode of the same tokens against its full forward.
            try:
                out = model(input_ids=ids[:, :len(prompt)], use_cache=True)
                cache, steps = out.past_key_values, [out.logits[0, -1]]
                for j in range(len(prompt), ids.shape[1]):
                    out = model(input_ids=ids[:, j:j + 1], past_key_values=cache, use_cache=True)
                    cache = out.past_key_values
                    steps.append(out.logits[0, -1])
                d = (torch.stack(steps[:-1]) - logits[len(prompt) - 1:-1]).abs().max().item()
                log(f"seq {i}: transformers cached decode vs full forward max |diff| {d:.3e}")
            except Exception as e:  # diagnostics only
                log(f"seq {i}: cached-decode self-check failed: {e!r}")
            all_tokens.append(ids[0].cpu().numpy().astype(np.int32))
            all_logits.append(logits.cpu().numpy())
            meta.append({"prompt_len": len(prompt), "rows": int(ids.shape[1])})
            log(f"seq {i}: {len(prompt)} prompt + {args.new_tokens} greedy tokens, max|logit| "
                f"{logits.abs().max().item():.4f}, continuation {ids[0, len(prompt):].tolist()}")
    logits = np.concatenate(all_logits)
    scale = np.abs(logits).max(axis=1) / 32767.0
    scale[scale == 0] = 1.0
    q = np.round(logits / scale[:, None]).astype(np.int16)
    top2 = np.sort(logits, axis=1)[:, -2:]
    stats = np.stack([scale, top2[:, 1] - top2[:, 0], logits.argmax(axis=1).astype(np.float32)], axis=1)
    os.makedirs(args.out, exist_ok=True)
    np.save(os.path.join(args.out, "tokens.npy"), np.concatenate(all_tokens))
    np.save(os.path.join(args.out, "logits_q.npy"), q)
    np.save(os.path.join(args.out, "row_stats.npy"), stats.astype(np.float32))
    import transformers
    json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
               "device": torch.cuda.get_device_name(0), "dtype": "float32", "tf32": False,
               "command": " ".join(sys.argv), "seq_seed": SEQ_SEED, "sequences": meta,
               "vocab_size": cfg["vocab_size"], "log": lines},
              open(os.path.join(args.out, "golden.json"), "w"), indent=1)
    log(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--dry-run", action="store_true")
    run(ap.parse_args())
