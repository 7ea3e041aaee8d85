"""Corpus and tokenizer of the bundled model (models/default): the King James Bible, byte-level BPE.

Reads the Debian `bible-kjv` program's text (`bible -f "Genesis 1:1-Revelation 22:21"`, 31,102 verses,
one `Ge1:1 In the beginning ...` line each), strips the references, groups verses into chapters (one
verse per line), holds out every 50th chapter for validation, trains a GPT-NeoX-style byte-level BPE
with HuggingFace `tokenizers`, and writes into --out:

  tokenizer.json, tokenizer_config.json   the tokenizer (copied into the model folder later)
  train_ids.npy, val_ids.npy             uint16 token streams: each chapter's ids followed by <|endoftext|>
  corpus.json                            counts and the held-out chapter list

Deterministic: the same bible-kjv text gives the same files. Usage (repository root):
  /root/venv/bin/python tools/reference/bundled_data.py --out .bundled_work
"""

import argparse
import json
import re
import subprocess
from pathlib import Path

import numpy as np

EOS = "<|endoftext|>"
PAD = "<|padding|>"
VAL_EVERY = 50  # chapter index i (0-based, canon order) with i % 50 == 25 goes to validation

_REF = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")


def read_chapters(raw_text):
    """bible -f output -> list of (book, chapter, [verse texts]) in canon order."""
    chapters = []
    for line in raw_text.splitlines():
        m = _REF.match(line)
        if not m:
            raise ValueError(f"unexpected line in bible output: {line!r}")
        book, ch, text = m.group(1), int(m.group(2)), m.group(4).strip()
        if not chapters or chapters[-1][0] != book or chapters[-1][1] != ch:
            chapters.append((book, ch, []))
        chapters[-1][2].append(text)
    return chapters


def chapter_text(verses):
    return "\n".join(verses) + "\n"


def train_tokenizer(texts, vocab_size):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS, PAD],  # ids 0 and 1, as in GPT-NeoX
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def tokenizer_config(max_len):
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS,
        "eos_token": EOS,
        "unk_token": EOS,
        "pad_token": PAD,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
    }


def check_round_trips(tok, texts):
    """Every chapter decodes back to itself; a few odd strings (bytes outside the corpus) too."""
    for t in texts:
        ids = tok.encode(t).ids
        assert tok.decode(ids, skip_special_tokens=False) == t, t[:80]
    odd = ["héllo wörld — “quotes” 日本語 🙂", "  two  spaces\tand\ttabs\r\n", "x" * 300, EOS + "And God said"]
    for t in odd:
        assert tok.decode(tok.encode(t).ids, skip_special_tokens=False) == t, t
    assert tok.encode(EOS).ids == [tok.token_to_id(EOS)]


def stream(tok, texts, eos_id):
    ids = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos_id)
    a = np.array(ids, dtype=np.int64)
    assert a.max() < 65536
    return a.astype(np.uint16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".bundled_work")
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--max-len", type=int, default=1024)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    raw = subprocess.run(
        ["bible", "-f", "Genesis 1:1-Revelation 22:21"], check=True, capture_output=True, text=True
    ).stdout
    chapters = read_chapters(raw)
    n_verses = sum(len(v) for _, _, v in chapters)
    assert len(chapters) == 1189 and n_verses == 31102, (len(chapters), n_verses)
    train = [c for i, c in enumerate(chapters) if i % VAL_EVERY != VAL_EVERY // 2]
    val = [c for i, c in enumerate(chapters) if i % VAL_EVERY == VAL_EVERY // 2]
    train_texts = [chapter_text(v) for _, _, v in train]
    val_texts = [chapter_text(v) for _, _, v in val]

    tok = train_tokenizer(train_texts, args.vocab_size)
    assert tok.get_vocab_size() == args.vocab_size, tok.get_vocab_size()
    check_round_trips(tok, train_texts + val_texts)
    eos_id = tok.token_to_id(EOS)
    assert eos_id == 0

    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(args.max_len), indent=2) + "\n")
    train_ids, val_ids = stream(tok, train_texts, eos_id), stream(tok, val_texts, eos_id)
    np.save(out / "train_ids.npy", train_ids)
    np.save(out / "val_ids.npy", val_ids)
    info = {
        "source": 'Debian bible-kjv: bible -f "Genesis 1:1-Revelation 22:21"',
        "chapters": len(chapters),
        "verses": n_verses,
        "train_chapters": len(train),
        "val_chapters": [f"{b} {c}" for b, c, _ in val],
        "train_verses": sum(len(v) for _, _, v in train),
        "val_verses": sum(len(v) for _, _, v in val),
        "train_chars": sum(map(len, train_texts)),
        "val_chars": sum(map(len, val_texts)),
        "train_tokens": int(train_ids.size),
        "val_tokens": int(val_ids.size),
        "vocab_size": tok.get_vocab_size(),
        "eos_token_id": eos_id,
    }
    (out / "corpus.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps({k: v for k, v in info.items() if k != "val_chapters"}, indent=2))
    print("val chapters:", ", ".join(info["val_chapters"]))


if __name__ == "__main__":
    main()
