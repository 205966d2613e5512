// Fused speculative-sampling verification (Leviathan et al. 2023), one block
// per sequence: the CUDA fast path of engine/ops/verify.py:verify_drafts, exactly the
// arithmetic of verify_drafts_torch there:
//
//   q_i = draft_probs[i, t_i], or 1 when draft_probs is null (a deterministic draft:
//         q is one-hot on the drafted token)
//   accept draft i  <=>  t_i in [0, V) and u_i * q_i <= p_i[t_i]   (float64 compare)
//   n = number of leading accepts
//   r = max(0, p_n - q_n) if n < gamma else p_gamma        (float64; q_n one-hot on t_n
//       when draft_probs is null)
//   if sum(r) <= 0: r = p_n
//   next = first j with cumsum(r)[j] > u_gamma * sum(r); if rounding leaves none,
//          the last j with r[j] > 0 (V-1 if r is all zero).
//
// The residual is never materialised: pass 1 sums r over 16 contiguous per-warp
// ranges (coalesced), thread 0 finds the warp whose range crosses the target,
// and only that warp re-reads its range with a warp-shuffle inclusive scan.
// Results agree with the torch implementation except when u*sum(r) falls within
// float64 rounding of a CDF boundary (summation order differs).
#include "qgemm_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace scl_cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kNW = kThreads / 32;

__device__ __forceinline__ double to_d(float v) { return (double)v; }
__device__ __forceinline__ double to_d(__half v) { return (double)__half2float(v); }
__device__ __forceinline__ double to_d(__nv_bfloat16 v) { return (double)__bfloat162float(v); }

// r[j]: p[j], or max(0, p[j] - q[j]) for a residual; q == nullptr means q one-hot on tok.
template <typename T>
__device__ __forceinline__ double rval(const T* __restrict__ p, const T* __restrict__ q,
                                       int64_t tok, bool residual, int j) {
  const double pv = to_d(p[j]);
  if (!residual) return pv;
  const double qv = q != nullptr ? to_d(q[j]) : (j == tok ? 1.0 : 0.0);
  const double d = pv - qv;
  return d > 0.0 ? d : 0.0;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
fused_verify_kernel(const T* __restrict__ tp, const T* __restrict__ dp,
                    const int64_t* __restrict__ toks, const float* __restrict__ uni,
                    int64_t* __restrict__ n_out, int64_t* __restrict__ next_out, int gamma,
                    int V) {
  __shared__ int s_n;
  __shared__ int64_t s_tok;
  __shared__ double s_part[kNW];
  __shared__ int s_owner;
  __shared__ double s_prefix;
  __shared__ double s_target;
  __shared__ int s_result;
  __shared__ int s_lastnz[kNW];

  const int b = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const T* P = tp + (size_t)b * (gamma + 1) * V;
  const T* Q = dp != nullptr ? dp + (size_t)b * gamma * V : nullptr;  // null: deterministic draft
  const int64_t* t = toks + (size_t)b * gamma;
  const float* u = uni + (size_t)b * (gamma + 1);

  // 1. acceptance tests (gamma is small: serial on thread 0)
  if (threadIdx.x == 0) {
    int n = 0;
    for (; n < gamma; ++n) {
      const int64_t tok = t[n];
      if (tok < 0 || tok >= V) break;
      const double pv = to_d(P[(size_t)n * V + tok]);
      const double qv = Q != nullptr ? to_d(Q[(size_t)n * V + tok]) : 1.0;
      if (!((double)u[n] * qv <= pv)) break;
    }
    s_n = n;
    s_tok = n < gamma ? t[n] : -1;
    s_result = -1;
  }
  __syncthreads();
  const int n = s_n;
  const T* pn = P + (size_t)n * V;
  const T* qn = Q != nullptr ? Q + (size_t)(n < gamma ? n : 0) * V : nullptr;
  const int64_t tokn = s_tok;
  bool residual = n < gamma;

  // per-warp contiguous range [lo, hi), a multiple of 32 long
  const int per = (((V + kNW - 1) / kNW) + 31) / 32 * 32;
  const int lo = min(V, warp * per), hi = min(V, lo + per);

  // 2. per-warp sums (second round only for a degenerate residual)
  for (int round = 0; round < 2; ++round) {
    double s = 0.0;
    for (int j = lo + lane; j < hi; j += 32) s += rval(pn, qn, tokn, residual, j);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) s_part[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
      double tot = 0.0;
      for (int w = 0; w < kNW; ++w) tot += s_part[w];
      s_prefix = tot;  // temporarily the total
    }
    __syncthreads();
    const double total = s_prefix;
    __syncthreads();
    if (total > 0.0 || !residual) break;
    residual = false;  // degenerate residual: fall back to p_n (uniform decision)
  }

  // 3. owner warp of the target
  if (threadIdx.x == 0) {
    double tot = 0.0;
    for (int w = 0; w < kNW; ++w) tot += s_part[w];
    const double target = (double)u[gamma] * tot;
    double pre = 0.0;
    int owner = -1;
    for (int w = 0; w < kNW; ++w) {
      if (pre + s_part[w] > target && s_part[w] > 0.0) {
        owner = w;
        break;
      }
      pre += s_part[w];
    }
    s_owner = owner;
    s_prefix = pre;
    s_target = target;
  }
  __syncthreads();

  // 4. the owner warp scans its range
  if (warp == s_owner) {
    double run = s_prefix;
    const double target = s_target;
    int last = -1;  // last index with r > 0 seen (rounding fallback inside this range)
    bool found = false;
    for (int base = lo; base < hi; base += 32) {
      const int j = base + lane;
      const double rv = j < hi ? rval(pn, qn, tokn, residual, j) : 0.0;
      if (rv > 0.0) last = j;
      double v = rv;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const double o = __shfl_up_sync(0xffffffffu, v, off);
        if (lane >= off) v += o;
      }
      const double c = run + v;
      const unsigned hit = __ballot_sync(0xffffffffu, c > target && j < hi);
      if (hit) {
        if (lane == 0) s_result = base + __ffs(hit) - 1;
        found = true;
        break;
      }
      run += __shfl_sync(0xffffffffu, v, 31);
    }
    if (!found) {  // pass-1 and pass-2 sums rounded differently: end of this range
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) last = max(last, __shfl_xor_sync(0xffffffffu, last, off));
      if (lane == 0) s_result = last;
    }
  }
  __syncthreads();

  // 5. rounding fallback: last index with positive mass
  if (s_result < 0) {
    int last = -1;
    for (int j = threadIdx.x; j < V; j += kThreads)
      if (rval(pn, qn, tokn, residual, j) > 0.0) last = j;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) last = max(last, __shfl_xor_sync(0xffffffffu, last, off));
    if (lane == 0) s_lastnz[warp] = last;
    __syncthreads();
    if (threadIdx.x == 0) {
      int best = -1;
      for (int w = 0; w < kNW; ++w) best = max(best, s_lastnz[w]);
      s_result = best >= 0 ? best : V - 1;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    n_out[b] = n;
    next_out[b] = s_result;
  }
}

template <typename T>
cudaError_t launch(const void* tp, const void* dp, const int64_t* toks, const float* u,
                   int64_t* n_out, int64_t* next_out, int B, int gamma, int V, cudaStream_t st) {
  fused_verify_kernel<T><<<B, kThreads, 0, st>>>((const T*)tp, (const T*)dp, toks, u, n_out,
                                                 next_out, gamma, V);
  return cudaGetLastError();
}

}  // namespace

cudaError_t fused_verify(const void* tp, const void* dp, const int64_t* toks, const float* u,
                         int64_t* n_out, int64_t* next_out, int B, int gamma, int V, DType dt,
                         cudaStream_t st) {
  if (B <= 0) return cudaSuccess;
  if (V <= 0 || gamma < 0) return cudaErrorInvalidValue;
  switch (dt) {
    case kF32: return launch<float>(tp, dp, toks, u, n_out, next_out, B, gamma, V, st);
    case kF16: return launch<__half>(tp, dp, toks, u, n_out, next_out, B, gamma, V, st);
    case kBF16: return launch<__nv_bfloat16>(tp, dp, toks, u, n_out, next_out, B, gamma, V, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace scl_cuda
