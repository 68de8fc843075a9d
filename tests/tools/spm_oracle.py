#!/usr/bin/python3
"""SentencePiece oracle for the tokenizer tests (ctest fixture `spm_oracle`).

Runs the real library (Debian's python3-sentencepiece) in its own process and writes, for
each tokenizer, a JSON file into --out that tests/engine/tokenizer/tokenizer_oracle_test.cc compares
our C++ tokenizer against:

  {"name": str, "model": absolute path of tokenizer.model,
   "strings": [{"text": str, "ids": [int], "decoded": str}],   # encode(text), decode(ids)
   "decodes": [{"ids": [int], "text": str}],                  # decode of random id lists
   "raw_strings": [{"hex": str, "ids": [int]}]}               # malformed UTF-8, spm_encode

Tokenizers: Mistral-7B-v0.1 (32k BPE, byte fallback; plus the 41 cases of its
encodings.json), stories260K (512 BPE, byte fallback), and small models this script trains
with identity normalization (BPE and unigram, with and without byte fallback, user-defined
and control symbols, different whitespace options) plus copies of two of them with some
pieces turned UNUSED. Everything is deterministic (fixed seeds, one training thread).

Run with /usr/bin/python3 (stdlib + sentencepiece only):
  spm_oracle.py --shared ../shared --out build/tests/oracle
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys

try:
    import sentencepiece as spm
except ImportError as error:  # the fixture must fail loudly, not silently skip
    sys.exit("spm_oracle.py: cannot import sentencepiece (%s). Install Debian's "
             "python3-sentencepiece and run this script with /usr/bin/python3." % error)

# LLM_TEST_SCALE=small (the sanitizer builds, scripts/test_sanitizers.sh): a tenth of the
# random cases, since the C++ side runs 5-20x slower there.
SCALE = 10 if os.environ.get("LLM_TEST_SCALE") == "small" else 1
NUM_RANDOM_STRINGS = 10000 // SCALE
NUM_RANDOM_DECODES = 1500 // SCALE
NUM_RAW_STRINGS = 500 // SCALE  # byte strings with malformed UTF-8, encoded by spm_encode
SEED = 20240417

WORDS = ("the a of and to in is was for on that with as by at from it he she they we you "
         "once upon time there little girl named lily who loved play outside sun park dog "
         "tokenizer model server request token stream decode encode byte piece vocabulary "
         "hello world quick brown fox jumps over lazy running happily played together "
         "über café naïve façade jalapeño smörgåsbord déjà vu straße").split()
LATIN = "éèêëàâäáãåçñóòôöõøúùûüíìîïýÿæœßÉÀÜÑÇØÅ"
CONTROLS = ["\t", "\n", "\r", "\r\n", "\x01", "\x0b", "\x0c", "\x1b", "\x7f", "\x00", "\x85"]
SPECIAL_TEXT = ["<s>", "</s>", "<unk>", "<pad>", "<0x41>", "▁", "▁▁", "<tool>", "[INST]",
                "[/INST]", "<ctl>", "\ufffd", "\u00a0", "\u3000", "\u200b", "\ufeff"]
ZWJ_EMOJI = ["\U0001F468\u200d\U0001F469\u200d\U0001F467", "\U0001F3F3\ufe0f\u200d\U0001F308",
             "\U0001F469\U0001F3FD\u200d\U0001F4BB", "\u2764\ufe0f", "\U0001F1EB\U0001F1F7",
             "\U0001F1EF\U0001F1F5", "\U0001F44D\U0001F3FF"]


def random_char(rng, low, high):
    return chr(rng.randint(low, high))


def fragment(rng):
    """One piece of a random test string, from a random category."""
    kind = rng.randrange(14)
    if kind <= 2:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
    if kind == 3:
        return "".join(rng.choice(LATIN + "abcdefg ") for _ in range(rng.randint(1, 8)))
    if kind == 4:  # CJK, kana, Hangul
        ranges = [(0x4E00, 0x9FFF), (0x3040, 0x30FF), (0xAC00, 0xD7A3)]
        low, high = rng.choice(ranges)
        return "".join(random_char(rng, low, high) for _ in range(rng.randint(1, 6)))
    if kind == 5:  # emoji: single code points, ZWJ sequences, flags, modifiers
        if rng.random() < 0.5:
            return rng.choice(ZWJ_EMOJI)
        return "".join(random_char(rng, 0x1F300, 0x1FAFF) for _ in range(rng.randint(1, 3)))
    if kind == 6:
        return "".join(rng.choice(CONTROLS) for _ in range(rng.randint(1, 3)))
    if kind == 7:
        return " " * rng.choice([1, 1, 2, 3, 4, 5, 8, 16, 33])
    if kind == 8:
        return str(rng.randint(0, 10 ** rng.randint(1, 12)))
    if kind == 9:
        return rng.choice(SPECIAL_TEXT)
    if kind == 10:
        return "".join(chr(rng.randint(0x21, 0x7E)) for _ in range(rng.randint(1, 8)))
    if kind == 11:  # Arabic, Hebrew, Cyrillic, Greek, Devanagari with combining marks
        ranges = [(0x0600, 0x06FF), (0x05D0, 0x05EA), (0x0410, 0x044F), (0x0391, 0x03C9),
                  (0x0900, 0x097F), (0x0300, 0x036F)]
        low, high = rng.choice(ranges)
        return "".join(random_char(rng, low, high) for _ in range(rng.randint(1, 6)))
    if kind == 12:  # anything in the BMP except surrogates, or beyond
        code = rng.randint(0x80, 0x2FFFF)
        return chr(code) if not 0xD800 <= code <= 0xDFFF else "x"
    return rng.choice(WORDS).capitalize() + rng.choice([".", ",", "!", "?", ":", ";", "'s"])


def random_strings(rng, count):
    strings = ["", " ", "  ", "   a", "a   ", " a b  c ", "\n", "\t\t", "Hello world",
               "Once upon a time", "<s>hi</s>", "<tool>call[INST]x", "  <tool>  ", "▁▁x",
               "a" * 300, " " * 100, "\U0001F600" * 20, "ab<tool><tool>cd", "<ctl>"]
    while len(strings) < count:
        parts = [fragment(rng) for _ in range(rng.randint(1, 10))]
        text = "".join(parts) if rng.random() < 0.5 else " ".join(parts)
        if rng.random() < 0.1:
            text = " " * rng.randint(1, 4) + text
        if rng.random() < 0.1:
            text += " " * rng.randint(1, 4)
        if rng.random() < 0.02:
            text = text * rng.randint(5, 40)  # some long strings
        strings.append(text)
    return strings


def training_corpus(rng):
    """Words, accented Latin, digits, a few CJK and emoji: few enough distinct characters
    for a 300-piece vocabulary, so that random test strings also hit unknown characters."""
    cjk = "".join(chr(0x4E00 + 7 * i) for i in range(40)) + "の日本語한국어"
    lines = []
    for _ in range(3000):
        parts = []
        for _ in range(rng.randint(3, 12)):
            roll = rng.random()
            if roll < 0.7:
                parts.append(rng.choice(WORDS))
            elif roll < 0.8:
                parts.append("".join(rng.choice(LATIN) for _ in range(rng.randint(1, 4))))
            elif roll < 0.9:
                parts.append("".join(rng.choice(cjk) for _ in range(rng.randint(1, 4))))
            elif roll < 0.95:
                parts.append(str(rng.randint(0, 99999)) + rng.choice(".,!?;:()"))
            else:
                parts.append(rng.choice(["\U0001F600", "\u2764", "\U0001F44D"]))
        lines.append(" ".join(parts))
    return "\n".join(lines) + "\n"


# --- protobuf wire format, just enough to turn pieces UNUSED (no python protobuf here) ---

def read_varint(data, pos):
    value, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def write_varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def split_fields(data):
    """[(field number, wire type, raw bytes of the whole field)] of one message."""
    fields, pos = [], 0
    while pos < len(data):
        start = pos
        key, pos = read_varint(data, pos)
        wire = key & 7
        if wire == 0:
            _, pos = read_varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, pos = read_varint(data, pos)
            pos += length
        elif wire == 5:
            pos += 4
        else:
            raise ValueError("unexpected wire type %d" % wire)
        fields.append((key >> 3, wire, data[start:pos]))
    return fields


def with_unused_pieces(model_bytes, should_flip):
    """A copy of a ModelProto whose NORMAL pieces i with should_flip(i, text) are UNUSED."""
    out, index = bytearray(), 0
    for number, wire, raw in split_fields(model_bytes):
        if number != 1 or wire != 2:
            out += raw
            continue
        key_len = len(write_varint((1 << 3) | 2))
        length, body_start = read_varint(raw, key_len)
        body = raw[body_start:]
        sub = split_fields(body)
        text = next((f[2] for f in sub if f[0] == 1), b"")
        types = [read_varint(f[2], 1)[0] for f in sub if f[0] == 3]
        piece_type = types[-1] if types else 1
        if piece_type == 1 and should_flip(index, text):
            body = b"".join(f[2] for f in sub if f[0] != 3) + write_varint(3 << 3) + b"\x05"
        out += write_varint((1 << 3) | 2) + write_varint(len(body)) + body
        index += 1
    return bytes(out)


def train_models(out_dir, rng):
    """Trains the small models; returns [(name, path)]."""
    model_dir = os.path.join(out_dir, "models")
    os.makedirs(model_dir, exist_ok=True)
    corpus = os.path.join(model_dir, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(training_corpus(rng))
    common = dict(input=corpus, normalization_rule_name="identity", num_threads=1,
                  hard_vocab_limit=False, minloglevel=2,
                  max_sentence_length=100000)
    configs = {
        "bpe_small": dict(model_type="bpe", vocab_size=400, user_defined_symbols="<tool>,[INST]",
                          control_symbols="<ctl>"),
        "bpe_small_bytes": dict(model_type="bpe", vocab_size=500, byte_fallback=True,
                                remove_extra_whitespaces=False, split_digits=True),
        "unigram_small": dict(model_type="unigram", vocab_size=400, user_defined_symbols="<tool>",
                              remove_extra_whitespaces=False),
        "unigram_small_bytes": dict(model_type="unigram", vocab_size=500, byte_fallback=True,
                                    add_dummy_prefix=False, control_symbols="<ctl>"),
        "unigram_suffix": dict(model_type="unigram", vocab_size=300,
                               treat_whitespace_as_suffix=True),
    }
    models = []
    for name, options in configs.items():
        prefix = os.path.join(model_dir, name)
        spm.SentencePieceTrainer.train(model_prefix=prefix, **common, **options)
        models.append((name, prefix + ".model"))
    for base in ("bpe_small", "unigram_small"):
        with open(os.path.join(model_dir, base + ".model"), "rb") as f:
            data = f.read()
        path = os.path.join(model_dir, base + "_unused.model")
        with open(path, "wb") as f:
            f.write(with_unused_pieces(data, lambda i, text: len(text) >= 2 and i % 5 == 0))
        models.append((base + "_unused", path))
    return models


def random_id_lists(sp, rng, count):
    """Id lists for decode(): byte runs (valid, cut and invalid UTF-8), control, unk, ▁."""
    size = sp.get_piece_size()
    byte_ids = [i for i in range(size) if sp.is_byte(i)]
    control_ids = [i for i in range(size) if sp.is_control(i)]
    ws_ids = [i for i in range(size) if sp.id_to_piece(i).startswith("▁")]
    byte_id = {int(sp.id_to_piece(i)[3:5], 16): i for i in byte_ids}
    lists = [[], [sp.unk_id()], [sp.unk_id()] * 3] + [[i] for i in control_ids + ws_ids[:5]]
    while len(lists) < count:
        ids = []
        for _ in range(rng.randint(1, 16)):
            roll = rng.random()
            if roll < 0.3 and byte_ids:
                char = chr(rng.choice([0x41, 0xE9, 0x4E2D, 0x1F600, 0x1F468, 0x200D, 0x0]))
                encoded = list(char.encode("utf-8"))
                if rng.random() < 0.3:
                    encoded = encoded[:rng.randint(1, len(encoded))]
                if rng.random() < 0.1:
                    encoded = [rng.randint(0x80, 0xFF)]
                ids += [byte_id[b] for b in encoded]
            elif roll < 0.4 and control_ids:
                ids.append(rng.choice(control_ids))
            elif roll < 0.45:
                ids.append(sp.unk_id())
            elif roll < 0.65 and ws_ids:
                ids.append(rng.choice(ws_ids))
            else:
                ids.append(rng.randrange(size))
        lists.append(ids)
    return lists


def random_raw_strings(rng, count):
    """Byte strings mixing text with malformed UTF-8 (stray continuation bytes, cut
    characters, overlongs, surrogates, > U+10FFFF); no NUL, CR or LF (spm_encode reads lines)."""
    bad = [b"\xff", b"\xfe", b"\x80", b"\xbf", b"\xc3", b"\xe4\xb8", b"\xf0\x9f\x98",
           b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80"]
    raws = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 8)):
            if rng.random() < 0.4:
                parts.append(rng.choice(bad))
            else:
                parts.append(fragment(rng).encode("utf-8"))
        raw = b"".join(parts)
        raws.append(bytes(b for b in raw if b not in (0, 10, 13)))
    return raws


def spm_encode_raw(model_path, raws):
    """Ids of each byte string from Debian's spm_encode (the Python API only takes str)."""
    tool = shutil.which("spm_encode") or "/usr/bin/spm_encode"
    if not os.path.exists(tool):
        sys.exit("spm_oracle.py: spm_encode not found (Debian package sentencepiece)")
    result = subprocess.run([tool, "--model=" + model_path, "--output_format=id"],
                            input=b"\n".join(raws) + b"\n", capture_output=True, check=True)
    lines = result.stdout.decode("ascii").split("\n")[:len(raws)]
    if len(lines) != len(raws):
        sys.exit("spm_oracle.py: spm_encode returned %d lines for %d inputs"
                 % (len(lines), len(raws)))
    return [[int(x) for x in line.split()] for line in lines]


def oracle_for(name, model_path, strings, rng):
    sp = spm.SentencePieceProcessor(model_file=model_path)
    ids = sp.encode(strings)
    decoded = sp.decode(ids)
    id_lists = random_id_lists(sp, rng, NUM_RANDOM_DECODES)
    texts = sp.decode(id_lists)
    raws = random_raw_strings(rng, NUM_RAW_STRINGS)
    raw_ids = spm_encode_raw(model_path, raws)
    return {
        "name": name,
        "model": os.path.abspath(model_path),
        "strings": [{"text": t, "ids": i, "decoded": d} for t, i, d in zip(strings, ids, decoded)],
        "decodes": [{"ids": i, "text": t} for i, t in zip(id_lists, texts)],
        "raw_strings": [{"hex": r.hex(), "ids": i} for r, i in zip(raws, raw_ids)],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shared", required=True, help="the shared/ folder with models")
    parser.add_argument("--out", required=True, help="folder for the JSON files")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(SEED)
    strings = random_strings(rng, NUM_RANDOM_STRINGS)

    mistral_dir = os.path.join(args.shared, "models", "tokenizers", "mistral-7b-v0.1")
    with open(os.path.join(mistral_dir, "encodings.json"), encoding="utf-8") as f:
        reference_texts = [case["text"] for case in json.load(f)["cases"]]
    models = [("mistral", os.path.join(mistral_dir, "tokenizer.model"), reference_texts),
              ("stories260K", os.path.join(args.shared, "models", "stories260K",
                                           "tokenizer.model"), [])]
    models += [(name, path, []) for name, path in train_models(args.out, random.Random(SEED))]

    total = 0
    for name, path, extra in models:
        if not os.path.isfile(path):
            sys.exit("spm_oracle.py: missing tokenizer model %s" % path)
        oracle = oracle_for(name, path, extra + strings, random.Random(SEED + len(name)))
        with open(os.path.join(args.out, name + ".json"), "w", encoding="ascii") as f:
            json.dump(oracle, f, ensure_ascii=True)
        total += len(oracle["strings"])
        print("%s: %d strings, %d id lists, %d malformed byte strings"
              % (name, len(oracle["strings"]), len(oracle["decodes"]), len(oracle["raw_strings"])))
    print("spm_oracle: sentencepiece %s, %d models, %d strings in all"
          % (spm.__version__, len(models), total))


if __name__ == "__main__":
    main()
