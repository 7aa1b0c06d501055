#!/usr/bin/env python3
"""A toy autoregressive generation loop on a paged KV cache.

A two-layer decoder with random weights and grouped-query attention (8 query heads
over 2 KV heads) generates tokens greedily for three prompts of different lengths.
Each layer keeps its keys and values in pages of PAGE_SIZE tokens handed out from a
shuffled free list (as a serving engine's allocator would); a block table maps each
sequence's positions to its pages. Every step, for every layer:

    1. the new tokens' k and v are written into their pages (position p of sequence
       b lives in page block_table[b, p // PAGE_SIZE], row p % PAGE_SIZE);
    2. ca.attention_decode(q, k_pages, v_pages, cache_seqlens=lengths,
       block_table=block_table) attends over everything each sequence holds
       (causal, aligned to each sequence's own length).

Each prompt goes in as one call of Sq = its length (a batch of one: the rows of
the block table and lengths of that sequence); then the three sequences decode
together, one token each per step. The same tokens then run through a contiguous
cache with ca.attention, and the two runs' logits are compared.

    python examples/generate.py            # needs an NVIDIA GPU (sm_80+) and CuPy
"""

from __future__ import annotations

import cupy as cp
import numpy as np

import cupy_attention as ca

VOCAB, LAYERS, HQ, HKV, D = 512, 2, 8, 2, 64
MODEL = HQ * D
PAGE_SIZE, NUM_PAGES, MAX_PAGES = 16, 64, 8          # up to 128 tokens per sequence
PROMPTS = [[3, 17, 42], [7, 7, 7, 7, 7, 1], [100]]   # three sequences, different lengths
NEW_TOKENS = 20


def init_weights(seed=0):
    rng = np.random.default_rng(seed)
    w = lambda *s: cp.asarray(rng.standard_normal(s, dtype=np.float32) / np.sqrt(s[0]))  # noqa: E731
    layers = [dict(wq=w(MODEL, HQ * D), wk=w(MODEL, HKV * D), wv=w(MODEL, HKV * D),
                   wo=w(HQ * D, MODEL), w1=w(MODEL, 4 * MODEL), w2=w(4 * MODEL, MODEL))
              for _ in range(LAYERS)]
    return dict(embed=w(VOCAB, MODEL) * np.sqrt(VOCAB), layers=layers, unembed=w(MODEL, VOCAB))


def rms_norm(x):
    return x / cp.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6)


class Pager:
    """Hands out pages from a shuffled free list; keeps the block table and lengths."""

    def __init__(self, batch, seed=1):
        self.free = list(np.random.default_rng(seed).permutation(NUM_PAGES))
        self.table = np.full((batch, MAX_PAGES), -1, dtype=np.int32)
        self.lengths = np.zeros(batch, dtype=np.int32)

    def reserve(self, b, n):
        """Pages for n more tokens of sequence b; returns their positions."""
        start = int(self.lengths[b])
        for pos in range(start, start + n):
            if pos % PAGE_SIZE == 0:
                self.table[b, pos // PAGE_SIZE] = self.free.pop()
        return np.arange(start, start + n)


def forward_paged(weights, pages, pager, seqs, tokens):
    """One step of sequences ``seqs`` (indices into the pager), each with the same
    number Sq of new ``tokens`` [len(seqs), Sq]. Returns the last token's logits."""
    B, Sq = len(seqs), len(tokens[0])
    x = weights["embed"][cp.asarray(tokens)]                          # [B, Sq, MODEL]
    positions = [pager.reserve(b, Sq) for b in seqs]
    where = [(cp.asarray(pager.table[b, pos // PAGE_SIZE]), cp.asarray(pos % PAGE_SIZE))
             for b, pos in zip(seqs, positions)]
    table = cp.asarray(pager.table[seqs])
    lengths = cp.asarray(pager.lengths[seqs] + Sq)
    for layer, (k_pages, v_pages) in zip(weights["layers"], pages):
        h = rms_norm(x)
        q = (h @ layer["wq"]).reshape(B, Sq, HQ, D).astype(cp.float16)
        k = (h @ layer["wk"]).reshape(B, Sq, HKV, D).astype(cp.float16)
        v = (h @ layer["wv"]).reshape(B, Sq, HKV, D).astype(cp.float16)
        for i, (page, row) in enumerate(where):
            k_pages[page, row] = k[i]
            v_pages[page, row] = v[i]
        o = ca.attention_decode(q, k_pages, v_pages, cache_seqlens=lengths, block_table=table)
        x = x + o.reshape(B, Sq, HQ * D).astype(cp.float32) @ layer["wo"]
        x = x + cp.maximum(rms_norm(x) @ layer["w1"], 0) @ layer["w2"]
    pager.lengths[seqs] += Sq
    return rms_norm(x[:, -1]) @ weights["unembed"]


def forward_contiguous(weights, cache, tokens):
    """The same step for one sequence whose keys and values are contiguous
    [1, S, HKV, D] arrays, through ca.attention (causal, aligned bottom-right)."""
    Sq = len(tokens)
    x = weights["embed"][cp.asarray([tokens])]
    for layer, kv in zip(weights["layers"], cache):
        h = rms_norm(x)
        q = (h @ layer["wq"]).reshape(1, Sq, HQ, D).astype(cp.float16)
        k = (h @ layer["wk"]).reshape(1, Sq, HKV, D).astype(cp.float16)
        v = (h @ layer["wv"]).reshape(1, Sq, HKV, D).astype(cp.float16)
        kv["k"] = cp.concatenate([kv["k"], k], axis=1)
        kv["v"] = cp.concatenate([kv["v"], v], axis=1)
        o = ca.attention(q, kv["k"], kv["v"], causal=True, layout="bshd")
        x = x + o.reshape(1, Sq, HQ * D).astype(cp.float32) @ layer["wo"]
        x = x + cp.maximum(rms_norm(x) @ layer["w1"], 0) @ layer["w2"]
    return rms_norm(x[:, -1]) @ weights["unembed"]


def main():
    weights = init_weights()
    B = len(PROMPTS)
    pager = Pager(B)
    pages = [(cp.zeros((NUM_PAGES, PAGE_SIZE, HKV, D), cp.float16),
              cp.zeros((NUM_PAGES, PAGE_SIZE, HKV, D), cp.float16)) for _ in range(LAYERS)]

    # Paged: each prompt as one Sq-row call, then the batch decodes together.
    generated, paged_logits = [], []
    for b, prompt in enumerate(PROMPTS):
        logits = forward_paged(weights, pages, pager, [b], [prompt])
        generated.append([int(logits[0].argmax())])
    for _ in range(NEW_TOKENS - 1):
        logits = forward_paged(weights, pages, pager, list(range(B)), [[g[-1]] for g in generated])
        paged_logits.append(logits)
        for b in range(B):
            generated[b].append(int(logits[b].argmax()))

    # Contiguous: the same tokens, one sequence at a time, through ca.attention.
    worst = 0.0
    for b, prompt in enumerate(PROMPTS):
        cache = [dict(k=cp.zeros((1, 0, HKV, D), cp.float16), v=cp.zeros((1, 0, HKV, D), cp.float16))
                 for _ in range(LAYERS)]
        forward_contiguous(weights, cache, prompt)
        for step in range(NEW_TOKENS - 1):
            logits = forward_contiguous(weights, cache, [generated[b][step]])
            worst = max(worst, float(abs(logits[0] - paged_logits[step][b]).max()))

    for b, prompt in enumerate(PROMPTS):
        print(f"sequence {b}: prompt {prompt} -> {generated[b]}")
    scale = max(float(abs(x).max()) for x in paged_logits)
    print(f"max |paged - contiguous| logit difference: {worst:.2e} (logits up to {scale:.1f})")
    print(f"pages in use: {NUM_PAGES - len(pager.free)} of {NUM_PAGES} ({PAGE_SIZE} tokens "
          f"each); lengths {pager.lengths.tolist()}")
    assert worst <= 1e-2 * scale, "paged and contiguous runs disagree"


if __name__ == "__main__":
    main()
