"""Byte-level BPE as GGUF "gpt2" tokenizers carry it: a regex pre-tokenizer cuts text into words,
each word starts as its bytes (each byte written as one printable character by GPT-2's
bytes_to_unicode table), and adjacent pairs merge by the rank of their merge.

The pre-tokenizer is mqlm's "gpt2" one (model/tokenizer/pre_tokenizer.cpp: kGpt2), run here by
the `regex` module (Debian: python3-regex), which knows \\p{L} and \\p{N} as PCRE2 does.

Only prepare.py imports this file: train.py gets token ids and tokenizer.json, so the training
machine needs no `regex`.
"""
import heapq
from collections import Counter

# mqlm's kGpt2, character for character.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
PRE_TOKENIZER = "gpt2"  # tokenizer.ggml.pre: the name mqlm and llama.cpp both map to that regex


def byte_characters():
    """byte -> the character GPT-2 writes it as: printable Latin-1 bytes stand for themselves, the
    others (controls, space, 0x7F-0xA0, 0xAD) for U+0100 onwards in byte order."""
    table, next_code = [], 256
    for b in range(256):
        printable = ord("!") <= b <= ord("~") or 0xA1 <= b <= 0xAC or b >= 0xAE
        if printable:
            table.append(chr(b))
        else:
            table.append(chr(next_code))
            next_code += 1
    return table


BYTE_CHARS = byte_characters()
BYTE_OF_CHAR = {c: b for b, c in enumerate(BYTE_CHARS)}


def to_token_text(data: bytes) -> str:
    return "".join(BYTE_CHARS[b] for b in data)


def from_token_text(text: str) -> bytes:
    return bytes(BYTE_OF_CHAR[c] for c in text)


class PreTokenizer:
    def __init__(self):
        import regex  # here, not at the top: only what pre-tokenizes needs it
        self._pattern = regex.compile(GPT2_PATTERN)

    def words(self, text: str):
        """The words of `text`, covering it exactly (valid UTF-8 text matches everywhere)."""
        words = self._pattern.findall(text)
        assert "".join(words) == text, "the pre-tokenizer lost text"
        return words


class Vocabulary:
    """Token texts by id (specials first, then the 256 bytes, then one token per merge) and the
    merges by rank, each "left right" in token texts."""

    def __init__(self, specials, merges):
        self.specials = list(specials)
        self.tokens = list(specials) + list(BYTE_CHARS)
        self.merges = []
        self.id_of = {text: i for i, text in enumerate(self.tokens)}
        self.rank_of_pair = {}  # (left id, right id) -> (rank, merged id)
        for left, right in merges:
            self.add_merge(left, right)

    def add_merge(self, left: str, right: str) -> int:
        merged = left + right
        assert merged not in self.id_of, f"merge {left!r} {right!r} makes a token that exists"
        self.id_of[merged] = len(self.tokens)
        self.rank_of_pair[(self.id_of[left], self.id_of[right])] = (len(self.merges), len(self.tokens))
        self.tokens.append(merged)
        self.merges.append(f"{left} {right}")
        return self.id_of[merged]


class Encoder:
    """Text to ids the way mqlm does it (model/tokenizer/bpe.cpp): per word, the lowest-ranked
    adjacent pair merges first, the leftmost among equals, until none merges."""

    def __init__(self, vocabulary: Vocabulary, pre_tokenizer: PreTokenizer):
        self.vocabulary = vocabulary
        self.pre_tokenizer = pre_tokenizer
        self._byte_ids = [vocabulary.id_of[c] for c in BYTE_CHARS]
        self._cache = {}

    def encode_word(self, word: str):
        ids = self._cache.get(word)
        if ids is not None:
            return ids
        ids = [self._byte_ids[b] for b in word.encode("utf-8")]
        ranks = self.vocabulary.rank_of_pair
        while len(ids) > 1:
            best = None
            for i in range(len(ids) - 1):
                found = ranks.get((ids[i], ids[i + 1]))
                if found is not None and (best is None or found[0] < best[0]):
                    best = (found[0], found[1], i)
            if best is None:
                break
            _, merged, at = best
            ids[at:at + 2] = [merged]
        self._cache[word] = ids
        return ids

    def encode(self, text: str):
        out = []
        for word in self.pre_tokenizer.words(text):
            out.extend(self.encode_word(word))
        return out

    def decode(self, ids) -> bytes:
        special = set(range(len(self.vocabulary.specials)))
        return b"".join(from_token_text(self.vocabulary.tokens[i]) for i in ids if i not in special)


def train(word_counts: Counter, specials, vocab_size: int, log=print) -> Vocabulary:
    """Learns merges until the vocabulary has vocab_size tokens, from words and their counts.

    Incremental: the count of every adjacent pair over all words, and for each pair the words it
    occurs in, are kept up to date as merges apply, so a merge costs only the words it touches.
    The next merge is the most frequent pair, ties to the smallest (left id, right id); a pair
    whose joined text is already a token (two ways to spell it) is never merged, so each token
    has exactly one merge and mqlm's rank-ordered merging reproduces the training segmentation.
    """
    vocabulary = Vocabulary(specials, [])
    byte_ids = [vocabulary.id_of[c] for c in BYTE_CHARS]
    words = [[byte_ids[b] for b in w.encode("utf-8")] for w in word_counts]
    counts = list(word_counts.values())
    pair_counts = Counter()
    pair_words = {}
    for index, symbols in enumerate(words):
        for pair in zip(symbols, symbols[1:]):
            pair_counts[pair] += counts[index]
            pair_words.setdefault(pair, set()).add(index)
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)

    def change(pair, delta, index):
        pair_counts[pair] += delta
        if delta > 0:
            pair_words.setdefault(pair, set()).add(index)
        heapq.heappush(heap, (-pair_counts[pair], pair))

    while len(vocabulary.tokens) < vocab_size and heap:
        negative, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -negative or -negative <= 0:
            continue  # stale: the count changed since this entry was pushed
        left, right = (vocabulary.tokens[i] for i in pair)
        if left + right in vocabulary.id_of:
            pair_counts[pair] = 0
            continue
        merged = vocabulary.add_merge(left, right)
        for index in pair_words.pop(pair):
            symbols = words[index]
            if not any(a == pair[0] and b == pair[1] for a, b in zip(symbols, symbols[1:])):
                continue  # an earlier merge in this round took the pair's symbols
            for old in zip(symbols, symbols[1:]):
                change(old, -counts[index], index)
            out, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and symbols[i] == pair[0] and symbols[i + 1] == pair[1]:
                    out.append(merged)
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            words[index] = out
            for new in zip(out, out[1:]):
                change(new, counts[index], index)
        pair_counts[pair] = 0
        if len(vocabulary.merges) % 500 == 0:
            log(f"  {len(vocabulary.merges)} merges, last {left!r} + {right!r} ({-negative} times)")
    vocabulary.training_segmentation = {w: s for w, s in zip(word_counts, words)}
    return vocabulary
