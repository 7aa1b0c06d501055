// Hopper (sm_90a) warpgroup MMA building blocks: wgmma.mma_async, its fences, and
// the swizzled shared-memory tiles and their matrix descriptors.
//
// A warpgroup is 4 consecutive warps (128 threads, the first warp index a multiple
// of 4). `wgmma.mma_async.m64nNk16` computes D[64 x N] (+)= A[64 x 16] B[16 x N]:
//   A   from shared memory (a descriptor) or registers: warp w of the group holds
//       rows 16w..16w+15 in exactly the A-fragment layout of mma.m16n8k16 (mma.cuh)
//   B   from shared memory (a descriptor), K-major (rows of B^T contiguous, as K in
//       S = Q K^T) or MN-major (tnspB = 1, rows of B contiguous, as V in O = P V)
//   D   fp32 registers, N/2 per thread: d[4i..4i+3] is mma.m16n8k16's C fragment of
//       columns 8i..8i+7 for the warp's 16 rows. So an accumulator rounded to 16
//       bits is the register A operand of the next wgmma, as with mma.sync.
// The MMA runs asynchronously: wgmma_fence() before the first wgmma that reads
// registers written by ordinary code, wgmma_commit() closes a group,
// wgmma_wait<N>() returns once at most N groups are pending. The compiler does not
// know the accumulators change after the asm statement returns: fence_regs()
// pins them (an empty asm that "writes" each register) after each wait, so no read
// of a result (or new write of an A fragment) is scheduled before the wait.
//
// Shared layout (both operand majors): SwizzledTile<R, W> stores a tile of R rows x
// W 16-bit columns as ceil(W / 64) column blocks of R rows x 128 bytes, block after
// block; the 16-byte chunk c of row r sits at chunk c ^ (r % 8) of its 128-byte row
// (the hardware's 128-byte swizzle, defined on address bits, so every block starts
// on a 1024-byte boundary). Rows of 128 bytes put the 8 rows an MMA reads together in
// distinct banks once swizzled. Columns W.. of the last block are storage only: K
// steps over W rounded to 16, and a wgmma's N may stop inside a block (N = 96 reads
// one and a half blocks). The 64- and 32-byte swizzles would store a head dim of 96
// without that padding, but a wgmma reading them ran 25-35% slower than one reading
// the padded 128-byte layout (H200, flash_wgmma at D = 96, 112, 160), so all tiles
// use 128-byte rows. Descriptor fields for this layout (PTX ISA, "Matrix Descriptor
// Format"; byte offsets, encoded >> 4):
//   K-major  start = block + 32 * (k16 step within the block)    SBO = 1024 (8 rows)
//            LBO unused with swizzling (encoded 1)
//   MN-major start = first of the 16 K-rows (offset 16 * 128)    SBO = 1024 (8 K-rows)
//            LBO = R * 128 (next 64-column block along N)
// SwizzledTile<R, W, C> with C < R (a multiple of 16 dividing R) stores the rows in
// chunks of C, each chunk its own C-row tile of every column block, chunk after chunk:
// one copy-engine box then fills all columns of C rows (the decode's paged caches).
// The descriptors above hold within a chunk (BLOCK_BYTES = C * 128 is the LBO), so a
// K-major operand takes at most C rows per wgmma (N <= C) and an MN-major one k16
// steps that each lie in one chunk.
// Writers: cp.async lands in the generic proxy and wgmma reads through the async
// proxy, so each writing thread runs fence_proxy_async() after its copies landed
// and before the barrier that publishes them.
#pragma once
#include "tma.cuh"
#include "types.cuh"

__device__ __forceinline__ u64 smem_desc(u32 addr, u32 lbo_bytes, u32 sbo_bytes) {
  return u64((addr & 0x3FFFF) >> 4) | (u64(lbo_bytes >> 4) << 16) | (u64(sbo_bytes >> 4) << 32) |
         (1ull << 62);  // 128-byte swizzle
}

// The descriptor of an address `bytes` (a multiple of 16) further on: only the
// start-address field (bits 0-13, address >> 4) changes, and it cannot carry into
// the next field (shared addresses stay below 2^18). One 32-bit add per k16 step
// where rebuilding the descriptor costs an add, a mask, a shift and an or.
__device__ __forceinline__ u64 desc_advance(u64 desc, u32 bytes) {
  return (desc & ~0xFFFFFFFFull) | u32(u32(desc) + (bytes >> 4));
}

template <int R, int W, int C = R>
struct SwizzledTile {
  static_assert(R % 8 == 0 && W % 16 == 0 && W <= 256, "whole swizzle atoms, k16 steps");
  static_assert(C == R || (C % 16 == 0 && R % C == 0), "chunks of whole k16 steps");
  static constexpr int BLOCK_BYTES = C * 128;                 // one 64-column block (of a chunk)
  static constexpr int CHUNK_BYTES = CeilDiv<W, 64>::value * BLOCK_BYTES;
  static constexpr int BYTES = R / C * CHUNK_BYTES;

  // Byte offset of row r's first chunk; with C < R, row_offset(r0 + dr) = row_offset(r0) +
  // row_offset(dr) for dr a multiple of C.
  __host__ __device__ static constexpr u32 row_offset(int r) {
    return C == R ? r * 128 : (r / C) * CHUNK_BYTES + (r % C) * 128;
  }
  // Byte offset of 16-byte chunk c (columns 8c..8c+7) of row r.
  __device__ __forceinline__ static u32 offset(int r, int c) {
    return row_offset(r) + (c / 8) * BLOCK_BYTES + (((c % 8) ^ (r % 8)) * 16);
  }
  // A thread's stores into the tile with the swizzle's run-time part computed once:
  // lane(tile, r0, c0) is chunk c0 of row r0 (tile 1024-byte aligned), and at(lane,
  // dr, dc) chunk c0 + dc of row r0 + dr, for dr a multiple of 8 (of C where C < R)
  // and dc whose low three bits miss c0's (so (c0 + dc) % 8 = c0 % 8 ^ dc % 8, no
  // carry): one XOR with a constant per dc % 8, the rest the store's immediate offset.
  __device__ __forceinline__ static u32 lane(u32 tile, int r0, int c0) {
    return tile + offset(r0, c0);
  }
  __device__ __forceinline__ static u32 at(u32 lane_addr, int dr, int dc) {
    return (lane_addr ^ u32((dc % 8) * 16)) + (dc / 8) * BLOCK_BYTES + row_offset(dr);
  }
  // K-major operand (A, or B^T's rows): k16 step ks (columns 16ks..16ks+15) of the
  // rows from row0 (a multiple of 8) of the tile at shared address `tile`.
  // A loop over k16 steps can instead build the step-0 descriptor once and
  // advance it: desc_advance(kmajor(tile, row0, 0), kmajor_offset(ks)).
  __device__ __forceinline__ static u64 kmajor(u32 tile, int row0, int ks) {
    return smem_desc(tile + row_offset(row0) + kmajor_offset(ks), 16, 1024);
  }
  __host__ __device__ static constexpr u32 kmajor_offset(int ks) {
    return (ks / 4) * BLOCK_BYTES + (ks % 4) * 32;
  }
  // MN-major B operand: K-rows 16ks..16ks+15, N columns from column 0.
  __device__ __forceinline__ static u64 mnmajor(u32 tile, int ks) {
    return smem_desc(tile + mnmajor_offset(ks), BLOCK_BYTES, 1024);
  }
  __host__ __device__ static constexpr u32 mnmajor_offset(int ks) { return row_offset(16 * ks); }
};

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
// Barrier of the 128 threads of warpgroup `wg` (named barrier 1 + wg; 0 is
// __syncthreads'). Shared-memory accesses do not move across it.
__device__ __forceinline__ void warpgroup_barrier(int wg) {
  asm volatile("bar.sync %0, 128;" :: "r"(1 + wg) : "memory");
}
// Named barrier `id` completing after `count` threads: sync waits for it, arrive
// counts without waiting (writes before an arrive are visible after the sync).
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(count) : "memory");
}
// named_barrier_sync for a barrier that warps of different roles wait in from
// different code: bar.sync is barrier.sync.aligned, which promises one barrier
// instruction for every thread (compute-sanitizer's synccheck holds a kernel to it).
__device__ __forceinline__ void role_barrier_sync(int id, int count) {
  asm volatile("barrier.sync %0, %1;" :: "r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ void role_barrier_arrive(int id, int count) {
  asm volatile("barrier.arrive %0, %1;" :: "r"(id), "r"(count) : "memory");
}

// Hand registers between warpgroups (every thread of the warpgroup runs it).
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(N));
}
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i]) :: "memory");
}
// The same for register A fragments that an in-flight wgmma still reads: no new
// value is written to them before the wait that precedes this fence.
template <int M, int N>
__device__ __forceinline__ void fence_regs(u32 (&r)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int k = 0; k < N; ++k) asm volatile("" : "+r"(r[i][k]) :: "memory");
}

// Wgmma<N>::ss<TRANS_A = 0, TRANS_B = 0>(d, a_desc, b_desc, accumulate, T{})
//     d (+)= A B, A and B in shared memory (K-major, or MN-major where TRANS_* = 1);
//     accumulate = 0 overwrites d
// Wgmma<N>::rs<TRANS_B = 1>(d, a, b_desc, T{})
//     d += A B, A in registers, B MN-major (K-major with TRANS_B = 0)
// PTX names every accumulator register, so each N is written out: the wrappers are
// generated into wgmma_ops.cuh by scripts/gen_wgmma.py.
template <int N> struct Wgmma;
#include "wgmma_ops.cuh"

// Where a pipeline of STAGES shared buffers stands for one side (producer or
// consumer): the buffer of the next tile and the parity of its mbarrier phase.
// Both sides advance once per tile they load or consume, in the same order, so
// which key tile that is (in order, paged, block-sparse) is no concern of theirs.
template <int STAGES>
struct PipelineState {
  // index (the buffer of the next tile) and phase (the parity of its full phase for
  // a consumer, of its empty phase from the second round on for a producer), packed
  // as index * 2 + phase: one register where consumers have none to spare.
  int bits = 0;
  __device__ __forceinline__ int index() const { return bits >> 1; }
  __device__ __forceinline__ int phase() const { return bits & 1; }
  __device__ __forceinline__ void advance() {
    bits += 2;
    if (bits >> 1 == STAGES) bits = (bits & 1) ^ 1;
  }
  // The state one tile back: a consumer whose second operand lags one tile behind
  // (flash_wgmma: V_{j-1} beside K_j) keeps one state, not two.
  __device__ __forceinline__ PipelineState prev() const {
    PipelineState s;
    s.bits = bits >= 2 ? bits - 2 : (2 * (STAGES - 1)) | (bits ^ 1);
    return s;
  }
};
