// Sequences: where the rows of batch entry b lie and how many there are. The
// fourth part of a Variant (common/variant.cuh), chosen on the host like the others.
//
//   FixedSeqs   every entry has Sq query rows and Sk keys, at b * batch_stride.
//               Nothing of it exists in the code: bind returns the params as they are.
//   RaggedSeqs  packed sequences (varlen, FlashAttention's flash_attn_varlen_func):
//               q, o [total_q, Hq, D], k, v [total_k, Hkv, D], lse [Hq, total_q];
//               sequence b owns query rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] and
//               key rows cu_seqlens_k[b] .. cu_seqlens_k[b + 1]. The params as the
//               host packs them hold the totals (seqlen_q = total_q, seqlen_k =
//               total_k), batch strides 0 and a band without the Sk - Sq offset; bind
//               gives sequence b's params: its lengths, its pointers (its first row),
//               its band (the causal alignment is per sequence, bottom-right).
//   CachedSeqs  a batch of KV caches (attention_decode's chunked prefill): entry b has
//               FixedSeqs' Sq query rows at b * batch_stride and its own key count,
//               seqlens[b] of the cache (common/paged.cuh), its keys contiguous or in
//               pages: PAGED, which only the loads of K and V read. The params as the
//               host packs them hold seqlen_k = the cache's capacity and a band
//               without the Sk - Sq offset; bind gives entry b's key count and band.
//
// Work over ragged sequences: a grid over query (or key) blocks of BLOCK rows covers
// every sequence without padding it to the longest. Virtual block v of sequence b
// lies in [first(b), first(b + 1)) with first(b) = cu[b] / BLOCK + b: a sequence of
// n rows gets ceil(n / BLOCK) or ceil(n / BLOCK) + 1 virtual blocks, so at most one
// per sequence is empty, and there are total / BLOCK + B of them in all.
#pragma once
#include "params.cuh"

__device__ __forceinline__ const FwdParams& fwd_of(const FwdParams& p) { return p; }
__device__ __forceinline__ const FwdParams& fwd_of(const BwdParams& p) { return p.fwd; }

// Fixed lengths: a grid over `blocks` blocks of every (head, batch) pair, either
// (blocks, heads, B) or in sections of G pairs, (blocks * G, pairs / G, 1), whose x
// runs a section's pairs innermost: its blocks go block by block over G pairs (the
// host's choice, read back as G = gridDim.x / blocks; under a causal band the
// heaviest blocks of a section then start first). Block (x, y, z)'s block m
// (LAST_FIRST: counted from the last), head h and batch entry b.
template <bool LAST_FIRST>
__device__ __forceinline__ void section_block(int blocks, int heads, int& m, int& h, int& b) {
  const int g = int(gridDim.x) / blocks;
  const int pair = int(blockIdx.z * gridDim.y + blockIdx.y) * g + int(blockIdx.x) % g;
  const int x = int(blockIdx.x) / g;
  m = LAST_FIRST ? blocks - 1 - x : x;
  h = pair % heads;
  b = pair / heads;
}

struct FixedSeqs {
  static constexpr bool kRagged = false;
  static constexpr bool kCached = false;
  struct Extent {};
  template <class P>
  using Bound = const P&;
  template <class T>
  __device__ __forceinline__ static const FwdParams& bind(const FwdParams& p, const Extent&) {
    return p;
  }
  template <class T>
  __device__ __forceinline__ static const BwdParams& bind(const BwdParams& p, const Extent&) {
    return p;
  }
  template <class T, class P>
  __device__ __forceinline__ static const P& bind_shared(const P& p, const Extent&, void*) {
    return p;
  }
  // Block x of a grid over the blocks of BLOCK query rows (KEYS: keys) of each batch
  // entry, z = the entry: its entry b, its block m, and the params of the entry.
  template <class T, int BLOCK, bool KEYS, class P>
  __device__ __forceinline__ static const P& bind_block(const P& p, int x, int& b, int& m, void*) {
    b = blockIdx.z;
    m = x;
    return p;
  }
  template <class T, int BLOCK, bool KEYS, class P>
  __device__ __forceinline__ static const P& bind_block_regs(const P& p, int x, int& b, int& m) {
    return bind_block<T, BLOCK, KEYS>(p, x, b, m, nullptr);
  }
  // A tile kernel's block of BLOCK query rows (KEYS: keys), head (of `heads`) and
  // entry: from section_block's grid where SECTIONS, else from the grid (x, heads, B)
  // as blockIdx (which ptxas reads again where used instead of keeping it live).
  template <class T, int BLOCK, bool KEYS, bool LAST_FIRST, bool SECTIONS, class P>
  __device__ __forceinline__ static const P& bind_grid(const P& p, int heads, int& m, int& h,
                                                       int& b, void*) {
    if constexpr (SECTIONS) {
      const FwdParams& f = fwd_of(p);
      section_block<LAST_FIRST>(ceil_div(KEYS ? f.seqlen_k : f.seqlen_q, BLOCK), heads, m, h, b);
    } else {
      h = blockIdx.y;
      b = blockIdx.z;
      m = LAST_FIRST ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
    }
    return p;
  }
};

struct RaggedSeqs {
  static constexpr bool kRagged = true;
  static constexpr bool kCached = false;
  // Sequence b: first query row and key row in the packed tensors, and lengths.
  struct Extent {
    int q_start, k_start, seqlen_q, seqlen_k;
  };
  template <class P>
  using Bound = P;

  __device__ __forceinline__ static Extent extent(const FwdParams& p, int b) {
    const int q0 = p.cu_seqlens_q[b], q1 = p.cu_seqlens_q[b + 1];
    const int k0 = p.cu_seqlens_k[b], k1 = p.cu_seqlens_k[b + 1];
    return {q0, k0, q1 - q0, k1 - k0};
  }
  // Virtual blocks of BLOCK rows over every sequence of `cu` (see above).
  __device__ __forceinline__ static int blocks(int total, int batch, int block) {
    return total / block + batch;
  }
  // The sequence of virtual block v, and v's block within it: the last b with
  // first(b) <= v, found by the whole warp (32 candidates per round: one round up
  // to 32 sequences, two up to 1024). Every lane returns the same result.
  __device__ __forceinline__ static void locate_warp(const i32* cu, int batch, int block, int v,
                                                     int& b, int& m) {
    const int lane = threadIdx.x % 32;
    int lo = 0, n = batch, first_lo = 0;  // b lies in [lo, lo + n); first(lo) = first_lo <= v
    while (n > 1) {
      const int step = ceil_div(n, 32), cand = lo + lane * step;
      const int first = cand < lo + n ? cu[cand] / block + cand : (1 << 30);
      const u32 ok = __ballot_sync(0xffffffffu, first <= v);  // lane 0 always
      const int last = 31 - __clz(ok);
      first_lo = __shfl_sync(0xffffffffu, first, last);
      const int next = lo + last * step;
      n = cmin(step, lo + n - next);
      lo = next;
    }
    b = lo;
    m = v - first_lo;
  }
  // The same by one thread (a producer): a binary search.
  __device__ __forceinline__ static void locate_thread(const i32* cu, int batch, int block, int v,
                                                       int& b, int& m) {
    int lo = 0, hi = batch;  // first(lo) <= v < first(hi), first(batch) = +inf
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (cu[mid] / block + mid <= v) lo = mid; else hi = mid;
    }
    b = lo;
    m = v - (cu[lo] / block + lo);
  }

  // Sequence `e`'s params: lengths, first rows, band (its own Sk - Sq).
  template <class T>
  __device__ __forceinline__ static FwdParams bind(const FwdParams& p, const Extent& e) {
    FwdParams s = p;
    s.seqlen_q = e.seqlen_q;
    s.seqlen_k = e.seqlen_k;
    s.band_lo += e.seqlen_k - e.seqlen_q;
    s.band_hi += e.seqlen_k - e.seqlen_q;
    s.q = static_cast<const T*>(p.q) + i64(e.q_start) * p.q_row_stride;
    s.k = static_cast<const T*>(p.k) + i64(e.k_start) * p.k_row_stride;
    s.v = static_cast<const T*>(p.v) + i64(e.k_start) * p.v_row_stride;
    s.o = static_cast<T*>(p.o) + i64(e.q_start) * p.o_row_stride;
    if (p.lse) s.lse = p.lse + e.q_start;
    return s;
  }
  // The backward's: the forward's, and dO, dQ, dK, dV, delta and dq_accum moved to
  // the sequence's first row.
  template <class T>
  __device__ __forceinline__ static BwdParams bind(const BwdParams& p, const Extent& e) {
    BwdParams s = p;
    s.fwd = bind<T>(p.fwd, e);
    s.dout = static_cast<const T*>(p.dout) + i64(e.q_start) * p.dout_row_stride;
    s.dq = static_cast<T*>(p.dq) + i64(e.q_start) * p.dq_row_stride;
    s.dk = static_cast<T*>(p.dk) + i64(e.k_start) * p.dk_row_stride;
    s.dv = static_cast<T*>(p.dv) + i64(e.k_start) * p.dv_row_stride;
    s.delta = p.delta + e.q_start;
    if (p.dq_accum) s.dq_accum = p.dq_accum + i64(e.q_start) * p.fwd.head_dim;
    return s;
  }
  // bind's params written once by thread 0 to `at` (shared memory, 8-byte aligned,
  // sizeof(P) bytes) and read from there by every thread after a block barrier: for
  // a kernel short of registers, whose loop then reads the sequence's lengths and
  // band where it uses them (the barriers in its loop keep the compiler from
  // hoisting the loads into registers). Every thread of the block must call it.
  template <class T, class P>
  __device__ __forceinline__ static const P& bind_shared(const P& p, const Extent& e, void* at) {
    P* slot = static_cast<P*>(at);
    if (threadIdx.x == 0) *slot = bind<T>(p, e);
    __syncthreads();
    return *slot;
  }
  // Block x of a grid over the virtual blocks of BLOCK query rows (KEYS: keys) of
  // every sequence, z = 1: its sequence b, its block m there (m * BLOCK may lie past
  // the sequence's end: the caller returns), and the sequence's params in shared
  // memory at `at` (bind_shared). Every thread of the block must call it.
  template <class T, int BLOCK, bool KEYS, class P>
  __device__ __forceinline__ static const P& bind_block(const P& p, int x, int& b, int& m,
                                                        void* at) {
    const FwdParams& f = fwd_of(p);
    locate_warp(KEYS ? f.cu_seqlens_k : f.cu_seqlens_q, f.batch, BLOCK, x, b, m);
    return bind_shared<T>(p, extent(f, b), at);
  }
  // The same over the grid (virtual blocks, heads, 1), the last block first where
  // LAST_FIRST (FixedSeqs::bind_grid's counterpart; no sections).
  template <class T, int BLOCK, bool KEYS, bool LAST_FIRST, bool SECTIONS, class P>
  __device__ __forceinline__ static const P& bind_grid(const P& p, int, int& m, int& h, int& b,
                                                       void* at) {
    h = blockIdx.y;
    return bind_block<T, BLOCK, KEYS>(
        p, LAST_FIRST ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x), b, m, at);
  }
  // The same with the params in registers (a kernel with registers to spare, or no
  // shared memory left for them): a copy.
  template <class T, int BLOCK, bool KEYS, class P>
  __device__ __forceinline__ static P bind_block_regs(const P& p, int x, int& b, int& m) {
    const FwdParams& f = fwd_of(p);
    locate_warp(KEYS ? f.cu_seqlens_k : f.cu_seqlens_q, f.batch, BLOCK, x, b, m);
    return bind<T>(p, extent(f, b));
  }
};

template <bool PAGED>
struct CachedSeqs {
  static constexpr bool kRagged = false;
  static constexpr bool kCached = true;
  static constexpr bool kPaged = PAGED;
  // Entry b's keys (seqlens[b], or the capacity where the cache has no lengths).
  struct Extent {
    int seqlen_k;
  };
  template <class P>
  using Bound = P;
  template <class T>
  __device__ __forceinline__ static FwdParams bind(const FwdParams& p, const Extent& e) {
    FwdParams s = p;
    s.seqlen_k = e.seqlen_k;
    s.band_lo += e.seqlen_k - p.seqlen_q;
    s.band_hi += e.seqlen_k - p.seqlen_q;
    return s;
  }
};
