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
// Writers: cp.async lands in the generic proxy and wgmma reads through the async
// proxy, so each writing thread runs fence_proxy_async() after its copies landed
// and before the barrier that publishes them.
#pragma once
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

template <int R, int W>
struct SwizzledTile {
  static_assert(R % 8 == 0 && W % 16 == 0 && W <= 256, "whole swizzle atoms, k16 steps");
  static constexpr int BLOCK_BYTES = R * 128;                 // one 64-column block
  static constexpr int BYTES = CeilDiv<W, 64>::value * BLOCK_BYTES;

  // Byte offset of 16-byte chunk c (columns 8c..8c+7) of row r.
  __device__ __forceinline__ static u32 offset(int r, int c) {
    return (c / 8) * BLOCK_BYTES + r * 128 + (((c % 8) ^ (r % 8)) * 16);
  }
  // K-major operand (A, or B^T's rows): k16 step ks (columns 16ks..16ks+15) of the
  // rows from row0 (a multiple of 8) of the tile at shared address `tile`.
  // A loop over k16 steps can instead build the step-0 descriptor once and
  // advance it: desc_advance(kmajor(tile, row0, 0), kmajor_offset(ks)).
  __device__ __forceinline__ static u64 kmajor(u32 tile, int row0, int ks) {
    return smem_desc(tile + row0 * 128 + kmajor_offset(ks), 16, 1024);
  }
  static constexpr u32 kmajor_offset(int ks) { return (ks / 4) * BLOCK_BYTES + (ks % 4) * 32; }
  // MN-major B operand: K-rows 16ks..16ks+15, N columns from column 0.
  __device__ __forceinline__ static u64 mnmajor(u32 tile, int ks) {
    return smem_desc(tile + mnmajor_offset(ks), BLOCK_BYTES, 1024);
  }
  static constexpr u32 mnmajor_offset(int ks) { return ks * 16 * 128; }
};

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
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

// mbarriers (8 bytes of shared memory each): a phase completes after `count`
// arrivals; a waiter names the parity of the phase it waits for (0, 1, 0, ...).
__device__ __forceinline__ void mbarrier_init(u32 bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(u32 bar, int parity) {
  asm volatile(
      "{.reg .pred done;\n"
      "wait_%=: mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;}" :: "r"(bar), "r"(parity) : "memory");
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
// PTX names every accumulator register, so each N is written out; the block below
// is generated by scripts/gen_wgmma.py.
template <int N> struct Wgmma;
// BEGIN generated by scripts/gen_wgmma.py
#define CA_WG_REGS_16 "{%0,%1,%2,%3,%4,%5,%6,%7}"
#define CA_WG_OUTS_16 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
template <> struct Wgmma<16> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[8], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %10, 0; " "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 " CA_WG_REGS_16 ", %8, %9, p, 1, 1, %11, %12;}"
                 : CA_WG_OUTS_16 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[8], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 " CA_WG_REGS_16 ", {%8,%9,%10,%11}, %12, 1, 1, 1, %13;"
                 : CA_WG_OUTS_16 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[8], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %10, 0; " "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 " CA_WG_REGS_16 ", %8, %9, p, 1, 1, %11, %12;}"
                 : CA_WG_OUTS_16 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[8], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 " CA_WG_REGS_16 ", {%8,%9,%10,%11}, %12, 1, 1, 1, %13;"
                 : CA_WG_OUTS_16 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_24 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11}"
#define CA_WG_OUTS_24 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
template <> struct Wgmma<24> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[12], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %14, 0; " "wgmma.mma_async.sync.aligned.m64n24k16.f32.f16.f16 " CA_WG_REGS_24 ", %12, %13, p, 1, 1, %15, %16;}"
                 : CA_WG_OUTS_24 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[12], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n24k16.f32.f16.f16 " CA_WG_REGS_24 ", {%12,%13,%14,%15}, %16, 1, 1, 1, %17;"
                 : CA_WG_OUTS_24 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[12], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %14, 0; " "wgmma.mma_async.sync.aligned.m64n24k16.f32.bf16.bf16 " CA_WG_REGS_24 ", %12, %13, p, 1, 1, %15, %16;}"
                 : CA_WG_OUTS_24 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[12], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n24k16.f32.bf16.bf16 " CA_WG_REGS_24 ", {%12,%13,%14,%15}, %16, 1, 1, 1, %17;"
                 : CA_WG_OUTS_24 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_32 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define CA_WG_OUTS_32 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
template <> struct Wgmma<32> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[16], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %18, 0; " "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " CA_WG_REGS_32 ", %16, %17, p, 1, 1, %19, %20;}"
                 : CA_WG_OUTS_32 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[16], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " CA_WG_REGS_32 ", {%16,%17,%18,%19}, %20, 1, 1, 1, %21;"
                 : CA_WG_OUTS_32 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[16], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %18, 0; " "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " CA_WG_REGS_32 ", %16, %17, p, 1, 1, %19, %20;}"
                 : CA_WG_OUTS_32 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[16], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " CA_WG_REGS_32 ", {%16,%17,%18,%19}, %20, 1, 1, 1, %21;"
                 : CA_WG_OUTS_32 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_40 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19}"
#define CA_WG_OUTS_40 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19])
template <> struct Wgmma<40> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[20], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %22, 0; " "wgmma.mma_async.sync.aligned.m64n40k16.f32.f16.f16 " CA_WG_REGS_40 ", %20, %21, p, 1, 1, %23, %24;}"
                 : CA_WG_OUTS_40 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[20], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n40k16.f32.f16.f16 " CA_WG_REGS_40 ", {%20,%21,%22,%23}, %24, 1, 1, 1, %25;"
                 : CA_WG_OUTS_40 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[20], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %22, 0; " "wgmma.mma_async.sync.aligned.m64n40k16.f32.bf16.bf16 " CA_WG_REGS_40 ", %20, %21, p, 1, 1, %23, %24;}"
                 : CA_WG_OUTS_40 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[20], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n40k16.f32.bf16.bf16 " CA_WG_REGS_40 ", {%20,%21,%22,%23}, %24, 1, 1, 1, %25;"
                 : CA_WG_OUTS_40 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_48 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23}"
#define CA_WG_OUTS_48 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
template <> struct Wgmma<48> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[24], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %26, 0; " "wgmma.mma_async.sync.aligned.m64n48k16.f32.f16.f16 " CA_WG_REGS_48 ", %24, %25, p, 1, 1, %27, %28;}"
                 : CA_WG_OUTS_48 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[24], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n48k16.f32.f16.f16 " CA_WG_REGS_48 ", {%24,%25,%26,%27}, %28, 1, 1, 1, %29;"
                 : CA_WG_OUTS_48 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[24], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %26, 0; " "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 " CA_WG_REGS_48 ", %24, %25, p, 1, 1, %27, %28;}"
                 : CA_WG_OUTS_48 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[24], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 " CA_WG_REGS_48 ", {%24,%25,%26,%27}, %28, 1, 1, 1, %29;"
                 : CA_WG_OUTS_48 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_56 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27}"
#define CA_WG_OUTS_56 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27])
template <> struct Wgmma<56> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[28], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %30, 0; " "wgmma.mma_async.sync.aligned.m64n56k16.f32.f16.f16 " CA_WG_REGS_56 ", %28, %29, p, 1, 1, %31, %32;}"
                 : CA_WG_OUTS_56 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[28], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n56k16.f32.f16.f16 " CA_WG_REGS_56 ", {%28,%29,%30,%31}, %32, 1, 1, 1, %33;"
                 : CA_WG_OUTS_56 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[28], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %30, 0; " "wgmma.mma_async.sync.aligned.m64n56k16.f32.bf16.bf16 " CA_WG_REGS_56 ", %28, %29, p, 1, 1, %31, %32;}"
                 : CA_WG_OUTS_56 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[28], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n56k16.f32.bf16.bf16 " CA_WG_REGS_56 ", {%28,%29,%30,%31}, %32, 1, 1, 1, %33;"
                 : CA_WG_OUTS_56 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_64 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define CA_WG_OUTS_64 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
template <> struct Wgmma<64> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[32], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %34, 0; " "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " CA_WG_REGS_64 ", %32, %33, p, 1, 1, %35, %36;}"
                 : CA_WG_OUTS_64 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[32], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " CA_WG_REGS_64 ", {%32,%33,%34,%35}, %36, 1, 1, 1, %37;"
                 : CA_WG_OUTS_64 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[32], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %34, 0; " "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " CA_WG_REGS_64 ", %32, %33, p, 1, 1, %35, %36;}"
                 : CA_WG_OUTS_64 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[32], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " CA_WG_REGS_64 ", {%32,%33,%34,%35}, %36, 1, 1, 1, %37;"
                 : CA_WG_OUTS_64 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_72 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35}"
#define CA_WG_OUTS_72 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
template <> struct Wgmma<72> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[36], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %38, 0; " "wgmma.mma_async.sync.aligned.m64n72k16.f32.f16.f16 " CA_WG_REGS_72 ", %36, %37, p, 1, 1, %39, %40;}"
                 : CA_WG_OUTS_72 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[36], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n72k16.f32.f16.f16 " CA_WG_REGS_72 ", {%36,%37,%38,%39}, %40, 1, 1, 1, %41;"
                 : CA_WG_OUTS_72 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[36], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %38, 0; " "wgmma.mma_async.sync.aligned.m64n72k16.f32.bf16.bf16 " CA_WG_REGS_72 ", %36, %37, p, 1, 1, %39, %40;}"
                 : CA_WG_OUTS_72 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[36], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n72k16.f32.bf16.bf16 " CA_WG_REGS_72 ", {%36,%37,%38,%39}, %40, 1, 1, 1, %41;"
                 : CA_WG_OUTS_72 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_80 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39}"
#define CA_WG_OUTS_80 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
template <> struct Wgmma<80> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[40], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %42, 0; " "wgmma.mma_async.sync.aligned.m64n80k16.f32.f16.f16 " CA_WG_REGS_80 ", %40, %41, p, 1, 1, %43, %44;}"
                 : CA_WG_OUTS_80 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[40], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n80k16.f32.f16.f16 " CA_WG_REGS_80 ", {%40,%41,%42,%43}, %44, 1, 1, 1, %45;"
                 : CA_WG_OUTS_80 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[40], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %42, 0; " "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 " CA_WG_REGS_80 ", %40, %41, p, 1, 1, %43, %44;}"
                 : CA_WG_OUTS_80 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[40], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 " CA_WG_REGS_80 ", {%40,%41,%42,%43}, %44, 1, 1, 1, %45;"
                 : CA_WG_OUTS_80 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_88 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43}"
#define CA_WG_OUTS_88 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43])
template <> struct Wgmma<88> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[44], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %46, 0; " "wgmma.mma_async.sync.aligned.m64n88k16.f32.f16.f16 " CA_WG_REGS_88 ", %44, %45, p, 1, 1, %47, %48;}"
                 : CA_WG_OUTS_88 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[44], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n88k16.f32.f16.f16 " CA_WG_REGS_88 ", {%44,%45,%46,%47}, %48, 1, 1, 1, %49;"
                 : CA_WG_OUTS_88 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[44], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %46, 0; " "wgmma.mma_async.sync.aligned.m64n88k16.f32.bf16.bf16 " CA_WG_REGS_88 ", %44, %45, p, 1, 1, %47, %48;}"
                 : CA_WG_OUTS_88 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[44], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n88k16.f32.bf16.bf16 " CA_WG_REGS_88 ", {%44,%45,%46,%47}, %48, 1, 1, 1, %49;"
                 : CA_WG_OUTS_88 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_96 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}"
#define CA_WG_OUTS_96 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
template <> struct Wgmma<96> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[48], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %50, 0; " "wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 " CA_WG_REGS_96 ", %48, %49, p, 1, 1, %51, %52;}"
                 : CA_WG_OUTS_96 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[48], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 " CA_WG_REGS_96 ", {%48,%49,%50,%51}, %52, 1, 1, 1, %53;"
                 : CA_WG_OUTS_96 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[48], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %50, 0; " "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 " CA_WG_REGS_96 ", %48, %49, p, 1, 1, %51, %52;}"
                 : CA_WG_OUTS_96 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[48], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 " CA_WG_REGS_96 ", {%48,%49,%50,%51}, %52, 1, 1, 1, %53;"
                 : CA_WG_OUTS_96 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_104 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51}"
#define CA_WG_OUTS_104 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51])
template <> struct Wgmma<104> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[52], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %54, 0; " "wgmma.mma_async.sync.aligned.m64n104k16.f32.f16.f16 " CA_WG_REGS_104 ", %52, %53, p, 1, 1, %55, %56;}"
                 : CA_WG_OUTS_104 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[52], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n104k16.f32.f16.f16 " CA_WG_REGS_104 ", {%52,%53,%54,%55}, %56, 1, 1, 1, %57;"
                 : CA_WG_OUTS_104 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[52], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %54, 0; " "wgmma.mma_async.sync.aligned.m64n104k16.f32.bf16.bf16 " CA_WG_REGS_104 ", %52, %53, p, 1, 1, %55, %56;}"
                 : CA_WG_OUTS_104 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[52], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n104k16.f32.bf16.bf16 " CA_WG_REGS_104 ", {%52,%53,%54,%55}, %56, 1, 1, 1, %57;"
                 : CA_WG_OUTS_104 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_112 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55}"
#define CA_WG_OUTS_112 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
template <> struct Wgmma<112> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[56], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %58, 0; " "wgmma.mma_async.sync.aligned.m64n112k16.f32.f16.f16 " CA_WG_REGS_112 ", %56, %57, p, 1, 1, %59, %60;}"
                 : CA_WG_OUTS_112 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[56], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n112k16.f32.f16.f16 " CA_WG_REGS_112 ", {%56,%57,%58,%59}, %60, 1, 1, 1, %61;"
                 : CA_WG_OUTS_112 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[56], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %58, 0; " "wgmma.mma_async.sync.aligned.m64n112k16.f32.bf16.bf16 " CA_WG_REGS_112 ", %56, %57, p, 1, 1, %59, %60;}"
                 : CA_WG_OUTS_112 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[56], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n112k16.f32.bf16.bf16 " CA_WG_REGS_112 ", {%56,%57,%58,%59}, %60, 1, 1, 1, %61;"
                 : CA_WG_OUTS_112 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_120 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59}"
#define CA_WG_OUTS_120 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59])
template <> struct Wgmma<120> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[60], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %62, 0; " "wgmma.mma_async.sync.aligned.m64n120k16.f32.f16.f16 " CA_WG_REGS_120 ", %60, %61, p, 1, 1, %63, %64;}"
                 : CA_WG_OUTS_120 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[60], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n120k16.f32.f16.f16 " CA_WG_REGS_120 ", {%60,%61,%62,%63}, %64, 1, 1, 1, %65;"
                 : CA_WG_OUTS_120 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[60], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %62, 0; " "wgmma.mma_async.sync.aligned.m64n120k16.f32.bf16.bf16 " CA_WG_REGS_120 ", %60, %61, p, 1, 1, %63, %64;}"
                 : CA_WG_OUTS_120 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[60], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n120k16.f32.bf16.bf16 " CA_WG_REGS_120 ", {%60,%61,%62,%63}, %64, 1, 1, 1, %65;"
                 : CA_WG_OUTS_120 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_128 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
#define CA_WG_OUTS_128 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
template <> struct Wgmma<128> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[64], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %66, 0; " "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " CA_WG_REGS_128 ", %64, %65, p, 1, 1, %67, %68;}"
                 : CA_WG_OUTS_128 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[64], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " CA_WG_REGS_128 ", {%64,%65,%66,%67}, %68, 1, 1, 1, %69;"
                 : CA_WG_OUTS_128 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[64], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %66, 0; " "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " CA_WG_REGS_128 ", %64, %65, p, 1, 1, %67, %68;}"
                 : CA_WG_OUTS_128 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[64], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " CA_WG_REGS_128 ", {%64,%65,%66,%67}, %68, 1, 1, 1, %69;"
                 : CA_WG_OUTS_128 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_136 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67}"
#define CA_WG_OUTS_136 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67])
template <> struct Wgmma<136> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[68], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %70, 0; " "wgmma.mma_async.sync.aligned.m64n136k16.f32.f16.f16 " CA_WG_REGS_136 ", %68, %69, p, 1, 1, %71, %72;}"
                 : CA_WG_OUTS_136 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[68], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n136k16.f32.f16.f16 " CA_WG_REGS_136 ", {%68,%69,%70,%71}, %72, 1, 1, 1, %73;"
                 : CA_WG_OUTS_136 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[68], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %70, 0; " "wgmma.mma_async.sync.aligned.m64n136k16.f32.bf16.bf16 " CA_WG_REGS_136 ", %68, %69, p, 1, 1, %71, %72;}"
                 : CA_WG_OUTS_136 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[68], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n136k16.f32.bf16.bf16 " CA_WG_REGS_136 ", {%68,%69,%70,%71}, %72, 1, 1, 1, %73;"
                 : CA_WG_OUTS_136 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_144 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71}"
#define CA_WG_OUTS_144 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71])
template <> struct Wgmma<144> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[72], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %74, 0; " "wgmma.mma_async.sync.aligned.m64n144k16.f32.f16.f16 " CA_WG_REGS_144 ", %72, %73, p, 1, 1, %75, %76;}"
                 : CA_WG_OUTS_144 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[72], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n144k16.f32.f16.f16 " CA_WG_REGS_144 ", {%72,%73,%74,%75}, %76, 1, 1, 1, %77;"
                 : CA_WG_OUTS_144 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[72], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %74, 0; " "wgmma.mma_async.sync.aligned.m64n144k16.f32.bf16.bf16 " CA_WG_REGS_144 ", %72, %73, p, 1, 1, %75, %76;}"
                 : CA_WG_OUTS_144 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[72], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n144k16.f32.bf16.bf16 " CA_WG_REGS_144 ", {%72,%73,%74,%75}, %76, 1, 1, 1, %77;"
                 : CA_WG_OUTS_144 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_152 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75}"
#define CA_WG_OUTS_152 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75])
template <> struct Wgmma<152> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[76], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %78, 0; " "wgmma.mma_async.sync.aligned.m64n152k16.f32.f16.f16 " CA_WG_REGS_152 ", %76, %77, p, 1, 1, %79, %80;}"
                 : CA_WG_OUTS_152 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[76], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n152k16.f32.f16.f16 " CA_WG_REGS_152 ", {%76,%77,%78,%79}, %80, 1, 1, 1, %81;"
                 : CA_WG_OUTS_152 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[76], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %78, 0; " "wgmma.mma_async.sync.aligned.m64n152k16.f32.bf16.bf16 " CA_WG_REGS_152 ", %76, %77, p, 1, 1, %79, %80;}"
                 : CA_WG_OUTS_152 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[76], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n152k16.f32.bf16.bf16 " CA_WG_REGS_152 ", {%76,%77,%78,%79}, %80, 1, 1, 1, %81;"
                 : CA_WG_OUTS_152 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_160 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79}"
#define CA_WG_OUTS_160 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
template <> struct Wgmma<160> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[80], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %82, 0; " "wgmma.mma_async.sync.aligned.m64n160k16.f32.f16.f16 " CA_WG_REGS_160 ", %80, %81, p, 1, 1, %83, %84;}"
                 : CA_WG_OUTS_160 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[80], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n160k16.f32.f16.f16 " CA_WG_REGS_160 ", {%80,%81,%82,%83}, %84, 1, 1, 1, %85;"
                 : CA_WG_OUTS_160 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[80], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %82, 0; " "wgmma.mma_async.sync.aligned.m64n160k16.f32.bf16.bf16 " CA_WG_REGS_160 ", %80, %81, p, 1, 1, %83, %84;}"
                 : CA_WG_OUTS_160 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[80], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n160k16.f32.bf16.bf16 " CA_WG_REGS_160 ", {%80,%81,%82,%83}, %84, 1, 1, 1, %85;"
                 : CA_WG_OUTS_160 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_168 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83}"
#define CA_WG_OUTS_168 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83])
template <> struct Wgmma<168> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[84], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %86, 0; " "wgmma.mma_async.sync.aligned.m64n168k16.f32.f16.f16 " CA_WG_REGS_168 ", %84, %85, p, 1, 1, %87, %88;}"
                 : CA_WG_OUTS_168 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[84], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n168k16.f32.f16.f16 " CA_WG_REGS_168 ", {%84,%85,%86,%87}, %88, 1, 1, 1, %89;"
                 : CA_WG_OUTS_168 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[84], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %86, 0; " "wgmma.mma_async.sync.aligned.m64n168k16.f32.bf16.bf16 " CA_WG_REGS_168 ", %84, %85, p, 1, 1, %87, %88;}"
                 : CA_WG_OUTS_168 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[84], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n168k16.f32.bf16.bf16 " CA_WG_REGS_168 ", {%84,%85,%86,%87}, %88, 1, 1, 1, %89;"
                 : CA_WG_OUTS_168 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_176 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87}"
#define CA_WG_OUTS_176 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
template <> struct Wgmma<176> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[88], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %90, 0; " "wgmma.mma_async.sync.aligned.m64n176k16.f32.f16.f16 " CA_WG_REGS_176 ", %88, %89, p, 1, 1, %91, %92;}"
                 : CA_WG_OUTS_176 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[88], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n176k16.f32.f16.f16 " CA_WG_REGS_176 ", {%88,%89,%90,%91}, %92, 1, 1, 1, %93;"
                 : CA_WG_OUTS_176 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[88], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %90, 0; " "wgmma.mma_async.sync.aligned.m64n176k16.f32.bf16.bf16 " CA_WG_REGS_176 ", %88, %89, p, 1, 1, %91, %92;}"
                 : CA_WG_OUTS_176 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[88], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n176k16.f32.bf16.bf16 " CA_WG_REGS_176 ", {%88,%89,%90,%91}, %92, 1, 1, 1, %93;"
                 : CA_WG_OUTS_176 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_184 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91}"
#define CA_WG_OUTS_184 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91])
template <> struct Wgmma<184> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[92], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %94, 0; " "wgmma.mma_async.sync.aligned.m64n184k16.f32.f16.f16 " CA_WG_REGS_184 ", %92, %93, p, 1, 1, %95, %96;}"
                 : CA_WG_OUTS_184 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[92], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n184k16.f32.f16.f16 " CA_WG_REGS_184 ", {%92,%93,%94,%95}, %96, 1, 1, 1, %97;"
                 : CA_WG_OUTS_184 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[92], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %94, 0; " "wgmma.mma_async.sync.aligned.m64n184k16.f32.bf16.bf16 " CA_WG_REGS_184 ", %92, %93, p, 1, 1, %95, %96;}"
                 : CA_WG_OUTS_184 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[92], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n184k16.f32.bf16.bf16 " CA_WG_REGS_184 ", {%92,%93,%94,%95}, %96, 1, 1, 1, %97;"
                 : CA_WG_OUTS_184 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_192 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95}"
#define CA_WG_OUTS_192 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
template <> struct Wgmma<192> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[96], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %98, 0; " "wgmma.mma_async.sync.aligned.m64n192k16.f32.f16.f16 " CA_WG_REGS_192 ", %96, %97, p, 1, 1, %99, %100;}"
                 : CA_WG_OUTS_192 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[96], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n192k16.f32.f16.f16 " CA_WG_REGS_192 ", {%96,%97,%98,%99}, %100, 1, 1, 1, %101;"
                 : CA_WG_OUTS_192 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[96], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %98, 0; " "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 " CA_WG_REGS_192 ", %96, %97, p, 1, 1, %99, %100;}"
                 : CA_WG_OUTS_192 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[96], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 " CA_WG_REGS_192 ", {%96,%97,%98,%99}, %100, 1, 1, 1, %101;"
                 : CA_WG_OUTS_192 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_200 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99}"
#define CA_WG_OUTS_200 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99])
template <> struct Wgmma<200> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[100], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %102, 0; " "wgmma.mma_async.sync.aligned.m64n200k16.f32.f16.f16 " CA_WG_REGS_200 ", %100, %101, p, 1, 1, %103, %104;}"
                 : CA_WG_OUTS_200 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[100], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n200k16.f32.f16.f16 " CA_WG_REGS_200 ", {%100,%101,%102,%103}, %104, 1, 1, 1, %105;"
                 : CA_WG_OUTS_200 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[100], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %102, 0; " "wgmma.mma_async.sync.aligned.m64n200k16.f32.bf16.bf16 " CA_WG_REGS_200 ", %100, %101, p, 1, 1, %103, %104;}"
                 : CA_WG_OUTS_200 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[100], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n200k16.f32.bf16.bf16 " CA_WG_REGS_200 ", {%100,%101,%102,%103}, %104, 1, 1, 1, %105;"
                 : CA_WG_OUTS_200 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_208 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103}"
#define CA_WG_OUTS_208 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103])
template <> struct Wgmma<208> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[104], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %106, 0; " "wgmma.mma_async.sync.aligned.m64n208k16.f32.f16.f16 " CA_WG_REGS_208 ", %104, %105, p, 1, 1, %107, %108;}"
                 : CA_WG_OUTS_208 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[104], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n208k16.f32.f16.f16 " CA_WG_REGS_208 ", {%104,%105,%106,%107}, %108, 1, 1, 1, %109;"
                 : CA_WG_OUTS_208 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[104], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %106, 0; " "wgmma.mma_async.sync.aligned.m64n208k16.f32.bf16.bf16 " CA_WG_REGS_208 ", %104, %105, p, 1, 1, %107, %108;}"
                 : CA_WG_OUTS_208 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[104], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n208k16.f32.bf16.bf16 " CA_WG_REGS_208 ", {%104,%105,%106,%107}, %108, 1, 1, 1, %109;"
                 : CA_WG_OUTS_208 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_216 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107}"
#define CA_WG_OUTS_216 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107])
template <> struct Wgmma<216> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[108], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %110, 0; " "wgmma.mma_async.sync.aligned.m64n216k16.f32.f16.f16 " CA_WG_REGS_216 ", %108, %109, p, 1, 1, %111, %112;}"
                 : CA_WG_OUTS_216 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[108], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n216k16.f32.f16.f16 " CA_WG_REGS_216 ", {%108,%109,%110,%111}, %112, 1, 1, 1, %113;"
                 : CA_WG_OUTS_216 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[108], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %110, 0; " "wgmma.mma_async.sync.aligned.m64n216k16.f32.bf16.bf16 " CA_WG_REGS_216 ", %108, %109, p, 1, 1, %111, %112;}"
                 : CA_WG_OUTS_216 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[108], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n216k16.f32.bf16.bf16 " CA_WG_REGS_216 ", {%108,%109,%110,%111}, %112, 1, 1, 1, %113;"
                 : CA_WG_OUTS_216 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_224 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111}"
#define CA_WG_OUTS_224 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111])
template <> struct Wgmma<224> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[112], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %114, 0; " "wgmma.mma_async.sync.aligned.m64n224k16.f32.f16.f16 " CA_WG_REGS_224 ", %112, %113, p, 1, 1, %115, %116;}"
                 : CA_WG_OUTS_224 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[112], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n224k16.f32.f16.f16 " CA_WG_REGS_224 ", {%112,%113,%114,%115}, %116, 1, 1, 1, %117;"
                 : CA_WG_OUTS_224 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[112], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %114, 0; " "wgmma.mma_async.sync.aligned.m64n224k16.f32.bf16.bf16 " CA_WG_REGS_224 ", %112, %113, p, 1, 1, %115, %116;}"
                 : CA_WG_OUTS_224 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[112], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n224k16.f32.bf16.bf16 " CA_WG_REGS_224 ", {%112,%113,%114,%115}, %116, 1, 1, 1, %117;"
                 : CA_WG_OUTS_224 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_232 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115}"
#define CA_WG_OUTS_232 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115])
template <> struct Wgmma<232> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[116], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %118, 0; " "wgmma.mma_async.sync.aligned.m64n232k16.f32.f16.f16 " CA_WG_REGS_232 ", %116, %117, p, 1, 1, %119, %120;}"
                 : CA_WG_OUTS_232 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[116], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n232k16.f32.f16.f16 " CA_WG_REGS_232 ", {%116,%117,%118,%119}, %120, 1, 1, 1, %121;"
                 : CA_WG_OUTS_232 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[116], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %118, 0; " "wgmma.mma_async.sync.aligned.m64n232k16.f32.bf16.bf16 " CA_WG_REGS_232 ", %116, %117, p, 1, 1, %119, %120;}"
                 : CA_WG_OUTS_232 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[116], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n232k16.f32.bf16.bf16 " CA_WG_REGS_232 ", {%116,%117,%118,%119}, %120, 1, 1, 1, %121;"
                 : CA_WG_OUTS_232 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_240 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119}"
#define CA_WG_OUTS_240 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119])
template <> struct Wgmma<240> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[120], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %122, 0; " "wgmma.mma_async.sync.aligned.m64n240k16.f32.f16.f16 " CA_WG_REGS_240 ", %120, %121, p, 1, 1, %123, %124;}"
                 : CA_WG_OUTS_240 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[120], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n240k16.f32.f16.f16 " CA_WG_REGS_240 ", {%120,%121,%122,%123}, %124, 1, 1, 1, %125;"
                 : CA_WG_OUTS_240 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[120], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %122, 0; " "wgmma.mma_async.sync.aligned.m64n240k16.f32.bf16.bf16 " CA_WG_REGS_240 ", %120, %121, p, 1, 1, %123, %124;}"
                 : CA_WG_OUTS_240 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[120], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n240k16.f32.bf16.bf16 " CA_WG_REGS_240 ", {%120,%121,%122,%123}, %124, 1, 1, 1, %125;"
                 : CA_WG_OUTS_240 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_248 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123}"
#define CA_WG_OUTS_248 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123])
template <> struct Wgmma<248> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[124], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %126, 0; " "wgmma.mma_async.sync.aligned.m64n248k16.f32.f16.f16 " CA_WG_REGS_248 ", %124, %125, p, 1, 1, %127, %128;}"
                 : CA_WG_OUTS_248 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[124], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n248k16.f32.f16.f16 " CA_WG_REGS_248 ", {%124,%125,%126,%127}, %128, 1, 1, 1, %129;"
                 : CA_WG_OUTS_248 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[124], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %126, 0; " "wgmma.mma_async.sync.aligned.m64n248k16.f32.bf16.bf16 " CA_WG_REGS_248 ", %124, %125, p, 1, 1, %127, %128;}"
                 : CA_WG_OUTS_248 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[124], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n248k16.f32.bf16.bf16 " CA_WG_REGS_248 ", {%124,%125,%126,%127}, %128, 1, 1, 1, %129;"
                 : CA_WG_OUTS_248 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
#define CA_WG_REGS_256 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}"
#define CA_WG_OUTS_256 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
template <> struct Wgmma<256> {
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[128], u64 a, u64 b, int accumulate, f16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %130, 0; " "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " CA_WG_REGS_256 ", %128, %129, p, 1, 1, %131, %132;}"
                 : CA_WG_OUTS_256 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[128], const u32 (&a)[4], u64 b, f16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " CA_WG_REGS_256 ", {%128,%129,%130,%131}, %132, 1, 1, 1, %133;"
                 : CA_WG_OUTS_256 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  __device__ __forceinline__ static void ss(float (&d)[128], u64 a, u64 b, int accumulate, bf16) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %130, 0; " "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " CA_WG_REGS_256 ", %128, %129, p, 1, 1, %131, %132;}"
                 : CA_WG_OUTS_256 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
  template <int TRANS_B = 1>
  __device__ __forceinline__ static void rs(float (&d)[128], const u32 (&a)[4], u64 b, bf16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " CA_WG_REGS_256 ", {%128,%129,%130,%131}, %132, 1, 1, 1, %133;"
                 : CA_WG_OUTS_256 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B));
  }
};
// END generated by scripts/gen_wgmma.py
