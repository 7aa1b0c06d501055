// Microbenchmarks of one Hopper SM's pipes (sm_90a), for benchmarks/micro/pipes.py:
// what the tensor cores, the MUFU and the FMA pipe each sustain alone and side by
// side, in the shapes and instruction mixes of flash_wgmma. One block per SM; every
// warpgroup records its clock64() span in clk[block * 8 + warpgroup] and the number
// of loop iterations it ran in iters[block * 8 + warpgroup]. Shared operands hold
// the same 16-bit ones throughout: the data does not matter to the rates.
#include "common/mma.cuh"
#include "common/wgmma.cuh"

// Fill the first `bytes` of the 1024-aligned dynamic shared memory with bf16 ones and
// make them visible to the async proxy (wgmma reads through it).
__device__ __forceinline__ u32 shared_ones(int bytes) {
  extern __shared__ unsigned char smem_raw[];
  const u32 base = (smem_addr(smem_raw) + 1023) & ~1023u;
  u32* words = reinterpret_cast<u32*>(smem_raw + (base - smem_addr(smem_raw)));
  for (int i = threadIdx.x; i < bytes / 4; i += blockDim.x) words[i] = 0x3f803f80u;
  fence_proxy_async();
  __syncthreads();
  return base;
}

// wgmma alone: WGS warpgroups each issue `iters` groups of STEPS m64nNk16 (bf16),
// one accumulator, waiting for each group. KIND 0: A and B from shared memory,
// K-major (Q K^T: N = BLOCK_N, 16 * STEPS = D rounded up to 16); KIND 1: A from
// registers, B MN-major (P V: N = D, 16 * STEPS = BLOCK_N).
template <int N, int STEPS, int KIND, int WGS>
__global__ void __launch_bounds__(128 * WGS, 1) mma_shape(float* out, long long* clk, int* iters_out,
                                                         int iters) {
  using ATile = SwizzledTile<64, 16 * STEPS>;
  using BTile = SwizzledTile<(KIND == 0 ? N : 16 * STEPS), (KIND == 0 ? 16 * STEPS : (N + 15) / 16 * 16)>;
  const u32 base = shared_ones(ATile::BYTES * WGS + BTile::BYTES);
  const int wg = threadIdx.x / 128;
  const u64 a_desc = ATile::kmajor(base + wg * ATile::BYTES, 0, 0);
  const u32 sB = base + ATile::BYTES * WGS;
  const u64 b_desc = KIND == 0 ? BTile::kmajor(sB, 0, 0) : BTile::mnmajor(sB, 0);
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  const u32 a[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < STEPS; ++ks) {
      if (KIND == 0)
        Wgmma<N>::ss(d, desc_advance(a_desc, ATile::kmajor_offset(ks)),
                     desc_advance(b_desc, BTile::kmajor_offset(ks)), 1, bf16{});
      else
        Wgmma<N>::rs(d, a, desc_advance(b_desc, BTile::mnmajor_offset(ks)), bf16{});
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(d);
  }
  const long long t1 = clock64();
  float r = 0.f;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) r += d[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = r;
  if (threadIdx.x % 128 == 0) {
    clk[blockIdx.x * 8 + wg] = t1 - t0;
    iters_out[blockIdx.x * 8 + wg] = iters;
  }
}

// Side by side. Warpgroups 0..MMA_WGS-1 issue `mma_iters` groups of one D = 80 key
// tile's MMAs: WORK 0, Q K^T alone (m64n112k16 x 5, SS); 1, P V alone (m64n80k16 x
// 7, A from registers); 2, both; 3, both with P V's A from shared memory. The other
// SIDE_WGS warpgroups run OP on 8 independent chains a thread until the MMA
// warpgroups are done (or `side_iters` times without any): 0, ex2.approx.ftz.f32;
// 1, FFMA; 2, the fast softmax's work per score (FFMA into the exp2 domain, ex2,
// FADD into a row sum); 3, ex2.approx.f16x2 and 4, ex2.approx.ftz.bf16x2 (two exps
// per instruction). With four warpgroups the MMA side takes the registers the other
// side does not need (setmaxnreg).
template <int MMA_WGS, int SIDE_WGS, int WORK, int OP>
__global__ void __launch_bounds__(128 * (MMA_WGS + SIDE_WGS), 1)
    side_by_side(float* out, long long* clk, int* iters_out, int mma_iters, int side_iters) {
  using QTile = SwizzledTile<64, 80>;    // A of Q K^T, one per warpgroup
  using KTile = SwizzledTile<112, 80>;   // K (K-major B of Q K^T) and V (MN-major B of P V)
  using PTile = SwizzledTile<64, 112>;   // P V's A from shared memory, one per warpgroup
  const u32 sQ = shared_ones(4 * QTile::BYTES + KTile::BYTES + 4 * PTile::BYTES);
  const u32 sK = sQ + 4 * QTile::BYTES, sP = sK + KTile::BYTES;
  __shared__ volatile int mma_done;
  if (threadIdx.x == 0) mma_done = 0;
  __syncthreads();
  constexpr bool FULL = MMA_WGS + SIDE_WGS == 4;
  constexpr int MMA_REGS = cmin((512 - 56 * SIDE_WGS) / (MMA_WGS > 0 ? MMA_WGS : 1) / 8 * 8, 256);
  const int wg = threadIdx.x / 128;
  float r = 0.f;
  int n = 0;
  const long long t0 = clock64();
  if (wg < MMA_WGS) {
    if (FULL) setmaxnreg_inc<MMA_REGS>();
    float s[56], acc[40];
#pragma unroll
    for (int i = 0; i < 56; ++i) s[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 40; ++i) acc[i] = 0.f;
    const u32 a[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};
    const u64 q_desc = QTile::kmajor(sQ + wg * QTile::BYTES, 0, 0), k_desc = KTile::kmajor(sK, 0, 0);
    const u64 v_desc = KTile::mnmajor(sK, 0), p_desc = PTile::kmajor(sP + wg * PTile::BYTES, 0, 0);
    for (; n < mma_iters; ++n) {
      wgmma_fence();
      if (WORK != 1) {
#pragma unroll
        for (int ks = 0; ks < 5; ++ks)
          Wgmma<112>::ss(s, desc_advance(q_desc, QTile::kmajor_offset(ks)),
                         desc_advance(k_desc, KTile::kmajor_offset(ks)), 1, bf16{});
      }
      if (WORK != 0) {
#pragma unroll
        for (int ks = 0; ks < 7; ++ks) {
          if (WORK == 3)
            Wgmma<80>::ss<0, 1>(acc, desc_advance(p_desc, PTile::kmajor_offset(ks)),
                                desc_advance(v_desc, KTile::mnmajor_offset(ks)), 1, bf16{});
          else
            Wgmma<80>::rs(acc, a, desc_advance(v_desc, KTile::mnmajor_offset(ks)), bf16{});
        }
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(s);
      fence_regs(acc);
    }
#pragma unroll
    for (int i = 0; i < 56; ++i) r += s[i];
#pragma unroll
    for (int i = 0; i < 40; ++i) r += acc[i];
    named_barrier_sync(1, 128 * MMA_WGS);
    if (threadIdx.x == 0) mma_done = 1;
  } else {
    if (FULL) setmaxnreg_dec<56>();
    float x[8], sum[8];
    u32 h[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      x[i] = -1e-3f * (threadIdx.x % 128 + i);
      sum[i] = 0.f;
      h[i] = 0xbc00bc00u;  // a pair of negative numbers in either 16-bit type
    }
    const float scale = 0.125f, neg_m = -1.f;
    while (MMA_WGS > 0 ? !mma_done : n < side_iters) {
#pragma unroll 4
      for (int rep = 0; rep < 16; ++rep)
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          if (OP == 0) {
            asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(x[i]));
          } else if (OP == 1) {
            asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x[i]) : "f"(scale), "f"(neg_m));
          } else if (OP == 2) {
            float e = fmaf(x[i], scale, neg_m);
            asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(e));
            sum[i] += e;
            x[i] = e;
          } else if (OP == 3) {
            asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(h[i]));
          } else {
            asm volatile("ex2.approx.ftz.bf16x2 %0, %0;" : "+r"(h[i]));
          }
        }
      ++n;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) r += x[i] + sum[i] + __uint_as_float(h[i]);
  }
  const long long t1 = clock64();
  out[blockIdx.x * blockDim.x + threadIdx.x] = r;
  if (threadIdx.x % 128 == 0) {
    clk[blockIdx.x * 8 + wg] = t1 - t0;
    iters_out[blockIdx.x * 8 + wg] = n;
  }
}
