// Global -> shared tile copies for the tensor-core kernels (sm_80+).
//
// A tile is ROWS rows of D elements, row stride `stride` (elements) in global
// memory, stored in shared memory rows of SROW elements. Columns D..D_PAD-1 and
// rows outside [row_lo, row_hi) are zero-filled, so padding contributes exact
// zeros to every mma (and NaN in rows a kernel must ignore never enters one).
// With VEC (16-byte aligned base pointer and strides, D % 8 == 0) every 16-byte
// chunk is one cp.async: the caller commits and waits. Otherwise elements are
// copied with plain loads and stores, visible after the caller's barrier.
// `head` is any valid address of the tensor: a zero-filling cp.async reads 0
// bytes from it, so no pointer past the tensor's end is formed.
#pragma once
#include "mma.cuh"

// The shared rows of a tile of D_PAD 16-bit columns.
//   Padded (SWIZZLE false): rows D_PAD + 8 elements apart, so the 8 row addresses
//   of an ldmatrix fall in distinct banks.
//   Swizzled (D_PAD a multiple of 64: rows of whole 128-byte lines): rows D_PAD
//   apart, 16-byte chunk c of row r stored as chunk c ^ (r % 8). An ldmatrix's 8
//   rows (r % 8 all different) still meet 8 different bank groups, and the 128-byte
//   line a cp.async brings from a global row fills one line of shared memory, where
//   in a padded row (r % 8 != 0) it straddles two: ncu counted 2.2x the ideal
//   shared-memory wavefronts for flash_mma's copies (notes-bwd-loops.md section 23).
template <int D_PAD, bool SWIZZLE>
struct SmemRows {
  static_assert(!SWIZZLE || D_PAD % 64 == 0, "swizzled rows are whole 128-byte lines");
  static constexpr int STRIDE = SWIZZLE ? D_PAD : D_PAD + 8;  // elements
  // Element offset of (row, col).
  __device__ __forceinline__ static int at(int row, int col) {
    if constexpr (SWIZZLE) return row * STRIDE + (((col >> 3) ^ (row & 7)) << 3) + (col & 7);
    else return row * STRIDE + col;
  }
  // The shared address of chunk c (even; a constant once unrolled) past `lane`, an
  // ldmatrix lane's address at(r, 8 b) with b = 0 or 1, plus any multiple of 128
  // bytes: swizzled, chunk b + c of row r sits at chunk (c ^ b ^ r % 8), which is
  // `lane` with bits 4-6 XORed by c % 8 and c - c % 8 chunks on.
  __device__ __forceinline__ static u32 step(u32 lane, int c) {
    if constexpr (SWIZZLE) return (lane ^ u32((c & 7) << 4)) + u32((c & ~7) << 4);
    else return lane + u32(c * 16);
  }
};

template <int ROWS, int D, int D_PAD, int SROW, int THREADS, bool VEC, bool SWIZZLE = false,
          class T>
__device__ __forceinline__ void copy_tile(T* s, const T* g, i64 stride, int row_lo, int row_hi,
                                          const T* head) {
  using Rows = SmemRows<D_PAD, SWIZZLE>;
  static_assert(!SWIZZLE || SROW == Rows::STRIDE, "swizzled rows are D_PAD apart");
  // element (r, col) of the tile (padded rows: the expression as it always was)
  const auto at = [s](int r, int col) { return SWIZZLE ? s + Rows::at(r, col) : s + r * SROW + col; };
  if constexpr (VEC) {
    constexpr int CHUNKS = D_PAD / 8;
    constexpr int ROW_STEP = THREADS % CHUNKS == 0 ? THREADS / CHUNKS : 0;
    // Four chunks a thread or more; two or three in tiles of 64 x 64 or more (the D = 32
    // forward's 64 x 32 key tiles spilled 16 bytes on sm_80 with it).
    constexpr bool STEPPED =
        ROW_STEP > 0 && (ROWS >= 4 * ROW_STEP || (ROWS >= 2 * ROW_STEP && ROWS * D_PAD >= 64 * 64));
    if constexpr (STEPPED) {
      // A thread keeps its column and steps ROW_STEP rows at a time, its addresses
      // computed once: the general loop below spends ~30-40 instructions a chunk on
      // them (flash_mma, H100: notes-kernel-comments.md, notes-bwd-loops.md).
      // Unrolled by four: fully, the addresses stayed live and spilled at D = 128.
      const int r0 = threadIdx.x / CHUNKS, col = (threadIdx.x % CHUNKS) * 8;
      const bool col_ok = col < D;
      const T* src = g + r0 * stride + col;
      const i64 src_step = ROW_STEP * stride;
      const u32 dst = smem_addr(at(r0, col));
#pragma unroll 4
      for (int i = 0; i < CeilDiv<ROWS, ROW_STEP>::value; ++i, src += src_step) {
        const int r = r0 + i * ROW_STEP;
        if (ROWS % ROW_STEP == 0 || r < ROWS) {
          const bool ok = col_ok && r >= row_lo && r < row_hi;
          // swizzled with ROW_STEP % 8 != 0: row r's chunk moves with r % 8
          const u32 d = SWIZZLE && ROW_STEP % 8 != 0
                            ? smem_addr(at(r, col))
                            : dst + i * ROW_STEP * SROW * int(sizeof(T));
          cp_async_16(d, ok ? src : head, ok);
        }
      }
    } else {
#pragma unroll
      for (int c = threadIdx.x; c < ROWS * CHUNKS; c += THREADS) {
        const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
        const bool ok = r >= row_lo && r < row_hi && col < D;
        cp_async_16(smem_addr(at(r, col)), ok ? g + r * stride + col : head, ok);
      }
    }
  } else {
    for (int e = threadIdx.x; e < ROWS * D_PAD; e += THREADS) {
      const int r = e / D_PAD, col = e % D_PAD;
      T x;
      x.bits = 0;
      if (r >= row_lo && r < row_hi && col < D) x = g[r * stride + col];
      if constexpr (SWIZZLE) *at(r, col) = x;
      else s[r * SROW + col] = x;
    }
  }
}

// 4-byte global -> shared copy (.ca: the only cp.async form that takes 4 bytes);
// src_bytes = 0 writes zero.
__device__ __forceinline__ void cp_async_4(u32 dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
               :: "r"(dst), "l"(src), "r"(valid ? 4 : 0));
}

// A counter in global memory that blocks hand turns over with, at GPU scope: read
// with acquire semantics (this thread's later accesses stay after the read) and
// added to with release semantics (its earlier accesses stay before the addition).
__device__ __forceinline__ int ld_acquire_gpu(const int* counter) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_gpu_add(int* counter, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" :: "l"(counter), "r"(v) : "memory");
}

// dst[0] += a, dst[1] += b in global memory, no return value. sm_90 has a
// two-float reduction (one instruction, half the memory transactions); dst must
// be 8-byte aligned there.
__device__ __forceinline__ void red_add_f32x2(float* dst, float a, float b) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" :: "l"(dst), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}
