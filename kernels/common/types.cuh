// Scalar types and storage-dtype traits shared by every kernel family.
//
// NVRTC compiles the kernels with no CUDA toolkit headers at all (a user has a
// driver and the NVRTC wheel, nothing else), so the 16-bit float types are plain
// storage structs and every conversion is one PTX `cvt` instruction.
//
// Notation: `T` is the storage dtype of q/k/v/o (float, f16, bf16); all
// arithmetic is fp32.
#pragma once

typedef signed char i8;
typedef unsigned char u8;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

struct f16 { u16 bits; };
struct bf16 { u16 bits; };

#define CA_INF __int_as_float(0x7f800000)
#define CA_NAN __int_as_float(0x7fc00000)
#define CA_LOG2E 1.4426950408889634f
#define CA_LN2 0.6931471805599453f

template <class T> struct DType;

template <> struct DType<float> {
  static constexpr const char* name = "f32";
  __device__ __forceinline__ static float to_float(float x) { return x; }
  __device__ __forceinline__ static float from_float(float x) { return x; }
};

template <> struct DType<f16> {
  static constexpr const char* name = "f16";
  __device__ __forceinline__ static float to_float(f16 x) {
    float r;
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(x.bits));
    return r;
  }
  __device__ __forceinline__ static f16 from_float(float x) {
    f16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
    return r;
  }
};

template <> struct DType<bf16> {
  static constexpr const char* name = "bf16";
  __device__ __forceinline__ static float to_float(bf16 x) {
    return __uint_as_float(u32(x.bits) << 16);
  }
  // Round to nearest even with NaN kept quiet; the PTX cvt to bf16 needs sm_80,
  // this integer form runs everywhere and rounds identically.
  __device__ __forceinline__ static bf16 from_float(float x) {
    u32 u = __float_as_uint(x);
    bf16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      r.bits = u16((u >> 16) | 0x40u);
    } else {
      r.bits = u16((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    return r;
  }
};

// Accumulator of the CUDA-core kernels' dot products and sums: fp64 for fp32
// inputs, so an fp32 result stays within an ulp or two of a plain fp32
// computation whatever the summation order; fp32 for 16-bit inputs, whose own
// rounding dwarfs fp32's.
template <class T> struct Accum { using type = float; };
template <> struct Accum<float> { using type = double; };

template <class T> __device__ __forceinline__ float to_float(T x) { return DType<T>::to_float(x); }
template <class T> __device__ __forceinline__ T from_float(float x) { return DType<T>::from_float(x); }

// 2^x through the special-function unit (`ex2.approx.ftz`): relative error ~2^-22,
// and ex2(-inf) = +0, which the online softmax relies on for masked scores.
__device__ __forceinline__ float fast_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// 1 / x, rcp.approx (one MUFU operation; 1 / inf = 0, 1 / 0 = inf).
__device__ __forceinline__ float fast_rcp(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// Correctly handled special values and ~2 ulp: for the CUDA-core kernels, whose
// fp32 results must stay within a few ulps of an fp32 reference.
__device__ __forceinline__ float exact_exp2(float x) { return exp2f(x); }
__device__ __forceinline__ float exact_log2(float x) { return log2f(x); }

template <int A, int B> struct CeilDiv { static constexpr int value = (A + B - 1) / B; };
template <int A, int B> struct RoundUp { static constexpr int value = CeilDiv<A, B>::value * B; };
__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }
__host__ __device__ constexpr int cmin(int a, int b) { return a < b ? a : b; }
__host__ __device__ constexpr int cmax(int a, int b) { return a > b ? a : b; }

// A if C, else B (std::conditional, which NVRTC's headers do not give here).
template <bool C, class A, class B> struct SelectType { using type = A; };
template <class A, class B> struct SelectType<false, A, B> { using type = B; };

// x / d and x % d for 0 <= x < 2^31 and a divisor d >= 1 known only at run time:
// a multiply-high and a shift where an integer division takes ~20 instructions.
// With l = ceil(log2 d) and m = ceil(2^(31 + l) / d) < 2^32, x / d = (x m) >> (31 + l)
// exactly for x < 2^31 (m d - 2^(31 + l) < d). d = 1 takes its own branch (m would be
// 2^31 with a shift of -1). The one 64-bit division is the constructor's; the second
// constructor takes m and s made by the host (families/decode.py: divisor_magic).
struct Divisor {
  int d;
  u32 m;
  int s;  // l - 1
  __device__ __forceinline__ Divisor(int d_, u32 m_, int s_) : d(d_), m(m_), s(s_) {}
  __device__ __forceinline__ explicit Divisor(int d_) : d(d_), m(0), s(0) {
    if (d > 1) {
      const int l = 32 - __clz(d - 1);
      m = u32(((1ull << (31 + l)) + u64(d) - 1) / u64(d));
      s = l - 1;
    }
  }
  __device__ __forceinline__ int div(int x) const {
    return d == 1 ? x : int(__umulhi(u32(x), m) >> s);
  }
  __device__ __forceinline__ int mod(int x) const { return x - div(x) * d; }
};
