// Fused residual add + RMSNorm (sm_80+), one block per row:
//   residual <- residual + x   (stored in the activation dtype, as the model's `x = x + f(x)` does)
//   out      <- rmsnorm(residual) * weight
// x may be null (a plain RMSNorm of `residual`, left unchanged).  fp32 math; for fp16/bf16 the
// rounding follows engine/infer/model.py's RMSNorm: the normalised row is rounded to the dtype,
// then multiplied by the weight (and rounded again); for fp32 it is x * rsqrt(mean + eps) * w.
#include "qgemm_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace scl_cuda {
namespace {

__device__ __forceinline__ float ld(const float* p) { return *p; }
__device__ __forceinline__ float ld(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float ld(const __nv_bfloat16* p) { return __bfloat162float(*p); }
template <typename T> __device__ __forceinline__ T cv(float v);
template <> __device__ __forceinline__ float cv<float>(float v) { return v; }
template <> __device__ __forceinline__ __half cv<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 cv<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads)
rmsnorm_residual_kernel(const T* __restrict__ x, T* __restrict__ res, const T* __restrict__ w,
                        T* __restrict__ out, int n, float eps) {
  const size_t row = blockIdx.x;
  T* r = res + row * n;
  const T* xr = x ? x + row * n : nullptr;
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    float v = ld(r + i);
    if (xr) {
      const T s = cv<T>(v + ld(xr + i));   // the residual stream keeps the activation dtype
      r[i] = s;
      v = ld(&s);
    }
    ss = fmaf(v, v, ss);
  }
  __shared__ float red[kThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  float tot = 0.f;
#pragma unroll
  for (int i = 0; i < kThreads / 32; ++i) tot += red[i];
  const float inv = rsqrtf(tot / (float)n + eps);
  T* o = out + row * n;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float v = ld(r + i);   // written by this thread above (same i): no barrier needed
    if (sizeof(T) == 4) {
      o[i] = cv<T>(v * inv * ld(w + i));
    } else {
      const T nv = cv<T>(v * inv);
      o[i] = cv<T>(ld(w + i) * ld(&nv));
    }
  }
}

}  // namespace

cudaError_t rmsnorm_residual(const void* x, void* residual, const void* weight, void* out, int rows, int n,
                             float eps, DType dt, cudaStream_t stream) {
  if (rows < 1 || n < 1) return cudaErrorInvalidValue;
  if (dt == kF32)
    rmsnorm_residual_kernel<float><<<rows, kThreads, 0, stream>>>((const float*)x, (float*)residual,
                                                                  (const float*)weight, (float*)out, n, eps);
  else if (dt == kF16)
    rmsnorm_residual_kernel<__half><<<rows, kThreads, 0, stream>>>((const __half*)x, (__half*)residual,
                                                                   (const __half*)weight, (__half*)out, n, eps);
  else
    rmsnorm_residual_kernel<__nv_bfloat16><<<rows, kThreads, 0, stream>>>(
        (const __nv_bfloat16*)x, (__nv_bfloat16*)residual, (const __nv_bfloat16*)weight, (__nv_bfloat16*)out, n,
        eps);
  return cudaGetLastError();
}

}  // namespace scl_cuda
