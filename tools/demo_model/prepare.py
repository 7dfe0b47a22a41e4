#!/usr/bin/python3
"""Prepares the demo model's data from Debian's fortune cookie files: checks the inputs against
inputs.txt, cleans and splits the fortunes, trains a byte-level BPE tokenizer on the training
part and writes the token streams that train.py reads.

    apt-get install fortunes fortunes-min python3-regex
    /usr/bin/python3 tools/demo_model/prepare.py --out /tmp/demo-data

Writes into --out: tokenizer.json, train.bin, valid.bin and heldout.bin (little-endian uint16
token ids: each fortune is <|endoftext|> then its tokens, and one <|endoftext|> ends the stream;
train.py picks its checkpoint by valid.bin and reports the perplexity of heldout.bin),
prompts.json (the golden prompts and tokenizer cases with their ids) and corpus.json (counts).
--write-inputs rewrites inputs.txt from the installed files instead of checking against it.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from array import array
from collections import Counter

sys.dont_write_bytecode = True  # no __pycache__ beside the scripts in the repository
import byte_bpe

HERE = os.path.dirname(os.path.abspath(__file__))
INPUTS = os.path.join(HERE, "inputs.txt")
FORTUNE_DIR = "/usr/share/games/fortunes"

# Every collection of the two packages, with the reason for each one left out. Both packages'
# debian/copyright puts them under the BSD licence of fortune-mod (the same text in each).
COLLECTIONS = {
    "fortunes": [
        "art", "computers", "cookie", "debian", "definitions", "disclaimer", "drugs", "education",
        "ethnic", "food", "goedel", "humorists", "kids", "knghtbrd", "law", "linux", "linuxcookie",
        "love", "magic", "medicine", "men-women", "miscellaneous", "news", "paradoxum", "people",
        "perl", "pets", "platitudes", "politics", "pratchett", "science", "sports", "startrek", "tao",
        "wisdom", "work", "zippy",
    ],
    "fortunes-min": ["fortunes", "literature", "riddles"],
}
LEFT_OUT = {
    "ascii-art": "pictures drawn in characters, not text",
    "translate-me": "quotations in other languages than English",
    "songs-poems": "whole song lyrics and poems, whose authors' copyright the package's licence may not cover",
}
COPYRIGHT_FILES = ["/usr/share/doc/fortunes/copyright", "/usr/share/doc/fortunes-min/copyright"]

SPECIALS = ["<|endoftext|>"]  # id 0: begins every fortune (BOS) and ends the output (EOS)
VOCAB_SIZE = 4096
SPLIT_ONE_IN = 20  # the hash of a fortune's text modulo this: 0 held out, 1 validation, else training

# The golden test's prompts: greedy continuations of these are what mqlm must reproduce.
GOLDEN_PROMPTS = [
    "A fool and his money",
    "Q: How many programmers does it take to change a light bulb?\nA:",
    "The trouble with computers is",
    "You will be",
    "Never trust a man who",
    "It is a truth universally acknowledged that",
]
# More text for the tokenizer comparison alone: spaces, digits, contractions, tabs, non-ASCII.
TOKENIZER_CASES = [
    "Don't panic.  It's only 42 -- or 1,000,000?",
    "\t\t-- Mark Twain, \"Pudd'nhead Wilson's Calendar\"\n",
    "naïve café, Zürich: 3½ €uros; 日本語 and emoji 🙂!",
    "   leading spaces, trailing spaces   \n\n\nand blank lines",
    "I'LL SHOUT, you'll whisper; we've, they're, she'd, I'm",
]


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def package_version(package):
    return subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], check=True, capture_output=True,
                          text=True).stdout


def input_lines():
    """inputs.txt as the installed files make it."""
    lines = [
        "# The exact inputs of tools/demo_model/prepare.py (Debian 12 packages; regenerate with --write-inputs).",
        "# package NAME VERSION | file PACKAGE PATH SHA256 | licence PATH SHA256",
    ]
    for package, names in COLLECTIONS.items():
        lines.append(f"package {package} {package_version(package)}")
    for package, names in COLLECTIONS.items():
        for name in names:
            path = os.path.join(FORTUNE_DIR, name)
            lines.append(f"file {package} {path} {sha256_of(path)}")
    for path in COPYRIGHT_FILES:
        lines.append(f"licence {path} {sha256_of(path)}")
    return lines


def check_inputs():
    missing = [p for p in ["fortunes", "fortunes-min"] if not os.path.isdir(f"/usr/share/doc/{p}")]
    if missing:
        sys.exit(f"prepare: install the inputs first: apt-get install {' '.join(missing)}")
    installed = set()
    for package in COLLECTIONS:
        listing = subprocess.run(["dpkg", "-L", package], check=True, capture_output=True, text=True).stdout
        installed |= {os.path.basename(p) for p in listing.split("\n")
                      if os.path.dirname(p) == FORTUNE_DIR and not p.endswith((".dat", ".u8"))}
    named = {name for names in COLLECTIONS.values() for name in names} | set(LEFT_OUT)
    if installed != named:
        sys.exit(f"prepare: collections neither used nor left out: {sorted(installed - named)}; "
                 f"named but not installed: {sorted(named - installed)}")
    with open(INPUTS) as f:
        want = [line.rstrip("\n") for line in f]
    have = input_lines()
    if want != have:
        diff = [f"  inputs.txt: {w}\n  installed:  {h}" for w, h in zip(want, have) if w != h]
        sys.exit("prepare: the installed files differ from inputs.txt (other package versions?):\n" +
                 "\n".join(diff[:10]) + ("" if len(want) == len(have) else "\n  (and a different number of lines)"))


def strike_through(line):
    """A line as a terminal shows it: a backspace steps back and the next character overwrites,
    except that an underscore does not overwrite a character (underlining: "_\\bx", "__\\b\\bxy")."""
    cells, at = [], 0
    for ch in line:
        if ch == "\b":
            at = max(0, at - 1)
            continue
        if at < len(cells):
            if not (ch == "_" and cells[at] not in " _"):
                cells[at] = ch
        else:
            cells.append(ch)
        at += 1
    return "".join(cells)


def undo_mojibake(text):
    """A few fortunes hold UTF-8 that was decoded as Latin-1 and encoded again, once or twice
    ("donâ\x80\x99t"): undone while the text still reads as such."""
    for _ in range(3):
        try:
            repaired = text.encode("latin-1").decode("utf-8")
        except UnicodeError:
            return text
        if repaired == text:
            return text
        text = repaired
    return text


def clean(entry):
    """One fortune: mojibake undone, overstriking resolved, control characters but tabs dropped,
    trailing spaces and blank lines at either end removed; line breaks and indentation kept."""
    entry = undo_mojibake(entry)
    lines = []
    for line in entry.split("\n"):
        line = strike_through(line.replace("\r", ""))
        line = "".join(ch for ch in line if ch == "\t" or not (ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0))
        lines.append(line.rstrip())
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines)


def read_fortunes():
    """Every fortune of the collections, cleaned, the first of any duplicates kept."""
    seen, fortunes = set(), []
    for package, names in COLLECTIONS.items():
        for name in names:
            with open(os.path.join(FORTUNE_DIR, name), "rb") as f:
                text = f.read().decode("utf-8")
            entries, current = [], []
            for line in text.split("\n"):
                if line.rstrip("\r") == "%":
                    entries.append("\n".join(current))
                    current = []
                else:
                    current.append(line)
            entries.append("\n".join(current))
            for entry in entries:
                fortune = clean(entry)
                if fortune and fortune not in seen:
                    seen.add(fortune)
                    fortunes.append(fortune)
    return fortunes


def split_of(fortune):
    digest = hashlib.sha256(fortune.encode("utf-8")).digest()
    return {0: "heldout", 1: "valid"}.get(int.from_bytes(digest[:8], "little") % SPLIT_ONE_IN, "train")


def write_stream(path, fortunes, encoder, eot):
    ids = array("H")
    for fortune in fortunes:
        ids.append(eot)
        ids.extend(encoder.encode(fortune))
    ids.append(eot)
    if sys.byteorder != "little":
        ids.byteswap()
    with open(path, "wb") as f:
        ids.tofile(f)
    return len(ids)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for the prepared data (created)")
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    parser.add_argument("--write-inputs", action="store_true", help="rewrite inputs.txt from the installed files")
    args = parser.parse_args()

    if args.write_inputs:
        with open(INPUTS, "w") as f:
            f.write("\n".join(input_lines()) + "\n")
        print(f"prepare: wrote {INPUTS}")
    check_inputs()
    started = time.time()
    fortunes = read_fortunes()
    splits = {name: [f for f in fortunes if split_of(f) == name] for name in ["train", "valid", "heldout"]}
    train_fortunes = splits["train"]
    print(f"prepare: {len(fortunes)} fortunes ({sum(len(f.encode()) for f in fortunes)} bytes): "
          f"{len(train_fortunes)} to train on, {len(splits['valid'])} to validate, {len(splits['heldout'])} held out")

    pre = byte_bpe.PreTokenizer()
    word_counts = Counter()
    for fortune in train_fortunes:
        word_counts.update(pre.words(fortune))
    print(f"prepare: {len(word_counts)} distinct words; training a {args.vocab_size}-token BPE")
    vocabulary = byte_bpe.train(word_counts, SPECIALS, args.vocab_size)
    encoder = byte_bpe.Encoder(vocabulary, pre)
    for word, segmentation in vocabulary.training_segmentation.items():
        assert encoder.encode_word(word) == segmentation, f"rank-order merging differs from training on {word!r}"

    os.makedirs(args.out, exist_ok=True)
    eot = vocabulary.id_of[SPECIALS[0]]
    tokenizer = {
        "model": "gpt2",
        "pre": byte_bpe.PRE_TOKENIZER,
        "tokens": vocabulary.tokens,
        "token_types": [3 if i < len(SPECIALS) else 1 for i in range(len(vocabulary.tokens))],  # control, normal
        "merges": vocabulary.merges,
        "bos": eot,
        "eos": eot,
        "add_bos": True,
        "add_eos": False,
    }
    with open(os.path.join(args.out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f, ensure_ascii=False, indent=0)
    counts = {"fortunes": len(fortunes), "vocab_size": len(vocabulary.tokens)}
    for name, part in splits.items():
        counts[f"{name}_fortunes"] = len(part)
        counts[f"{name}_bytes"] = sum(len(f.encode()) for f in part)
        counts[f"{name}_tokens"] = write_stream(os.path.join(args.out, f"{name}.bin"), part, encoder, eot)
    prompts = {
        "bos": eot,
        "golden": [{"text": t, "ids": [eot] + encoder.encode(t)} for t in GOLDEN_PROMPTS],
        "tokenizer_cases": [{"text": t, "ids": [eot] + encoder.encode(t)} for t in TOKENIZER_CASES],
    }
    for case in prompts["golden"] + prompts["tokenizer_cases"]:
        assert encoder.decode(case["ids"]).decode("utf-8") == case["text"], case["text"]
    with open(os.path.join(args.out, "prompts.json"), "w") as f:
        json.dump(prompts, f, ensure_ascii=False, indent=1)
    counts["sha256"] = {name: sha256_of(os.path.join(args.out, name))
                        for name in ["tokenizer.json", "train.bin", "valid.bin", "heldout.bin", "prompts.json"]}
    with open(os.path.join(args.out, "corpus.json"), "w") as f:
        json.dump(counts, f, indent=1)
    print(f"prepare: {counts['train_tokens']} training tokens ({counts['train_bytes'] / counts['train_tokens']:.2f} "
          f"bytes each), {counts['valid_tokens']} validation and {counts['heldout_tokens']} held-out tokens; wrote {args.out} in {time.time() - started:.1f} s")


if __name__ == "__main__":
    main()
