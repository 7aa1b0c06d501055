"""Attention variants on the host: the mirror of ``kernels/common/variant.cuh``.

A :class:`Variant` says which keys a query row sees (the band: causal, a sliding
window), what becomes of the logits (softcap) and whether a dense mask is read. It
is the one place that turns those into the kernels' template argument
(:meth:`Variant.cpp`), the spec-name suffix (:meth:`Variant.suffix`) and the band
params (:meth:`Variant.band`), so no family spells them out itself.

Conventions (FlashAttention's): query ``i`` and key ``j`` are aligned bottom-right,
``offset = Sk - Sq``. ``causal`` keeps ``j <= i + offset``. ``window = (left,
right)`` keeps ``i + offset - left <= j <= i + offset + right``, ``-1`` meaning
unbounded on that side; with ``causal`` the right bound is ``min(right, 0)``.
``softcap = c > 0`` replaces each score ``s`` by ``c * tanh(s / c)``.
``dense``: a mask read per element (``"bool"``, ``"add"``) or ALiBi (``"alibi"``: the
bias ``-slope[h] * |i + offset - j|`` computed in the kernel, slopes per head).
``ragged``: packed sequences of different lengths (``attention_varlen``); the band
params then leave out the offset, which each sequence adds for itself
(``kernels/common/seqs.cuh``). ``cache``: a batch of KV caches whose sequences hold
keys of their own counts (``attention_decode``'s chunked prefill on flash_wgmma),
``"contiguous"`` or ``"paged"``; the band leaves out the offset as for ``ragged``.
``dropout``: the probabilities are dropped with the Philox stream of
``cupy_attention.dropout`` (``PhiloxDropout``); p, seed and offset are per-call params
(:func:`dropout_params`).
"""

from __future__ import annotations

import dataclasses

_DENSE_CPP = {"none": "NoDense", "bool": "BoolDense", "add": "AddDense", "alibi": "AlibiBias"}
_DENSE_SUFFIX = {"none": "", "bool": ",bool-mask", "add": ",add-mask", "alibi": ",alibi"}


@dataclasses.dataclass(frozen=True)
class Variant:
    causal: bool = False
    window: tuple | None = None    # (left, right), -1 = unbounded; None = no window
    softcap: float = 0.0           # 0 = off
    dense: str = "none"            # "none" | "bool" | "add" | "alibi"
    ragged: bool = False           # packed sequences (RaggedSeqs)
    cache: str = ""                # KV caches (CachedSeqs): "" | "contiguous" | "paged"
    dropout: bool = False          # PhiloxDropout (its p, seed and offset are call params)

    @property
    def reads_mask(self) -> bool:
        """A dense mask read from memory per element (``kReads`` of mask.cuh)."""
        return self.dense in ("bool", "add")

    @property
    def transforms(self) -> bool:
        """The score is more than ``dot * scale`` (``Variant::kTransform``): softcap or
        ALiBi, which keep more of the softmax's values live in the kernels."""
        return bool(self.softcap) or self.dense == "alibi"

    @property
    def band_flags(self) -> tuple[bool, bool]:
        """(lower bound, upper bound) on the keys of a row, as ``Band<LO, HI>``."""
        left, right = self.window if self.window is not None else (-1, -1)
        return left >= 0, self.causal or right >= 0

    def band(self, seqlen_q: int, seqlen_k: int) -> tuple[int, int]:
        """``FwdParams::band_lo``, ``band_hi``: row i sees keys i + band_lo .. i + band_hi."""
        offset = 0 if self.ragged or self.cache else seqlen_k - seqlen_q
        left, right = self.window if self.window is not None else (-1, -1)
        if self.causal:
            right = 0 if right < 0 else min(right, 0)
        return (offset - left if left >= 0 else 0), (offset + right if right >= 0 else 0)

    def cpp(self) -> str:
        """The C++ variant type, e.g. ``Variant<Band<false, true>, PlainLogits, NoDense>``."""
        lo, hi = self.band_flags
        logits = "Softcap" if self.softcap else "PlainLogits"
        seqs = (", RaggedSeqs" if self.ragged
                else f", CachedSeqs<{str(self.cache == 'paged').lower()}>" if self.cache
                else ", FixedSeqs" if self.dropout else "")
        drop = ", PhiloxDropout" if self.dropout else ""
        return (f"Variant<Band<{str(lo).lower()}, {str(hi).lower()}>, {logits}, "
                f"{_DENSE_CPP[self.dense]}{seqs}{drop}>")

    def suffix(self) -> str:
        """The spec-name suffix: ``,causal``, ``,window``, ``,softcap``, ``,bool-mask``..."""
        lo, hi = self.band_flags
        out = ",causal" if self.causal else ""
        if self.window is not None and (lo or (hi and not self.causal)):
            out += ",window"
        if self.softcap:
            out += ",softcap"
        return (out + _DENSE_SUFFIX[self.dense] + (",varlen" if self.ragged else "")
                + (f",{self.cache}-cache" if self.cache else "")
                + (",dropout" if self.dropout else ""))

    def band_only(self) -> "Variant":
        """The same band without logits or dense mask: what a kernel that only walks
        the kept keys (a P @ V pass over a finished softmax) instantiates."""
        return Variant(self.causal, self.window, ragged=self.ragged, cache=self.cache)

    def params(self, seqlen_q: int, seqlen_k: int, scale: float) -> dict:
        """The FwdParams fields this variant sets (band and softcap)."""
        import math

        lo, hi = self.band(seqlen_q, seqlen_k)
        out = {"band_lo": lo, "band_hi": hi}
        if self.softcap:
            out["softcap_scale"] = scale / self.softcap
            out["softcap_log2"] = self.softcap / math.log(2.0)
            out["softcap_exp2"] = 2.0 * scale / (self.softcap * math.log(2.0))
            out["softcap_neg2"] = -2.0 * self.softcap / math.log(2.0)
            out["softcap_rlog2"] = math.log(2.0) / self.softcap
        return out


def dropout_params(p: float, seed: int, offset: int) -> dict:
    """The FwdParams fields of PhiloxDropout for drop probability ``p`` (quantized to
    1/65536, as the host's keep_mask is), ``seed`` (64 bits) and ``offset`` (32)."""
    from .dropout import keep_scale, threshold

    return {"dropout_seed_lo": seed & 0xFFFFFFFF, "dropout_seed_hi": (seed >> 32) & 0xFFFFFFFF,
            "dropout_offset": offset & 0xFFFFFFFF, "dropout_threshold": threshold(p),
            "dropout_scale": keep_scale(p)}


PLAIN = Variant()
CAUSAL = Variant(causal=True)
