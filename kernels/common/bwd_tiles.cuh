// What the two tensor-core dK/dV kernels (flash_mma_bwd.cu, flash_wgmma_bwd.cu)
// share: the walk over query tiles of a block of keys, and the copy of a query
// tile's lse and delta into shared memory; and the row conversion of fp32 sums that
// flash_bwd.cu's row kernels and flash_wgmma_bwd_dq_convert share.
#pragma once
#include "copy.cuh"
#include "variant.cuh"

// A block of BLOCK_N keys from n0 meets every query head of its KV head's GQA group
// and, per head, the BLOCK_M-row query tiles whose rows see one of its keys (the
// variant's q_begin, q_end: causal, query i sees key n0 first at i = n0 - offset):
// tiles [first, first + tiles). Iteration `it` is, by default, tile first + it %
// tiles of query head h_kv * group + it / tiles; a tile's rows outside [row_lo,
// row_hi) attend no key of the block or lie past the sequence.
// LOCKSTEP (flash_wgmma_bwd's ordered dQ without an upper bound): tile first +
// tiles - 1 - it / group of head h_kv * group + it % group, the last tile first and
// the group's heads innermost. The walks of a band's key blocks end on
// nondecreasing tiles, so key block n - 1 reaches every tile it shares with block n
// no later than n does (on the same iteration without a lower bound).
template <int BLOCK_M, int BLOCK_N, class VT, bool LOCKSTEP = false>
struct QueryTileWalk {
  int first, tiles, iters;
  Divisor by;  // iterations per head's tile (LOCKSTEP: the group's heads)
  __device__ __forceinline__ QueryTileWalk(const FwdParams& f, int n0)
      : first(VT::q_begin(f, n0) / BLOCK_M),
        tiles(cmax(0, ceil_div(VT::q_end(f, n0 + BLOCK_N - 1), BLOCK_M) - first)),
        iters(f.group * tiles), by(LOCKSTEP ? f.group : tiles) {}
  // group: f.group
  __device__ __forceinline__ int head(int it, int h_kv, int group) const {
    return h_kv * group + (LOCKSTEP ? by.mod(it) : by.div(it));
  }
  __device__ __forceinline__ int m0(int it, int group) const {
    return (LOCKSTEP ? first + tiles - 1 - by.div(it) : first + by.mod(it)) * BLOCK_M;
  }
  // The default walk's iterations in order without a division per tile: `tile`
  // starts at iteration 0 (the first tile of the group's first head, offset hg = 0)
  // and `advance` steps it to the next iteration.
  struct Tile {
    int hg, m0;  // query head h_kv * group + hg, first row m0
  };
  __device__ __forceinline__ Tile tile0() const { return {0, first * BLOCK_M}; }
  __device__ __forceinline__ void advance(Tile& t) const {
    static_assert(!LOCKSTEP, "the lockstep walk keeps head() and m0()");
    t.m0 += BLOCK_M;
    if (t.m0 == (first + tiles) * BLOCK_M) {
      t.m0 = first * BLOCK_M;
      ++t.hg;
    }
  }
  __device__ __forceinline__ static int row_lo(const FwdParams& f, int m0) {
    return cmax(0, VT::q_begin(f, 0) - m0);
  }
  __device__ __forceinline__ static int row_hi(const FwdParams& f, int m0) {
    return f.seqlen_q - m0;
  }
  // The key blocks whose walks reach tile m0 are lowest_block .. highest_block: its
  // first row's first key on (a walk's last tile is the last whose first row sees
  // one of the block's keys), up to the last key its last row would see (a walk's
  // first tile is the first whose last row would, rows past Sq too: q_begin is not
  // clipped to Sq).
  __device__ __forceinline__ static int lowest_block(const FwdParams& f, int m0) {
    return VT::kv_begin(f, m0) / BLOCK_N;
  }
  __device__ __forceinline__ static int highest_block(const FwdParams& f, int m0) {
    return (VT::kv_end(f, m0 + BLOCK_M - 1) - 1) / BLOCK_N;
  }
};

// lse then delta of rows m0..m0 + BLOCK_M - 1 (2 * BLOCK_M floats at shared address
// dst, rows >= rows_valid zero-filled), one 4-byte cp.async by each of the first
// 2 * BLOCK_M threads (value c: thread c, unless told); the caller commits. `head`
// is any valid float address.
template <int BLOCK_M>
__device__ __forceinline__ void copy_row_stats(u32 dst, const float* lse, const float* delta,
                                               int rows_valid, const float* head,
                                               int c = threadIdx.x) {
  if (c < 2 * BLOCK_M) {
    const int r = c < BLOCK_M ? c : c - BLOCK_M;
    const bool ok = r < rows_valid;
    cp_async_4(dst + 4 * c, ok ? (c < BLOCK_M ? lse + r : delta + r) : head, ok);
  }
}

// Rows of D elements by ROW_LANES lanes each (flash_bwd.cu's row kernels, ROW_BLOCK rows
// a block of 256 threads), in 16-byte chunks (Chunk<T>: 8 16-bit or 4 fp32 elements)
// where a row's arrays start 16-byte aligned and D is a multiple of a chunk.
constexpr int ROW_LANES = 8;
constexpr int ROW_BLOCK = 256 / ROW_LANES;

template <class T>
union Chunk {
  static constexpr int E = 16 / int(sizeof(T));
  uint4 raw;
  T e[E];
};

__device__ __forceinline__ bool aligned16(const void* a) {
  return (reinterpret_cast<unsigned long long>(a) & 15u) == 0;
}

// dq_accum's rows in groups of 8 (ROWS8: the atomic dQ of flash_mma_bwd and of
// flash_wgmma_bwd's unstaged tiles, whose reductions then cover two whole 128-byte
// lines each instead of eight rows' sectors): the 8
// rows x D floats of a group are D / 8 blocks of 8 x 8 floats, row-major, so that
// row r % 8, column d of a group sits at (d / 8) 64 + (r % 8) 8 + d % 8. The group
// of row r starts at row r - r % 8 of the row-major layout (D % 8 == 0, and the
// rows of each (batch, head) start on a group: Sq % 8 == 0).
__device__ __forceinline__ int rows8_col(int d) { return (d >> 3) * 64 + (d & 7); }

// out[0, D) = from_float(acc[0, D) * scale), by one row's ROW_LANES lanes. L2_ONLY:
// the sums read through the L2 only (ld.global.cg), where a block converts rows that
// other blocks finished while this kernel runs (a line that another tile's rows share
// may be in this SM's L1 from before). ROWS8: acc is the row's first float in the
// grouped layout above (column d at acc + rows8_col(d)).
template <class T, bool L2_ONLY = false, bool ROWS8 = false>
__device__ __forceinline__ void convert_row(T* out, const float* acc, int head_dim, float scale,
                                            int lane) {
  using C = Chunk<T>;
  if (head_dim % C::E == 0 && aligned16(out) && aligned16(acc)) {
    for (int c = lane; c < head_dim / C::E; c += ROW_LANES) {
      C y;
#pragma unroll
      for (int q = 0; q < C::E / 4; ++q) {
        const int j = ROWS8 ? rows8_col(4 * (c * (C::E / 4) + q)) / 4 : c * (C::E / 4) + q;
        float4 a;
        if constexpr (L2_ONLY) a = __ldcg(reinterpret_cast<const float4*>(acc) + j);
        else a = reinterpret_cast<const float4*>(acc)[j];
        y.e[4 * q] = from_float<T>(a.x * scale);
        y.e[4 * q + 1] = from_float<T>(a.y * scale);
        y.e[4 * q + 2] = from_float<T>(a.z * scale);
        y.e[4 * q + 3] = from_float<T>(a.w * scale);
      }
      reinterpret_cast<uint4*>(out)[c] = y.raw;
    }
  } else {
    for (int d = lane; d < head_dim; d += ROW_LANES) {
      const float* a = acc + (ROWS8 ? rows8_col(d) : d);
      out[d] = from_float<T>((L2_ONLY ? __ldcg(a) : *a) * scale);
    }
  }
}
