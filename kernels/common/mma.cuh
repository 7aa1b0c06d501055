// Tensor-core building blocks for sm_80+: cp.async, ldmatrix, mma.sync.m16n8k16.
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4; each u32 holds two
// 16-bit values, the lower column in the low half):
//   A 16x16 row-major:  a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B 16x8 "col":       b0 (k 2t..2t+1, n g)               b1 (k 2t+8.., n g)
//   C 16x8 fp32:        c0 c1 (g, 2t..2t+1)                c2 c3 (g+8, 2t..2t+1)
// A C fragment pair (two n8 tiles) rounded to 16 bits is an A fragment of the next
// product: that is how P stays in registers between S = Q K^T and O += P V.
#pragma once
#include "types.cuh"

template <class T> struct MmaType;
template <> struct MmaType<f16> {
  // d = {hi, lo}: PTX puts the first source in the upper half.
  __device__ __forceinline__ static u32 pack(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
};
template <> struct MmaType<bf16> {
  __device__ __forceinline__ static u32 pack(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
};

// c += a * b with fp32 accumulation.
__device__ __forceinline__ void mma_16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1, f16) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1, bf16) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d = a * b: the first k step of a product, with no accumulator to clear first
// (the zero C operand becomes ptxas' zero register).
template <class T>
__device__ __forceinline__ void mma_16816_first(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1,
                                                T t) {
  d[0] = d[1] = d[2] = d[3] = 0.f;
  mma_16816(d, a, b0, b1, t);
}

__device__ __forceinline__ u32 smem_addr(const void* p) {
  return static_cast<u32>(__cvta_generic_to_shared(p));
}

// A 32-bit store to shared memory at a shared-window address: offsets from one
// base register become the store's immediate.
__device__ __forceinline__ void st_shared_u32(u32 addr, u32 v) {
  asm volatile("st.shared.b32 [%0], %1;" :: "r"(addr), "r"(v));
}
__device__ __forceinline__ void st_shared_f32x2(u32 addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" :: "r"(addr), "f"(a), "f"(b));
}
__device__ __forceinline__ void st_shared_f32x4(u32 addr, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" :: "r"(addr), "f"(a), "f"(b), "f"(c),
               "f"(d));
}

// Four 8x8 matrices of 16-bit values; lane l supplies the address of row l % 8 of
// matrix l / 8 and receives r[i] = matrix i at (row g, cols 2t..2t+1).
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// Same, each matrix transposed: r[i] = matrix i at (rows 2t..2t+1, col g).
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// Four 8x8 matrices of 16-bit values stored: lane l supplies the address of stored row
// l % 8 of matrix l / 8, and r[i] holds matrix i at (row g, cols 2t..2t+1), as an
// accumulator's C fragment (one instruction where st_shared_u32 takes four).
__device__ __forceinline__ void stmatrix_x4(u32 addr, const u32 (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};"
               :: "r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}
// Four 8x8 matrices of 16-bit values stored transposed: lane l supplies the address
// of stored row l % 8 of matrix l / 8, and r[i] holds matrix i at (row g, cols
// 2t..2t+1), which lands in stored rows 2t and 2t + 1 at position g (an accumulator's
// C fragment written as its transpose: keys x queries from queries x keys).
__device__ __forceinline__ void stmatrix_x4_trans(u32 addr, const u32 (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};"
               :: "r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}

// 16-byte global -> shared copy that bypasses L1; src_bytes = 0 writes zeros
// (used for rows and columns past the tensor's end).
__device__ __forceinline__ void cp_async_16(u32 dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
               :: "r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
// cp_async_16 that also has the L2 fetch the 256-byte block around the source
// (.L2::256B): for streams that read whole rows once (decode's K and V: 1-2% more
// bandwidth on an H100, benchmarks/results/notes-decode.md).
__device__ __forceinline__ void cp_async_16_l2_256(u32 dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;"
               :: "r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N)); }
