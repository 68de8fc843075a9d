#!/usr/bin/env python3
"""Write a llama-architecture GGUF (v3) from one of our Hugging Face-style model folders.

    bench/gguf_write.py MODEL_DIR OUT.gguf --type f16|q8_0 [--tool-dir DIR]

Input: config.json + model.safetensors (F32/BF16/F16 tensors, Llama layout). Output: the
same model the way llama.cpp's convert_hf_to_gguf.py writes it (--outtype f16 / q8_0):
tensor names token_embd / blk.N.attn_q ... / output_norm / output, q_proj and k_proj rows
permuted for llama.cpp's RoPE (LlamaModel.permute), 1-D norms in F32, every 2-D weight in
F16 or Q8_0 -- including token_embd and output, as convert_hf_to_gguf does for q8_0 (it
only keeps them F16 for the ternary types; llama-quantize --type q8_0 also leaves both at
Q8_0).

Vocabulary: the models are random-weight, so the tokenizer only has to be valid. When the
folder has a SentencePiece tokenizer.model, its pieces (scores, types) are taken as ids
0..n-1 (so the same text gives the same ids as our engine); otherwise <unk>, <s>, </s> and
the 256 byte tokens <0x00>..<0xFF> are synthesized. Filler pieces (type 1, normal) pad
the vocabulary to vocab_size.

No third-party packages: the header is written here; the tensor data (bf16 -> f16 / Q8_0
of up to billions of weights, too slow in pure Python) is converted by the small C++
program bench/gguf_quantize.cc, compiled with g++ -O2 on first use into --tool-dir
(default build/gguf-tools). It memory-maps the safetensors file and streams row by row.
"""
import argparse
import json
import os
import struct
import subprocess
import sys

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32

# gguf_type (metadata value types)
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, \
    T_ARRAY, T_UINT64, T_INT64, T_FLOAT64 = range(13)
# ggml_type (tensor types)
GGML_TYPE = {"F32": 0, "F16": 1, "Q8_0": 8}
# llama_ftype (general.file_type)
FILE_TYPE = {"f16": 1, "q8_0": 7}

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pack_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


SCALAR_FMT = {T_UINT8: "<B", T_INT8: "<b", T_UINT16: "<H", T_INT16: "<h", T_UINT32: "<I",
              T_INT32: "<i", T_FLOAT32: "<f", T_BOOL: "<?", T_UINT64: "<Q", T_INT64: "<q",
              T_FLOAT64: "<d"}


def pack_value(vtype, value):
    if vtype == T_STRING:
        return pack_string(value)
    return struct.pack(SCALAR_FMT[vtype], value)


def pack_kv(key, vtype, value, elem_type=None):
    out = pack_string(key) + struct.pack("<I", vtype)
    if vtype == T_ARRAY:
        out += struct.pack("<IQ", elem_type, len(value))
        if elem_type == T_STRING:
            out += b"".join(pack_string(v) for v in value)
        else:
            out += struct.pack("<%d%s" % (len(value), SCALAR_FMT[elem_type][1]), *value)
        return out
    return out + pack_value(vtype, value)


def read_safetensors_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return 8 + n, header


def parse_sentencepiece(path):
    """The pieces of a SentencePiece ModelProto: [(piece, score, type)] (protobuf by hand:
    ModelProto.pieces = field 1; SentencePiece.piece = 1, score = 2 (float), type = 3)."""
    data = open(path, "rb").read()

    def varint(buf, i):
        shift = result = 0
        while True:
            b = buf[i]
            i += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result, i
            shift += 7

    def fields(buf):
        i = 0
        while i < len(buf):
            key, i = varint(buf, i)
            field, wire = key >> 3, key & 7
            if wire == 0:
                value, i = varint(buf, i)
            elif wire == 1:
                value, i = buf[i:i + 8], i + 8
            elif wire == 2:
                n, i = varint(buf, i)
                value, i = buf[i:i + n], i + n
            elif wire == 5:
                value, i = buf[i:i + 4], i + 4
            else:
                raise ValueError("unsupported protobuf wire type %d" % wire)
            yield field, wire, value

    pieces = []
    for field, wire, value in fields(data):
        if field != 1 or wire != 2:
            continue
        piece, score, ptype = "", 0.0, 1
        for f2, w2, v2 in fields(value):
            if f2 == 1 and w2 == 2:
                piece = v2.decode("utf-8")
            elif f2 == 2 and w2 == 5:
                (score,) = struct.unpack("<f", v2)
            elif f2 == 3 and w2 == 0:
                ptype = v2
        pieces.append((piece, score, ptype))
    return pieces


def build_vocab(model_dir, vocab_size):
    sp = os.path.join(model_dir, "tokenizer.model")
    pieces = parse_sentencepiece(sp) if os.path.exists(sp) else []
    names = {p[0] for p in pieces}
    byte_pieces = ["<0x%02X>" % b for b in range(256)]
    if not pieces or not all(b in names for b in byte_pieces) or len(pieces) > vocab_size:
        pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
        pieces += [(b, 0.0, 6) for b in byte_pieces]
        source = "synthesized"
    else:
        source = "tokenizer.model (%d pieces)" % len(pieces)
    names = {p[0] for p in pieces}
    tokens = [p[0] for p in pieces]
    scores = [float(p[1]) for p in pieces]
    types = [int(p[2]) for p in pieces]
    low = min(scores) if scores else 0.0
    i = 0
    while len(tokens) < vocab_size:
        name = "\u2581filler%d" % i
        i += 1
        if name in names:
            continue
        tokens.append(name)
        scores.append(low - 1.0 - len(tokens))  # below every real piece: never preferred
        types.append(1)
    return tokens, scores, types, source


def tensor_plan(cfg, header):
    """(gguf name, safetensors name, permute heads, is_norm) in llama.cpp's order."""
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    plan = [("token_embd.weight", "model.embed_tokens.weight", 0, False)]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        b = "blk.%d." % i
        plan += [
            (b + "attn_norm.weight", p + "input_layernorm.weight", 0, True),
            (b + "attn_q.weight", p + "self_attn.q_proj.weight", n_head, False),
            (b + "attn_k.weight", p + "self_attn.k_proj.weight", n_kv, False),
            (b + "attn_v.weight", p + "self_attn.v_proj.weight", 0, False),
            (b + "attn_output.weight", p + "self_attn.o_proj.weight", 0, False),
            (b + "ffn_norm.weight", p + "post_attention_layernorm.weight", 0, True),
            (b + "ffn_gate.weight", p + "mlp.gate_proj.weight", 0, False),
            (b + "ffn_up.weight", p + "mlp.up_proj.weight", 0, False),
            (b + "ffn_down.weight", p + "mlp.down_proj.weight", 0, False),
        ]
    plan.append(("output_norm.weight", "model.norm.weight", 0, True))
    if not cfg.get("tie_word_embeddings", False) and "lm_head.weight" in header:
        plan.append(("output.weight", "lm_head.weight", 0, False))
    return plan


def tool_path(tool_dir):
    src = os.path.join(REPO, "bench", "gguf_quantize.cc")
    exe = os.path.join(tool_dir, "gguf_quantize")
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(src):
        os.makedirs(tool_dir, exist_ok=True)
        cmd = ["g++", "-O2", "-std=c++17", "-o", exe + ".tmp", src]
        subprocess.run(cmd, check=True)
        os.replace(exe + ".tmp", exe)
    return exe


def write_gguf(model_dir, out_path, out_type, tool_dir):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    st_path = os.path.join(model_dir, "model.safetensors")
    data_start, header = read_safetensors_header(st_path)
    hidden = cfg["hidden_size"]
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    vocab_size = cfg["vocab_size"]
    head_dim = cfg.get("head_dim") or hidden // n_head
    tokens, scores, types, vocab_source = build_vocab(model_dir, vocab_size)

    kv = [
        pack_kv("general.architecture", T_STRING, "llama"),
        pack_kv("general.name", T_STRING, os.path.basename(os.path.normpath(model_dir))),
        pack_kv("general.file_type", T_UINT32, FILE_TYPE[out_type]),
        pack_kv("general.quantization_version", T_UINT32, 2),
        pack_kv("llama.context_length", T_UINT32, cfg.get("max_position_embeddings", 2048)),
        pack_kv("llama.embedding_length", T_UINT32, hidden),
        pack_kv("llama.block_count", T_UINT32, cfg["num_hidden_layers"]),
        pack_kv("llama.feed_forward_length", T_UINT32, cfg["intermediate_size"]),
        pack_kv("llama.attention.head_count", T_UINT32, n_head),
        pack_kv("llama.attention.head_count_kv", T_UINT32, n_kv),
        pack_kv("llama.rope.dimension_count", T_UINT32, head_dim),
        pack_kv("llama.rope.freq_base", T_FLOAT32, float(cfg.get("rope_theta", 10000.0))),
        pack_kv("llama.attention.layer_norm_rms_epsilon", T_FLOAT32,
                float(cfg.get("rms_norm_eps", 1e-5))),
        pack_kv("llama.vocab_size", T_UINT32, vocab_size),
        pack_kv("tokenizer.ggml.model", T_STRING, "llama"),
        pack_kv("tokenizer.ggml.tokens", T_ARRAY, tokens, T_STRING),
        pack_kv("tokenizer.ggml.scores", T_ARRAY, scores, T_FLOAT32),
        pack_kv("tokenizer.ggml.token_type", T_ARRAY, types, T_INT32),
        pack_kv("tokenizer.ggml.bos_token_id", T_UINT32, cfg.get("bos_token_id", 1)),
        pack_kv("tokenizer.ggml.eos_token_id", T_UINT32, cfg.get("eos_token_id", 2)),
        pack_kv("tokenizer.ggml.unknown_token_id", T_UINT32, 0),
        pack_kv("tokenizer.ggml.add_bos_token", T_BOOL, True),
        pack_kv("tokenizer.ggml.add_eos_token", T_BOOL, False),
    ]

    plan = tensor_plan(cfg, header)
    infos, jobs, offset = [], [], 0
    wtype = {"f16": "F16", "q8_0": "Q8_0"}[out_type]
    for gname, sname, perm, is_norm in plan:
        t = header.get(sname)
        if t is None:
            sys.exit("gguf_write: %s has no tensor %s" % (st_path, sname))
        shape = t["shape"]
        if t["dtype"] not in ("F32", "BF16", "F16"):
            sys.exit("gguf_write: %s is %s (need F32, BF16 or F16)" % (sname, t["dtype"]))
        rows, cols = (1, shape[0]) if len(shape) == 1 else (shape[0], shape[1])
        gtype = "F32" if is_norm or len(shape) == 1 else wtype
        if gtype == "Q8_0" and cols % 32:
            gtype = "F16"  # as convert_hf_to_gguf falls back when a row is not whole blocks
        nbytes = rows * (cols * 4 if gtype == "F32" else cols * 2 if gtype == "F16"
                         else cols // 32 * 34)
        dims = [cols] if len(shape) == 1 else [cols, rows]  # ggml order: ne0 = innermost
        infos.append(pack_string(gname) + struct.pack("<I", len(dims)) +
                     struct.pack("<%dQ" % len(dims), *dims) +
                     struct.pack("<IQ", GGML_TYPE[gtype], offset))
        jobs.append((st_path, data_start + t["data_offsets"][0], t["dtype"], rows, cols, perm,
                     gtype, offset))
        offset += nbytes
        offset += -offset % ALIGNMENT

    head = (GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(infos), len(kv)) +
            b"".join(kv) + b"".join(infos))
    head += b"\0" * (-len(head) % ALIGNMENT)
    total = len(head) + offset
    exe = tool_path(tool_dir)
    tmp = out_path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(head)
        f.truncate(total)
    job_text = "".join("%s %d %s %d %d %d %s %d\n" % (j[0], j[1], j[2], j[3], j[4], j[5], j[6],
                                                       len(head) + j[7]) for j in jobs)
    subprocess.run([exe, tmp], input=job_text.encode(), check=True)
    if os.path.getsize(tmp) != total:
        sys.exit("gguf_write: %s has %d bytes, expected %d" % (tmp, os.path.getsize(tmp), total))
    os.replace(tmp, out_path)
    return {"path": out_path, "bytes": total, "tensors": len(infos), "type": wtype,
            "vocab": vocab_source}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--type", choices=sorted(FILE_TYPE), default="f16")
    ap.add_argument("--tool-dir", default=os.path.join(REPO, "build", "gguf-tools"))
    a = ap.parse_args()
    print(json.dumps(write_gguf(a.model_dir, a.out, a.type, a.tool_dir)))


if __name__ == "__main__":
    main()
