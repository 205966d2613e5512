// Weight-only int8 / int4 GEMV and small-M GEMM for sm_80+ (A100, H100/H200).
//
// Work decomposition (both formats):
//   * a block of 4 warps owns ROWS_PER_BLOCK = 8 output rows; the 4 warps split K
//     (round-robin over 128-byte chunks of every row) and are reduced through
//     shared memory at the end;
//   * inside a warp, lanes are 4 row-groups x 8 lanes: the 8 lanes of a group read
//     128 contiguous bytes of a row with one 16-byte vector load each (a full
//     128-byte line per row per step), and every lane handles R = 2 rows
//     (rows rg and rg + 4), so each activation load feeds 2 rows and the 4 row
//     groups of a warp read the same activation addresses (L1 broadcast);
//   * weights are dequantized in registers with magic-number tricks
//     (int8: byte_perm into 0x4B0000xx, int4: (v >> 4j) & 0xF | 0x4B000000;
//     float minus 2^23 (+128) gives the exact integer), fp32 FMAs, then a
//     3-step warp-shuffle reduction over the 8 lanes of a row group;
//   * all M rows (<= kMaxMT per launch) are processed from the same registers,
//     so each weight byte is read from HBM once per launch.
//   * int4: a lane's 16 bytes are 32 consecutive k inside one group (gs is a
//     multiple of 32), so the group scale/min are applied once per load:
//     acc += scale * sum(q*x) + min * sum(x).
#include "qgemm_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace scl_cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kRowGroups = 4;   // 32 lanes = 4 row groups x 8 lanes
constexpr int kR = 2;           // rows per lane
constexpr int kRowsPerBlock = kRowGroups * kR;
constexpr int kChunkBytes = 128;  // bytes of one row consumed by 8 lanes per step

// ---- activation loads ------------------------------------------------------

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Two packed 16-bit values of a 32-bit word -> 2 floats.
__device__ __forceinline__ void unpack2(uint32_t wd, float& a, float& b, __half*) {
  __half2 h;
  memcpy(&h, &wd, 4);
  const float2 f = __half22float2(h);
  a = f.x;
  b = f.y;
}
__device__ __forceinline__ void unpack2(uint32_t wd, float& a, float& b, __nv_bfloat16*) {
  a = __uint_as_float(wd << 16);
  b = __uint_as_float(wd & 0xFFFF0000u);
}

// x[k .. k+7] of one activation row as float, zero for k >= K.  `vec` (uniform)
// says rows are 16-byte aligned so 16-byte vector loads are legal.
template <typename T>
__device__ __forceinline__ void load_x8(const T* __restrict__ row, int k, int K, bool vec,
                                        float (&f)[8]) {
  if (vec && k + 8 <= K) {
    if constexpr (sizeof(T) == 4) {
      const float4* p = reinterpret_cast<const float4*>(row + k);
      const float4 a = __ldg(p), b = __ldg(p + 1);
      f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
      f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
    } else {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(row + k));
      unpack2(u.x, f[0], f[1], (T*)nullptr);
      unpack2(u.y, f[2], f[3], (T*)nullptr);
      unpack2(u.z, f[4], f[5], (T*)nullptr);
      unpack2(u.w, f[6], f[7], (T*)nullptr);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = (k + i < K) ? to_f(row[k + i]) : 0.f;
  }
}

// ---- weight decode ---------------------------------------------------------

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// 4 int8 of a word -> 4 exact floats.  (b ^ 0x80) = b + 128 placed in the low
// mantissa byte of 2^23: float = 2^23 + b + 128.
__device__ __forceinline__ void i8x4(uint32_t v, float* f) {
  const uint32_t u = v ^ 0x80808080u;
  f[0] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440)) - 8388736.f;
  f[1] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7441)) - 8388736.f;
  f[2] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7442)) - 8388736.f;
  f[3] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7443)) - 8388736.f;
}

// 8 nibbles of a word (nibble j = k + j) -> 8 exact floats in 0..15.
__device__ __forceinline__ void u4x8(uint32_t v, float* f) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
    f[j] = __uint_as_float(((v >> (4 * j)) & 0xFu) | 0x4B000000u) - 8388608.f;
}

__device__ __forceinline__ uint4 ldg_w(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// ---- block epilogue ----------------------------------------------------------

template <typename T, int MT>
__device__ __forceinline__ void finish(float (&acc)[MT][kR], const float* __restrict__ scale,
                                       const T* __restrict__ bias, T* __restrict__ y, int M,
                                       int N, int nbase) {
  __shared__ float red[kWarps][MT][kRowsPerBlock];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int rg = lane >> 3, sub = lane & 7;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      float v = acc[m][r];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      if (sub == 0) red[warp][m][rg + kRowGroups * r] = v;
    }
  __syncthreads();
  for (int t = threadIdx.x; t < MT * kRowsPerBlock; t += blockDim.x) {
    const int m = t / kRowsPerBlock, rr = t % kRowsPerBlock, n = nbase + rr;
    if (m < M && n < N) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += red[w][m][rr];
      if (scale) s *= scale[n];
      if (bias) s += to_f(bias[n]);
      y[(size_t)m * N + n] = from_f<T>(s);
    }
  }
}

// ---- int8 ------------------------------------------------------------------

template <typename T, int MT>
__global__ void __launch_bounds__(kWarps * 32)
int8_gemm_kernel(const T* __restrict__ x, const int8_t* __restrict__ w,
                 const float* __restrict__ scale, const T* __restrict__ bias,
                 T* __restrict__ y, int M, int N, int K, int Kpad, bool vec) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int rg = lane >> 3, sub = lane & 7;
  const int nbase = blockIdx.x * kRowsPerBlock;
  int row[kR];
  bool ok[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    row[r] = nbase + rg + kRowGroups * r;
    ok[r] = row[r] < N;
  }
  float acc[MT][kR];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < kR; ++r) acc[m][r] = 0.f;

  for (int c = warp; c * kChunkBytes < Kpad; c += kWarps) {
    const int k0 = c * kChunkBytes + sub * 16;  // 16 int8 = 16 k per lane
    if (k0 >= Kpad) continue;
    uint4 wv[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r)
      wv[r] = ok[r] ? ldg_w(w + (size_t)row[r] * Kpad + k0) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // two halves of 8 k
      float wf[kR][8];
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        i8x4(word(wv[r], 2 * h), &wf[r][0]);
        i8x4(word(wv[r], 2 * h + 1), &wf[r][4]);
      }
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m < M) {
          float xf[8];
          load_x8(x + (size_t)m * K, k0 + 8 * h, K, vec, xf);
#pragma unroll
          for (int r = 0; r < kR; ++r)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[m][r] = fmaf(wf[r][i], xf[i], acc[m][r]);
        }
      }
    }
  }
  finish<T, MT>(acc, scale, bias, y, M, N, nbase);
}

// ---- int4 ------------------------------------------------------------------

template <typename T, int MT>
__global__ void __launch_bounds__(kWarps * 32)
int4_gemm_kernel(const T* __restrict__ x, const uint8_t* __restrict__ w,
                 const __half2* __restrict__ sm, const T* __restrict__ bias,
                 T* __restrict__ y, int M, int N, int K, int gs, int G, bool vec) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int rg = lane >> 3, sub = lane & 7;
  const int nbase = blockIdx.x * kRowsPerBlock;
  const int row_bytes = G * gs / 2;
  int row[kR];
  bool ok[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    row[r] = nbase + rg + kRowGroups * r;
    ok[r] = row[r] < N;
  }
  float acc[MT][kR];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < kR; ++r) acc[m][r] = 0.f;

  for (int c = warp; c * kChunkBytes < row_bytes; c += kWarps) {
    const int b0 = c * kChunkBytes + sub * 16;  // 16 bytes = 32 nibbles = 32 k per lane
    if (b0 >= row_bytes) continue;
    const int k0 = 2 * b0;
    const int g = k0 / gs;                      // all 32 k in one group (gs % 32 == 0)
    uint4 wv[kR];
    float sc[kR], mn[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      if (ok[r]) {
        wv[r] = ldg_w(w + (size_t)row[r] * row_bytes + b0);
        const float2 f = __half22float2(sm[(size_t)row[r] * G + g]);
        sc[r] = f.x;
        mn[r] = f.y;
      } else {
        wv[r] = make_uint4(0, 0, 0, 0);
        sc[r] = mn[r] = 0.f;
      }
    }
    float dot[MT][kR], sx[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      sx[m] = 0.f;
#pragma unroll
      for (int r = 0; r < kR; ++r) dot[m][r] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // 4 words x 8 nibbles
      float wf[kR][8];
#pragma unroll
      for (int r = 0; r < kR; ++r) u4x8(word(wv[r], i), wf[r]);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m < M) {
          float xf[8];
          load_x8(x + (size_t)m * K, k0 + 8 * i, K, vec, xf);
          sx[m] += ((xf[0] + xf[1]) + (xf[2] + xf[3])) + ((xf[4] + xf[5]) + (xf[6] + xf[7]));
#pragma unroll
          for (int r = 0; r < kR; ++r)
#pragma unroll
            for (int j = 0; j < 8; ++j) dot[m][r] = fmaf(wf[r][j], xf[j], dot[m][r]);
        }
      }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int r = 0; r < kR; ++r)
        acc[m][r] = fmaf(sc[r], dot[m][r], fmaf(mn[r], sx[m], acc[m][r]));
  }
  finish<T, MT>(acc, nullptr, bias, y, M, N, nbase);
}

// ---- host launchers ------------------------------------------------------------

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename T>
cudaError_t launch_int8(const T* x, const int8_t* w, const float* scale, const T* bias, T* y,
                        int M, int N, int K, int Kpad, cudaStream_t st) {
  const dim3 grid((N + kRowsPerBlock - 1) / kRowsPerBlock), block(kWarps * 32);
  const bool vec = aligned16(x) && ((size_t)K * sizeof(T)) % 16 == 0;
  for (int m0 = 0; m0 < M; m0 += kMaxMT) {
    const int mc = (M - m0 < kMaxMT) ? M - m0 : kMaxMT;
    const T* xm = x + (size_t)m0 * K;
    T* ym = y + (size_t)m0 * N;
    if (mc == 1) int8_gemm_kernel<T, 1><<<grid, block, 0, st>>>(xm, w, scale, bias, ym, mc, N, K, Kpad, vec);
    else if (mc <= 2) int8_gemm_kernel<T, 2><<<grid, block, 0, st>>>(xm, w, scale, bias, ym, mc, N, K, Kpad, vec);
    else if (mc <= 4) int8_gemm_kernel<T, 4><<<grid, block, 0, st>>>(xm, w, scale, bias, ym, mc, N, K, Kpad, vec);
    else if (mc <= 8) int8_gemm_kernel<T, 8><<<grid, block, 0, st>>>(xm, w, scale, bias, ym, mc, N, K, Kpad, vec);
    else int8_gemm_kernel<T, 16><<<grid, block, 0, st>>>(xm, w, scale, bias, ym, mc, N, K, Kpad, vec);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <typename T>
cudaError_t launch_int4(const T* x, const uint8_t* w, const __half2* sm, const T* bias, T* y,
                        int M, int N, int K, int gs, cudaStream_t st) {
  const int G = (K + gs - 1) / gs;
  const dim3 grid((N + kRowsPerBlock - 1) / kRowsPerBlock), block(kWarps * 32);
  const bool vec = aligned16(x) && ((size_t)K * sizeof(T)) % 16 == 0;
  for (int m0 = 0; m0 < M; m0 += kMaxMT) {
    const int mc = (M - m0 < kMaxMT) ? M - m0 : kMaxMT;
    const T* xm = x + (size_t)m0 * K;
    T* ym = y + (size_t)m0 * N;
    if (mc == 1) int4_gemm_kernel<T, 1><<<grid, block, 0, st>>>(xm, w, sm, bias, ym, mc, N, K, gs, G, vec);
    else if (mc <= 2) int4_gemm_kernel<T, 2><<<grid, block, 0, st>>>(xm, w, sm, bias, ym, mc, N, K, gs, G, vec);
    else if (mc <= 4) int4_gemm_kernel<T, 4><<<grid, block, 0, st>>>(xm, w, sm, bias, ym, mc, N, K, gs, G, vec);
    else if (mc <= 8) int4_gemm_kernel<T, 8><<<grid, block, 0, st>>>(xm, w, sm, bias, ym, mc, N, K, gs, G, vec);
    else int4_gemm_kernel<T, 16><<<grid, block, 0, st>>>(xm, w, sm, bias, ym, mc, N, K, gs, G, vec);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t int8_gemm(const void* x, const int8_t* w, const float* scale, const void* bias,
                      void* y, int M, int N, int K, int Kpad, DType dt, cudaStream_t st) {
  if (M <= 0 || N <= 0) return cudaSuccess;
  if (Kpad % 16 != 0 || Kpad < K || !aligned16(w)) return cudaErrorInvalidValue;
  switch (dt) {
    case kF32:
      return launch_int8<float>((const float*)x, w, scale, (const float*)bias, (float*)y, M, N, K, Kpad, st);
    case kF16:
      return launch_int8<__half>((const __half*)x, w, scale, (const __half*)bias, (__half*)y, M, N, K, Kpad, st);
    case kBF16:
      return launch_int8<__nv_bfloat16>((const __nv_bfloat16*)x, w, scale, (const __nv_bfloat16*)bias,
                                        (__nv_bfloat16*)y, M, N, K, Kpad, st);
  }
  return cudaErrorInvalidValue;
}

cudaError_t int4_gemm(const void* x, const uint8_t* w, const void* sm, const void* bias, void* y,
                      int M, int N, int K, int gs, DType dt, cudaStream_t st) {
  if (M <= 0 || N <= 0) return cudaSuccess;
  if (gs % 32 != 0 || gs <= 0 || !aligned16(w) || (reinterpret_cast<uintptr_t>(sm) & 3u))
    return cudaErrorInvalidValue;
  const __half2* s2 = reinterpret_cast<const __half2*>(sm);
  switch (dt) {
    case kF32:
      return launch_int4<float>((const float*)x, w, s2, (const float*)bias, (float*)y, M, N, K, gs, st);
    case kF16:
      return launch_int4<__half>((const __half*)x, w, s2, (const __half*)bias, (__half*)y, M, N, K, gs, st);
    case kBF16:
      return launch_int4<__nv_bfloat16>((const __nv_bfloat16*)x, w, s2, (const __nv_bfloat16*)bias,
                                        (__nv_bfloat16*)y, M, N, K, gs, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace scl_cuda
