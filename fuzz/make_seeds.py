#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/seed-* and their libFuzzer
dictionaries into fuzz/dict/<target>.dict.

Dictionaries list the tokens a mutation is unlikely to invent (JSON keys the parsers read, enum strings, edge
numbers), taken from the parser sources, so that fuzzing reaches field-specific checks within a short CI run.
Seeds are small valid inputs (and a few near-misses) that reach each parser's main paths, so a short fuzzing run
starts deep instead of rediscovering the format. Re-run after changing a format; the output is deterministic.
Regression inputs for crashes found by fuzzing live beside the seeds as regress-* files and are written by hand
(they are never removed by this script). Protobuf seeds are encoded with `protoc --encode` from text format.

    python3 fuzz/make_seeds.py
"""
import json
import pathlib
import re
import struct
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"


def write(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / ("seed-" + name)).write_bytes(data)


def clear_seeds():
    for d in CORPUS.glob("*"):
        for f in d.glob("seed-*"):
            f.unlink()


def safetensors(tensors, metadata=None, pad_to=None):
    """tensors: [(name, dtype, shape, bytes)] laid out back to back."""
    header, data = {}, b""
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad_to:
        text += b" " * (-(8 + len(text)) % pad_to)
    return struct.pack("<Q", len(text)) + text + data


def safetensors_seeds():
    t = "safetensors_fuzzer"
    write(t, "one_f32", safetensors([("a", "F32", [2], struct.pack("<2f", 1.0, -2.0))]))
    write(t, "mixed", safetensors([
        ("embed.weight", "BF16", [2, 3], bytes(range(12))),
        ("layers.0.attn.wkv.weight", "F8_E4M3", [2, 2], b"\x01\x02\x03\x04"),
        ("layers.0.attn.wkv.scale", "F8_E8M0", [1, 1], b"\x7f"),
        ("layers.0.ffn.gate.tid2eid", "I64", [1, 2], struct.pack("<2q", 3, 5)),
        ("scalar", "F32", [], struct.pack("<f", 0.5)),
        ("empty", "I32", [0, 4], b""),
        ("x.weight", "U8", [3], b"abc"),
        ("y", "I8", [1], b"\xff"),
        ("z", "F16", [1], b"\x00\x3c"),
    ], metadata={"format": "pt"}, pad_to=8))
    write(t, "empty_header", struct.pack("<Q", 2) + b"{}")
    write(t, "metadata_only", safetensors([], metadata={"producer": "dsv4"}))
    # Near misses: overlapping tensors, a truncated data section, a bad dtype.
    overlap = {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
               "b": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}}
    text = json.dumps(overlap).encode()
    write(t, "overlap", struct.pack("<Q", len(text)) + text + b"1234")
    write(t, "truncated", safetensors([("a", "F32", [4], bytes(16))])[:-4])
    bad = json.dumps({"a": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}}).encode()
    write(t, "bad_dtype", struct.pack("<Q", len(bad)) + bad + b"\0")


def index_seeds():
    t = "checkpoint_index_fuzzer"
    write(t, "two_shards", json.dumps({
        "metadata": {"total_size": 1234},
        "weight_map": {"embed.weight": "model-00001-of-00002.safetensors",
                       "layers.0.attn.wq_a.weight": "model-00001-of-00002.safetensors",
                       "head.weight": "model-00002-of-00002.safetensors"}}, indent=2))
    write(t, "one", '{"weight_map": {"a": "a.safetensors"}}')
    write(t, "escape", '{"weight_map": {"a": "../outside.safetensors", "b": "sub/dir.safetensors"}}')
    write(t, "not_string", '{"weight_map": {"a": 7}}')


def config_seeds():
    t = "config_fuzzer"
    for name in ("tiny", "small", "flash"):
        write(t, name, (ROOT / "configs" / f"{name}.json").read_text())
    tiny = json.loads((ROOT / "configs" / "tiny.json").read_text())
    # transformers 5 spellings (as in tests/config/config_test.cc).
    hf = dict(tiny)
    for k in ("compress_ratios", "num_hash_layers", "qk_rope_head_dim", "rope_scaling", "torch_dtype"):
        hf.pop(k)
    hf.update({
        "dtype": "float32",
        "layer_types": ["sliding_attention", "sliding_attention", "compressed_sparse_attention",
                        "heavily_compressed_attention"],
        "mlp_layer_types": ["hash_moe", "hash_moe", "hash_moe", "moe"],
        "partial_rotary_factor": 0.125,
        "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
        "rope_parameters": {
            "main": {"rope_type": "default", "rope_theta": 10000.0},
            "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 16,
                         "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1,
                         "attention_factor": 1.0}},
    })
    write(t, "transformers5", json.dumps(hf))
    # ModelOpt metadata inside quantization_config (NVIDIA's NVFP4 re-quant layout).
    nv = dict(tiny)
    nv["quantization_config"] = dict(tiny["quantization_config"], quant_method="modelopt", quant_algo="NVFP4",
                                     group_size=16, producer={"name": "modelopt", "version": "0.1"},
                                     exclude_modules=["*.attn.*", "mtp.*", "head*"])
    nv["eos_token_id"] = [1, 2]
    nv["pad_token_id"] = None
    write(t, "modelopt_inline", json.dumps(nv))


def quant_seeds():
    t = "quant_config_fuzzer"
    write(t, "mixed_precision", json.dumps({
        "producer": {"name": "modelopt", "version": "0.29.0"},
        "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None,
                         "quantized_layers": {
                             "layers.0.ffn.experts.0.w1": {"quant_algo": "NVFP4", "group_size": 16},
                             "layers.0.ffn.experts.0.w2": {"quant_algo": "NVFP4", "awq_block_size": 16}},
                         "exclude_modules": ["*.attn.*", "embed.weight", "mtp.*"]}}, indent=2))
    write(t, "global_nvfp4", json.dumps({
        "producer": {"name": "modelopt", "version": "0.29.0"},
        "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                         "exclude_modules": ["*attn*", "*.ffn.gate*", "lm_head", "layers.?.ffn_norm"]}}))
    write(t, "flat_ignore", json.dumps({"quant_algo": "NVFP4", "group_size": 16, "ignore": ["*"]}))
    write(t, "null_algo", '{"quantization": {"quant_algo": null, "kv_cache_quant_algo": null}}')


def protoc_encode(proto_dir, proto, message, text):
    return subprocess.run(["protoc", f"--proto_path={proto_dir}", f"--encode={message}", proto],
                          input=text.encode(), stdout=subprocess.PIPE, check=True, cwd=ROOT).stdout


def request_seeds():
    t = "request_fuzzer"

    def req(name, text):
        write(t, name, protoc_encode("proto", "dsv4/v1/generate.proto", "dsv4.v1.GenerateRequest", text))

    req("greedy", 'request_id: "r1" prompt_token_ids: [1, 2, 3] sampling { max_new_tokens: 8 }')
    req("sampled", 'prompt_token_ids: [5, 6] sampling { temperature: 0.7 top_k: 40 top_p: 0.9 min_p: 0.05 '
                   'seed: 42 max_new_tokens: 16 stop_token_ids: [2, 3] ignore_eos: true }')
    req("resume", 'request_id: "c-1" prompt_token_ids: [1, 2, 3, 4, 5] resume_generated: 2 '
                  'sampling { max_new_tokens: 10 seed: 7 }')
    req("bad_token", 'prompt_token_ids: [-1, 999999] sampling { max_new_tokens: 1 }')
    req("no_sampling", 'prompt_token_ids: [1]')
    req("nan_temperature", 'prompt_token_ids: [1] sampling { temperature: nan max_new_tokens: 2 }')


def step_plan_seeds():
    t = "step_plan_fuzzer"

    def plan(text):
        data = protoc_encode("comm", "step_plan.proto", "dsv4.comm.StepPlan", text)
        return struct.pack("<Q", len(data)) + data

    pools = 'pools { pages: [0] } pools { pages: [1, 2] } pools { } pools { pages: [3] }'
    allocate = plan('seq: 1 allocate_cache { pages_per_pool: [8, 8, 4, 8] page_rows: 64 max_state_slots: 4 }')
    reset = plan('seq: 2 reset_state { state_slot: 0 }')
    prefill = plan(f'seq: 3 forward {{ chunks {{ state_slot: 0 start_pos: 0 tokens: [1, 2, 3, 4] {pools} }} }}')
    decode = plan(f'seq: 4 forward {{ chunks {{ state_slot: 0 start_pos: 4 tokens: [7] {pools} }} '
                  f'chunks {{ state_slot: 1 start_pos: 0 tokens: [9, 9] {pools} }} }}')
    heartbeat = plan('seq: 5 heartbeat { }')
    shutdown = plan('seq: 6 shutdown { reason: "leader shutting down" }')
    write(t, "session", allocate + reset + prefill + decode + heartbeat + shutdown)
    write(t, "allocate_then_gone", allocate)
    write(t, "gap", allocate + plan('seq: 3 heartbeat { }'))
    write(t, "three_pools", allocate + plan('seq: 2 forward { chunks { tokens: [1] pools { } pools { } pools { } } }'))
    write(t, "oversized_length", struct.pack("<Q", (64 << 20) + 1))


# Numbers at the edges of what the parsers convert: int64/uint64 limits, huge and tiny doubles, negatives.
EDGE_NUMBERS = ["0", "-1", "1", "2147483647", "2147483648", "4294967296", "9223372036854775807",
                "9223372036854775808", "18446744073709551615", "-9223372036854775808", "1e308", "1e300", "-1e308",
                "1e-320", "0.5", "1.0", "128", "512", "65536"]
JSON_TOKENS = ["{", "}", "[", "]", ":", ",", "null", "true", "false", '""', '"\\u0000"', '"\\ud800"']


def write_dict(target, tokens):
    d = ROOT / "fuzz" / "dict"
    d.mkdir(parents=True, exist_ok=True)
    lines = [f"# {target}: written by fuzz/make_seeds.py"]
    for t in sorted(set(tokens)):
        lines.append('"' + t.replace("\\", "\\\\").replace('"', '\\"') + '"')
    (d / f"{target}.dict").write_text("\n".join(lines) + "\n")


def source_keys(pattern, *files):
    keys = set()
    for f in files:
        for path in sorted(ROOT.glob(f)):
            keys.update(re.findall(pattern, path.read_text()))
    return sorted(keys)


def dicts():
    config_keys = source_keys(r'\.(?:Int|Double|Bool|String|IntList|StringList|Object|Has|IsNull|Error)\("([A-Za-z0-9_]+)"',
                              "model/config/*.cc")
    enums = source_keys(r'"((?:[a-z]+_)+attention|hash_moe|moe|yarn|default|NVFP4|MIXED_PRECISION|deepseek_v4|'
                        r'silu|sqrtsoftplus|noaux_tc|fp8|fp4|e4m3|ue8m0|dynamic|modelopt)"', "model/config/*.cc")
    common = JSON_TOKENS + EDGE_NUMBERS
    write_dict("config_fuzzer", [f'"{k}"' for k in config_keys] + [f'"{e}"' for e in enums] + common)
    write_dict("quant_config_fuzzer", [f'"{k}"' for k in config_keys] + [f'"{e}"' for e in enums] +
               ['"quantization"', '"*"', '"layers.0.ffn.experts.0.w1"', '"*.weight"'] + common)
    dtypes = source_keys(r'"([A-Z][A-Z0-9_]+)"', "model/checkpoint/dtype.cc")
    write_dict("safetensors_fuzzer", ['"dtype"', '"shape"', '"data_offsets"', '"__metadata__"'] +
               [f'"{d}"' for d in dtypes] + common)
    write_dict("checkpoint_index_fuzzer", ['"weight_map"', '"metadata"', '"total_size"', '".."', '"."', '"/"',
                                           '"a/b"', '"x.safetensors"'] + common)


def main():
    dicts()
    clear_seeds()
    safetensors_seeds()
    index_seeds()
    config_seeds()
    quant_seeds()
    request_seeds()
    step_plan_seeds()
    for d in sorted(CORPUS.iterdir()):
        print(f"{d.name}: {len(list(d.iterdir()))} files")


if __name__ == "__main__":
    main()
