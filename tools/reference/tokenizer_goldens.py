#!/usr/bin/env python3
"""Reference data for moecel's tokenizer, produced by HuggingFace `tokenizers` (run with /root/venv/bin/python).

  tokenizer_goldens.py goldens   writes tests/golden/tokenizer/: a stress + prose corpus, the ids and decodes of
                                 both real tokenizers and of small synthetic tokenizers (options the real files do
                                 not use), and Unicode class / normalization digests over every code point.
  tokenizer_goldens.py tables    writes src/tokenizer/unicode_tables.cpp: where HF's Unicode data (Oniguruma's
                                 categories, the Unicode 9 normalizer) differs from the installed utf8proc.
"""
import argparse
import ctypes
import ctypes.util
import json
import os
import random
import shutil
import subprocess
import sys
import unicodedata

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data", "tokenizers")
OUT = os.path.join(ROOT, "tests", "golden", "tokenizer")

# Code points probed by the class and normalization goldens: everything up to the last assigned plane-3 block and
# the plane-14 tags/variation selectors (planes 4-13 are unassigned).
PROBE_RANGES = [(0, 0x323B0), (0xE0000, 0xE1000)]
PROBE_BLOCK = 1024
PROBE_MARKS = ["\u0301", "\u0316", "\u05b0", "\u0334", "\u093c"]


def probe_cps():
    for lo, hi in PROBE_RANGES:
        for cp in range(lo, hi):
            if not 0xD800 <= cp < 0xE000:
                yield cp


def probe_block_text(block):
    """Normalization probes for the code points of one block: each alone, after a base letter, and around marks of
    different combining classes, separated by newlines (a normalization boundary)."""
    segs = []
    for cp in range(block * PROBE_BLOCK, (block + 1) * PROBE_BLOCK):
        if 0xD800 <= cp < 0xE000:
            continue
        ch = chr(cp)
        segs.append(ch)
        segs.append("q" + ch)
        for m in PROBE_MARKS:
            segs.append("q" + ch + m)
            segs.append("q" + m + ch)
    return "\n".join(segs)


def probe_blocks():
    blocks = []
    for lo, hi in PROBE_RANGES:
        blocks.extend(range(lo // PROBE_BLOCK, (hi + PROBE_BLOCK - 1) // PROBE_BLOCK))
    return blocks


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def to_ranges(cps):
    out = []
    for cp in sorted(cps):
        if out and out[-1][1] == cp:
            out[-1][1] = cp + 1
        else:
            out.append([cp, cp + 1])
    return out


def onig_class(pattern):
    """The set of code points that HF's regex engine (Oniguruma) matches with a one-character class."""
    cps = list(probe_cps())
    text = "".join(chr(c) for c in cps)
    split = pre_tokenizers.Split(Regex(pattern), behavior="removed")
    kept = bytearray(len(cps))
    for _, (a, b) in split.pre_tokenize_str(text):
        for i in range(a, b):
            kept[i] = 1
    return {cps[i] for i in range(len(cps)) if not kept[i]}


# ---------------------------------------------------------------------------------------------------- tables


class Utf8proc:
    STABLE, COMPAT, COMPOSE, DECOMPOSE = 1 << 1, 1 << 2, 1 << 3, 1 << 4

    def __init__(self):
        path = ctypes.util.find_library("utf8proc") or "libutf8proc.so.2"
        self.lib = ctypes.CDLL(path)
        self.libc = ctypes.CDLL(ctypes.util.find_library("c"))
        self.lib.utf8proc_category.restype = ctypes.c_int
        self.lib.utf8proc_category.argtypes = [ctypes.c_int32]
        self.lib.utf8proc_map.restype = ctypes.c_ssize_t
        self.lib.utf8proc_map.argtypes = [ctypes.c_char_p, ctypes.c_ssize_t, ctypes.POINTER(ctypes.c_void_p),
                                          ctypes.c_int]
        self.lib.utf8proc_unicode_version.restype = ctypes.c_char_p
        self.libc.free.argtypes = [ctypes.c_void_p]

    def version(self):
        return self.lib.utf8proc_unicode_version().decode()

    def category(self, cp):
        return self.lib.utf8proc_category(cp)

    def normalize(self, text, form):
        opts = {"NFC": self.COMPOSE, "NFD": self.DECOMPOSE, "NFKC": self.COMPOSE | self.COMPAT,
                "NFKD": self.DECOMPOSE | self.COMPAT}[form] | self.STABLE
        data = text.encode("utf-8")
        out = ctypes.c_void_p()
        n = self.lib.utf8proc_map(data, len(data), ctypes.byref(out), opts)
        if n < 0:
            raise RuntimeError("utf8proc_map failed")
        res = ctypes.string_at(out, n).decode("utf-8")
        self.libc.free(out)
        return res


HF_FORMS = {"NFC": normalizers.NFC(), "NFD": normalizers.NFD(), "NFKC": normalizers.NFKC(),
            "NFKD": normalizers.NFKD()}


def normalization_passthrough(u8):
    """Code points that HF's normalizer (Unicode 9 data) leaves alone but utf8proc decomposes, reorders or composes:
    the probes of each code point are compared one by one."""
    found = set()
    for block in probe_blocks():
        text = probe_block_text(block)
        inputs = text.split("\n")
        cps = [c for c in range(block * PROBE_BLOCK, (block + 1) * PROBE_BLOCK) if not 0xD800 <= c < 0xE000]
        per_cp = 2 + 2 * len(PROBE_MARKS)
        for form, hf in HF_FORMS.items():
            a = hf.normalize_str(text).split("\n")
            b = u8.normalize(text, form).split("\n")
            assert len(a) == len(b) == len(inputs)
            for i, (x, y) in enumerate(zip(a, b)):
                if x != y:
                    found.add(cps[i // per_cp])
    return found


def write_tables(path):
    u8 = Utf8proc()
    letters, numbers, unassigned = (onig_class(p) for p in (r"\p{L}", r"\p{N}", r"\p{Cn}"))
    u8_letters = {c for c in probe_cps() if 1 <= u8.category(c) <= 5}
    u8_numbers = {c for c in probe_cps() if 9 <= u8.category(c) <= 11}
    if u8_letters - letters or u8_numbers - numbers:
        sys.exit("utf8proc classifies code points as L/N that Oniguruma does not: tables cannot express this")
    passthrough = normalization_passthrough(u8)
    # A new composite (e.g. U+11938 = U+11935 U+11930) shows up in the probes, its parts do not: they would still be
    # composed. Every such composition added after Unicode 9 is made of characters as new as itself.
    for cp in sorted(passthrough):
        parts = u8.normalize(chr(cp), "NFD")
        if parts != chr(cp):
            passthrough |= {ord(c) for c in parts}
    # Characters newer than this utf8proc but known to Oniguruma are normalization-inert in HF (Unicode 9) too; listing
    # them keeps moecel exact when it is built against a newer utf8proc.
    newer = {c for c in probe_cps() if c not in unassigned and u8.category(c) == 0}
    passthrough |= newer

    def table(name, cps, what):
        rows = to_ranges(cps)
        lines = [f"// {what} ({len(cps)} code points in {len(rows)} ranges).",
                 f"extern const CodepointRange {name}[] = {{"]
        for i in range(0, len(rows), 4):
            lines.append("    " + " ".join(f"{{0x{a:X}, 0x{b:X}}}," for a, b in rows[i:i + 4]))
        lines.append("};")
        lines.append(f"extern const size_t {name}Size = {len(rows)};")
        return "\n".join(lines)

    parts = [
        "// Unicode data where HuggingFace tokenizers differs from utf8proc " + u8.version() + ": Oniguruma's newer",
        "// letter and number classes, and the code points that HF's Unicode 9 normalizer leaves untouched.",
        "// Generated by tools/reference/tokenizer_goldens.py tables; do not edit by hand.",
        "#include <cstddef>", "", '#include "tokenizer/unicode.h"', "", "namespace moecel::unicode {", "", "// clang-format off", "",
        table("kExtraLetters", letters - u8_letters, "Letters (regex \\p{L}) that utf8proc does not classify as L"), "",
        table("kExtraNumbers", numbers - u8_numbers, "Numbers (regex \\p{N}) that utf8proc does not classify as N"), "",
        table("kNormalizationPassthrough", passthrough, "Code points that HF's normalizer passes through unchanged"),
        "", "// clang-format on", "", "}  // namespace moecel::unicode", ""]
    src = "\n".join(parts)
    with open(path, "w", encoding="utf-8") as f:
        f.write(src)
    print(f"wrote {path}: +L {len(letters - u8_letters)}, +N {len(numbers - u8_numbers)}, "
          f"passthrough {len(passthrough)}")


# ---------------------------------------------------------------------------------------------------- corpus

PROSE_BOOKS = ["Genesis 1:1-11:32", "Exodus 1:1-12:51", "Ruth 1:1-4:22", "Psalms 1:1-30:12", "Ecclesiastes 1:1-12:14",
               "Matthew 5:1-7:29", "Luke 1:1-6:49", "John 1:1-6:71", "Acts 27:1-28:31", "1 Corinthians 13:1-13:13"]


def kjv_prose():
    if not shutil.which("bible"):
        sys.exit("the prose corpus needs the King James Bible: apt-get install bible-kjv")
    text = ""
    for ref in PROSE_BOOKS:
        text += subprocess.run(["bible", "-f", ref], check=True, capture_output=True, text=True).stdout
    # Records of about 4 KB so that a mismatch points at a small piece of text.
    records, cur = [], ""
    for line in text.splitlines(keepends=True):
        cur += line
        if len(cur) >= 4000:
            records.append(cur)
            cur = ""
    if cur:
        records.append(cur)
    return records


WHITESPACE = [" ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2009", "\u0085", "\u2028", "\x0b", "\x0c"]

HANDWRITTEN = [
    "", " ", "a", "Hello world", "Hello, world!", "hello  world", "  leading", "trailing  ", "  both  ",
    "It's John's book; they're here, we've gone, I'm sure, you'll see, he'd know.",
    "IT'S JOHN'S BOOK; THEY'RE HERE, WE'VE GONE, I'M SURE, YOU'LL SEE, HE'D KNOW.",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'Ve '\u017f 'K 'x ''s '''", "rock 'n' roll, \u2019tis \u201cquoted\u201d \u2018single\u2019",
    "The year 2024 had 365 days; 3.14159 and 1,000,000 and 0x1F and 1e-9 and -42 and +7.",
    "1234567890 12345678901234567890 \u0661\u0662\u0663\u0664\u0665 \u096a\u096b\u096c \u3007\u4e00\u4e8c\u4e09 \u2160\u2161\u2162\u2163 \u2460\u2461\u2462 \u00bd \u00be \u00b2\u00b3",
    "https://www.example.com/path/to/page?query=1&b=two#frag http://localhost:8080/ ftp://x.y/z",
    "user.name+tag@example.co.uk <mailto:a@b.c> @handle #hashtag $100 \u20ac50 \u00a33 \u00a51000 \u20b920",
    "def f(x):\n    return x**2  # square\n\nprint(f(3))\n",
    "int main(int argc, char** argv) {\n\tstd::vector<int> v{1, 2, 3};\n\treturn v.size() > 2 ? 0 : 1;\n}\n",
    '{"key": "value", "list": [1, 2.5, null, true], "nested": {"a": "b\\n"}}',
    "<html><body class=\"x\"><p>Text&nbsp;&amp;&lt;tag&gt;</p></body></html>",
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%smith%';",
    "if (a && b || !c) { x += 1; y -= 2; z *= 3; w /= 4; } // done",
    "    indented four\n        indented eight\n\t\ttabs\n",
    "line1\nline2\r\nline3\rline4\n\n\nline7\r\n\r\n",
    "x\n\n\ny", "x \n y", "x\t\n\ty", " \n ", "\n", "\r\n", "\n\n\n\n\n", "\t\t\t", "a\u00a0b", "a\u3000b",
    "<|endoftext|>", "<|endoftext|>Hello<|endoftext|>", "text<|endoftext|>text", " <|endoftext|> ",
    "<|endoftext|><|endoftext|>", "<|endoftext", "<|endoftext|", "<<|endoftext|>>", "<|im_start|>",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nLet me think.\n</think>\n\nThe answer is 42.", "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>", "<|padding|>", "|||IP_ADDRESS|||",
    "|||EMAIL_ADDRESS||| and |||PHONE_NUMBER|||", "a|||IP_ADDRESS|||b", "||||IP_ADDRESS||||",
    "<|box_start|>(1,2)<|box_end|>", "<|im_end|><|im_start|>", "  <|endoftext|>  x", "a  <|im_end|>  b",
    "\u00dcn\u00efc\u00f6d\u00e9 \u00e7\u00e5f\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c5ngstr\u00f6m fa\u00e7ade jalape\u00f1o Stra\u00dfe \u00c6\u00d8\u00c5 \u00e6\u00f8\u00e5 \u0152uvre \u0153uvre",
    "e\u0301 a\u0300 o\u0308 n\u0303 c\u0327", "\u00e9 vs e\u0301", "\u1e9b\u0323", "q\u0307\u0323", "\u0041\u030a\u212b",
    "\u1100\u1161\u11a8 \uac00 \u1100\u1161", "\ufb01 \ufb02 \u2126 \u212a \u2163", "\u0958\u0959 \u09cb \u0b4b",
    "a\u0301\u0301\u0301\u0301\u0301\u0301\u0301\u0301", "\u0301leading mark",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339O\u0342\u030c\u030c\u0358\u0328\u0335\u0339\u033b\u031d\u0333",
    "\u0898a\u0301 e\u0898\u0301 \U00011935\U00011930 \U00011938 \u1df6x\u0301 \U000105C9 \U00010D40\U00010D41",
    "\U0001F600\U0001F603\U0001F604 \U0001F44D\U0001F3FD \U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466",
    "\U0001F3F3\uFE0F\u200D\U0001F308 \U0001F1FA\U0001F1F8\U0001F1EF\U0001F1F5 #\uFE0F\u20E3 1\uFE0F\u20E3 \u2764\uFE0F \U0001F469\U0001F3FE\u200D\U0001F4BB",
    "\U0001F9D1\U0001F3FB\u200D\U0001F91D\u200D\U0001F9D1\U0001F3FF \U0001F44B\U0001F3FB\U0001F44B\U0001F3FC\U0001F44B\U0001F3FD\U0001F44B\U0001F3FE\U0001F44B\U0001F3FF",
    "emoji\U0001F600word \U0001F600 \U0001F600\U0001F600 x\U0001F3FDy \U0001FAE0\U0001FAE8\U0001FAAD",
    "\u4e2d\u6587\u6587\u672c\uff0c\u5305\u542b\u6807\u70b9\u7b26\u53f7\u3002\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u3072\u3089\u304c\u306a\u3068\u30ab\u30bf\u30ab\u30ca\u3002\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4.",
    "\u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442 \u2014 \u00ab\u043a\u0430\u0432\u044b\u0447\u043a\u0438\u00bb. \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac. \u0423\u043a\u0440\u0430\u0457\u043d\u0441\u044c\u043a\u0430.",
    "\u05e9\u05b8\u05c1\u05dc\u05d5\u05b9\u05dd. \u0645\u064e\u0631\u0652\u062d\u064e\u0628\u064b\u0627 \u0628\u0650\u0643\u064f\u0645\u0652. \u0641\u0627\u0631\u0633\u06cc: \u0633\u0644\u0627\u0645.",
    "\u0939\u093f\u0928\u094d\u0926\u0940 \u092a\u093e\u0920\u0964 \u09ac\u09be\u0982\u09b2\u09be\u0964 \u0a2a\u0a70\u0a1c\u0a3e\u0a2c\u0a40\u0964 \u0ba4\u0bae\u0bbf\u0bb4\u0bcd. \u0c24\u0c46\u0c32\u0c41\u0c17\u0c41. \u0d2e\u0d32\u0d2f\u0d3e\u0d33\u0d02. \u0dc3\u0dd2\u0d82\u0dc4\u0dbd.",
    "\u0e44\u0e17\u0e22 \u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22 \u0ea5\u0eb2\u0ea7 \u1781\u17d2\u1798\u17c2\u179a \u1019\u103c\u1014\u103a\u1019\u102c \u10e5\u10d0\u10e0\u10d7\u10e3\u10da\u10d8 \u0540\u0561\u0575\u0565\u0580\u0565\u0576 \u12a0\u121b\u122d\u129b \u13e3\u13b3\u13a9 \u1403\u14c4\u1483\u144e\u1450\u1466 \u182e\u1823\u1829\u182d\u1823\u182f \u0f40\u0f0b\u0f41",
    "\U00010330\U00010331\U00010332 \U0001D400\U0001D401 \U0001D7CE\U0001D7CF \U00020000\U0002A6D6 \U000E0041\U000E0042",
    "mixed\u4e2d\u6587and English\u6df7\u5408123\u6570\u5b57", "\u03b1\u03b2\u03b3123\u03b4\u03b5\u03b6",
    "abc\uff11\uff12\uff13\uff44\uff45\uff46", "\uff46\uff55\uff4c\uff4c\uff57\uff49\uff44\uff54\uff48\u3000\uff53\uff50\uff41\uff43\uff45",
    "\u180e\u200b\u200c\u200d\u2060\ufeff\u00ad", "\x00\x01\x02\x1b[0m\x7f", "tab\tseparated\tvalues\t",
    "\u202e reversed \u202c \u200f rtl \u200e", "\U0001D11E\U0001D160 music", "\u0300\u0301 marks alone",
    "...!!!???---___===+++***", "a.b,c;d:e!f?g", "(parens) [brackets] {braces} <angles>", "~`^|\\/",
    "\u201csmart quotes\u201d \u2018apostrophes\u2019 \u2013 en dash \u2014 em dash \u2026 ellipsis \u2022 bullet",
    "new\u2028line\u2029para", "CamelCaseWordsAndXMLHttpRequest snake_case_words kebab-case-words",
    "a" * 100, "ab" * 80, " " * 100, "\n" * 50, "1" * 100, "!" * 70, "'" * 9 + "s", " '" * 20,
]


def whitespace_cases():
    out = []
    for n in range(1, 41):
        out += [" " * n, "a" + " " * n + "b", " " * n + "x", "x" + " " * n, "\n" + " " * n + "x",
                "a" + " " * n + "\n" + "b", "." + " " * n + "1"]
    for ws in WHITESPACE:
        for n in (1, 2, 3, 5):
            out += [ws * n, "a" + ws * n + "b", ws * n + "x", "x" + ws * n, "a " + ws * n + " b", "1" + ws * n + "2",
                    "." + ws * n + ","]
    rng = random.Random(7)
    for _ in range(150):
        out.append("w" + "".join(rng.choice(WHITESPACE) for _ in range(rng.randint(1, 9))) +
                   rng.choice(["v", "1", ".", ""]))
    return out


def extra_ranges():
    """Ranges from unicode_tables.cpp: code points only HF's newer Unicode data knows, and normalization exceptions."""
    import re
    src = open(os.path.join(ROOT, "src", "tokenizer", "unicode_tables.cpp"), encoding="utf-8").read()
    out = {}
    for name in ("kExtraLetters", "kExtraNumbers", "kNormalizationPassthrough"):
        body = src[src.index(name + "[] = {"):]
        body = body[:body.index("};")]
        out[name] = [(int(a, 16), int(b, 16)) for a, b in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+)\}", body)]
    return out


def script_samples():
    """For every 128-code-point window with assigned characters: a few words made of them."""
    out = []
    newer = {c for rs in extra_ranges().values() for a, b in rs for c in range(a, b)}
    rng = random.Random(11)
    for base in range(0x80, 0x323B0, 128):
        cps = [c for c in range(base, base + 128) if not 0xD800 <= c < 0xE000 and
               (unicodedata.category(chr(c)) not in ("Cn", "Cs", "Co") or c in newer)]
        if not cps:
            continue
        pick = cps if len(cps) <= 24 else sorted(rng.sample(cps, 24))
        words, k = [], 0
        while k < len(pick):
            n = rng.randint(1, 6)
            words.append("".join(chr(c) for c in pick[k:k + n]))
            k += n
        text = words[0]
        for w in words[1:]:
            text += rng.choice([" ", " ", " ", ", ", ". ", "\n", "1", "-", "'s "]) + w
        out.append(text)
    return out


def random_strings():
    pool = (list("abcXYZ019 '\t\n\r.,!?-_") +
            ["\u00a0", "\u3000", "\u0085", "\u2028", "\u00e9", "e\u0301", "\u4e2d", "\u0416", "\u05d0", "\u0627",
             "\u0915\u094d", "\U0001F600", "\U0001F3FD", "\u200d", "\u0301", "\u0316", "\u0663", "\u2167", "\u00bd",
             "\u180e", "\ufb01", "<|endoftext|>", "<|im_end|>", "<think>", "  ", "|||IP_ADDRESS|||", "\U000105C0",
             "\U00010D40", "\u0898", "\U00011938", "\u1100", "\u1161", "\u11a8"])
    rng = random.Random(1234)
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 60))) for _ in range(400)]


def long_words():
    rng = random.Random(99)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["a" * 5000, "ab" * 2000, "".join(rng.choice(letters) for _ in range(3000)), "9" * 4000,
            "\U0001F600" * 300, "\u4e2d\u6587" * 800, "x" + " " * 3000 + "y", "\n" * 2000,
            "https://example.com/" + "/".join("".join(rng.choice(letters) for _ in range(8)) for _ in range(200)),
            "".join(rng.choice(letters + "0123456789") for _ in range(2500)), "\u00e9" * 1500, "-=" * 1000]


def stress_corpus():
    named = []
    for group, items in (("handwritten", HANDWRITTEN), ("whitespace", whitespace_cases()),
                         ("scripts", script_samples()), ("random", random_strings()), ("long", long_words())):
        named += [(f"{group}/{i}", t) for i, t in enumerate(items)]
    return named


# ---------------------------------------------------------------------------------------------------- goldens


def dump_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")


def beyond_pcre2(text):
    """Whether the text has characters that PCRE2 10.42 (Unicode 14, like Python's unicodedata here) classifies
    differently from HF's Oniguruma: U+180E and anything assigned after Unicode 14. Split patterns that moecel runs
    through PCRE2 are exact only without them."""
    return any(c == "\u180e" or unicodedata.category(c) == "Cn" for c in text)


def expected(tok, texts):
    """Per text: ids, ids with the post-processor (when they differ), and the decodes when they differ."""
    out = []
    for text in texts:
        try:
            ids = tok.encode(text, add_special_tokens=False).ids
        except BaseException as err:  # pyo3 panics (e.g. overlapping rstrip matches) are not Exceptions
            out.append({"hf_error": str(err)})
            continue
        rec = {"ids": ids}
        if beyond_pcre2(text):
            rec["beyond_pcre2"] = True
        with_special = tok.encode(text, add_special_tokens=True).ids
        if with_special != ids:
            rec["ids_special"] = with_special
        dec = tok.decode(ids, skip_special_tokens=False)
        if dec != text:
            rec["decoded"] = dec
        dec_skip = tok.decode(ids, skip_special_tokens=True)
        if dec_skip != dec:
            rec["decoded_skip"] = dec_skip
        out.append(rec)
    return out


def decode_cases(tok, seed):
    """Id sequences that are not encodings: random ids (split characters, special tokens, ids without a token)."""
    rng = random.Random(seed)
    n = tok.get_vocab_size(True)
    cases = []
    for k in range(250):
        ids = [rng.randrange(n) for _ in range(rng.randint(1, 12))]
        if k % 5 == 0:
            ids.append(n + rng.randrange(1000))  # no such token
        cases.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                      "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
    return cases


def write_tokenizer_goldens(name, tok, texts, meta, seed):
    recs = expected(tok, texts)
    dump_jsonl(os.path.join(OUT, f"{name}.jsonl"), [meta] + recs)
    dump_jsonl(os.path.join(OUT, f"{name}_decode.jsonl"), decode_cases(tok, seed))
    errors = sum("hf_error" in r for r in recs)
    print(f"{name}: {len(recs)} records, {sum(len(r.get('ids', [])) for r in recs)} ids, {errors} HF errors")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, cs))


def base_bpe(prose):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<s>", "</s>", "<unk>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(prose, trainer=trainer)
    return json.loads(tok.to_str())["model"]


def added(id_, content, special=False, **kw):
    d = {"id": id_, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": not special, "special": special}
    d.update(kw)
    return d


def drop_bytes(m, byte_values):
    """The model without the characters of some bytes (and every token and merge that contains them)."""
    chars = {chr(bytes_to_unicode()[b]) for b in byte_values}
    vocab = {t: i for t, i in m["vocab"].items() if not (set(t) & chars)}
    merges = [mm for mm in m["merges"] if not (set("".join(mm)) & chars)]
    return dict(m, vocab=vocab, merges=merges)


def template(items, specials):
    single = [{"Sequence": {"id": "A", "type_id": 0}} if t == "$A" else {"SpecialToken": {"id": t, "type_id": 0}}
              for t in items]
    return {"type": "TemplateProcessing", "single": single,
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {t: {"id": t, "ids": [i], "tokens": [t]} for t, i in specials.items()}}


LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}


def synthetic_tokenizers(prose):
    """Small tokenizers for what the real files do not use: lstrip/rstrip/single_word, normalized added tokens under
    NFKC, prefix spaces, ignore_merges, missing byte characters (unk, fuse_unk, byte fallback), split behaviours,
    Llama 3's regex, PCRE2 patterns and bos/eos post-processors."""
    model = base_bpe(prose)
    vocab = model["vocab"]
    nxt = max(vocab.values()) + 1
    s, e, u = vocab["<s>"], vocab["</s>"], vocab["<unk>"]
    out = {}

    # A: NFKC (HF's Strip normalizer crashes next to normalized added tokens), ByteLevel with prefix space, added-token options, <s> $A </s>, merges as "a b" strings.
    toks = [added(s, "<s>", True), added(e, "</s>", True), added(u, "<unk>", True), added(nxt, "[L]", lstrip=True),
            added(nxt + 1, "[R]", rstrip=True), added(nxt + 2, "[LR]", lstrip=True, rstrip=True),
            added(nxt + 3, "word", single_word=True), added(nxt + 4, "\ufb01x"),
            added(nxt + 5, "\uff2e\uff4f\uff52\uff4d", normalized=False), added(nxt + 6, "<mask>", True, lstrip=True),
            added(nxt + 7, "  "), added(nxt + 8, "wo"), added(nxt + 9, "\u00e9a", single_word=True, rstrip=True)]
    out["syn_a"] = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": toks,
        "normalizer": {"type": "NFKC"},
        "pre_tokenizer": BYTE_LEVEL,
        "post_processor": template(["<s>", "$A", "</s>"], {"<s>": s, "</s>": e}),
        "decoder": BYTE_LEVEL,
        "model": dict(model, merges=[" ".join(m) if isinstance(m, list) else m for m in model["merges"]]),
    }

    # B: Llama 3 regex, ignore_merges, some byte characters missing with a fused <unk>, NFKD + Strip, bos via a
    # Sequence post-processor.
    mb = drop_bytes(model, list(range(0xF0, 0xF5)) + [0xE2])
    mb.update(ignore_merges=True, unk_token="<unk>", fuse_unk=True)
    out["syn_b"] = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(s, "<s>", True), added(u, "<unk>", True), added(nxt, "<|begin_of_text|>", True)],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFKD"}, {"type": "Strip", "strip_left": False, "strip_right": True}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "Sequence", "processors": [
            dict(BYTE_LEVEL, trim_offsets=False), template(["<|begin_of_text|>", "$A"], {"<|begin_of_text|>": nxt})]},
        "decoder": BYTE_LEVEL,
        "model": mb,
    }

    # C: split behaviours and PCRE2 patterns, byte fallback for some missing bytes (the others are dropped, no unk),
    # Roberta-style <s> ... </s>, Replace and Prepend normalizers, a normalized special token.
    mc = drop_bytes(model, list(range(0x80, 0x90)) + [0xE2, 0xE4])
    fallback = set()
    for b in list(range(0x80, 0x88)) + [0xE2]:
        fallback |= set(chr(bytes_to_unicode()[b]).encode("utf-8"))
    v = dict(mc["vocab"])
    k = max(v.values()) + 1
    for b in sorted(fallback):
        v[f"<0x{b:02X}>"] = k
        k += 1
    mc.update(vocab=v, byte_fallback=True)
    out["syn_c"] = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(s, "<s>", True), added(e, "</s>", True), added(k, "[SEP]", True, normalized=True)],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Replace", "pattern": {"String": "``"}, "content": "\""}, {"type": "Prepend", "prepend": "~"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"\d+"}, "behavior": "MergedWithPrevious", "invert": False},
            {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext", "invert": False},
            {"type": "Split", "pattern": {"Regex": r"[!?]+|\p{P}"}, "behavior": "Contiguous", "invert": False},
            {"type": "Split", "pattern": {"Regex": r"[aeiou]"}, "behavior": "Contiguous", "invert": True},
            {"type": "Split", "pattern": {"String": "zz"}, "behavior": "Removed", "invert": False},
            BYTE_LEVEL]},
        "post_processor": {"type": "RobertaProcessing", "sep": ["</s>", e], "cls": ["<s>", s], "trim_offsets": True,
                           "add_prefix_space": True},
        "decoder": BYTE_LEVEL,
        "model": mc,
    }
    return out


SYNTHETIC_TEXTS = [
    "[L]x  [L]y [L]", "a [R]   b [R]\n\nc", "  [LR]  mid  [LR]  ", "word words sword word_ a word. (word)",
    "\ufb01x fix \ufb01xed FIX", "\uff2e\uff4f\uff52\uff4d Norm norm", "<mask> hi  <mask>  x", "wo word wow two",
    "\u00e9a \u00e9ab x\u00e9a \u00e9a, \u00e9a  b", "<s>hello</s> <s> </s>", "<unk>", "<|begin_of_text|>x",
    "[SEP]x[SEP] [SEP]", "``quoted'' text ``", "~tilde", "123abc456 7 89!!!?? yes. no, ok; fine:",
    "aeiou xyz bcd", "zzz fizz buzz", "trailing spaces   ", "   leading", "[R]  [R]", "[R]  \u3000x",
    "\u2013 dash \u2014 dash \u20ac euro \u4e2d\u6587 \U0001F600 \u0080\u0085",
]


def write_goldens():
    import tokenizers
    os.makedirs(OUT, exist_ok=True)
    prose = kjv_prose()
    stress = stress_corpus()
    corpus = stress + [(f"prose/{i}", t) for i, t in enumerate(prose)]
    dump_jsonl(os.path.join(OUT, "corpus.jsonl"), [{"name": n, "text": t} for n, t in corpus])
    texts = [t for _, t in corpus]
    for seed, name in enumerate(("olmoe", "qwen3")):
        tok = Tokenizer.from_file(os.path.join(SHARED, name, "tokenizer.json"))
        meta = {"tokenizer": f"{name}/tokenizer.json", "corpus": "corpus.jsonl", "tokenizers": tokenizers.__version__}
        write_tokenizer_goldens(name, tok, texts, meta, seed)

    syn_texts = (SYNTHETIC_TEXTS + [t for n, t in stress if n.startswith("handwritten")] +
                 [t for n, t in stress if n.startswith("random")][:150] + [prose[0][:1500]])
    dump_jsonl(os.path.join(OUT, "syn_corpus.jsonl"), [{"name": f"syn/{i}", "text": t} for i, t in enumerate(syn_texts)])
    for seed, (name, spec) in enumerate(synthetic_tokenizers(prose).items()):
        path = os.path.join(OUT, f"{name}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(spec, f, ensure_ascii=False, separators=(",", ":"))
        tok = Tokenizer.from_file(path)
        meta = {"tokenizer": f"{name}.json", "corpus": "syn_corpus.jsonl", "tokenizers": tokenizers.__version__}
        write_tokenizer_goldens(name, tok, syn_texts, meta, 100 + seed)

    # Unicode: HF's regex classes over all code points, and digests of its normalizers over per-code-point probes.
    classes = {name: to_ranges(onig_class(p)) for name, p in (("L", r"\p{L}"), ("N", r"\p{N}"), ("S", r"\s"))}
    norm = {"block": PROBE_BLOCK, "ranges": PROBE_RANGES, "marks": PROBE_MARKS, "base": "q"}
    for form, hf in HF_FORMS.items():
        norm[form] = {str(b): f"{fnv1a64(hf.normalize_str(probe_block_text(b)).encode('utf-8')):016x}"
                      for b in probe_blocks()}
    with open(os.path.join(OUT, "unicode.json"), "w", encoding="utf-8") as f:
        json.dump({"classes": classes, "normalization": norm}, f, separators=(",", ":"))
    total = sum(os.path.getsize(os.path.join(OUT, p)) for p in os.listdir(OUT))
    print(f"goldens: {total / 1e6:.2f} MB in {OUT}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["goldens", "tables"], nargs="?", default="goldens")
    args = ap.parse_args()
    if args.what == "tables":
        write_tables(os.path.join(ROOT, "src", "tokenizer", "unicode_tables.cpp"))
    else:
        write_goldens()


if __name__ == "__main__":
    main()
