// Decode attention for ragged batches (sm_80+): one query row per sequence, each sequence its own
// cache slot and its own length, grouped-query heads.  Flash-decoding: the keys of a sequence are
// split into chunks handled by separate blocks (so a batch of 1 with 2 kv heads still fills the
// GPU), each block keeps an online softmax per query head, and a second kernel merges the chunks.
//
//   grid (B, KV, nsplit), 4 warps: block (b, h, s) owns keys [s*kps, min((s+1)*kps, len[b])) of
//   kv head h of slot[b] and the G = H/KV query heads that share it; warp w takes every 4th key;
//   a lane holds D/32 consecutive elements of each query (pre-scaled by scale * log2 e, so the
//   softmax runs on exp2) and of each key/value row it reads; q.k is a 5-step xor-shuffle sum.
//   Warps merge through shared memory; the block writes (max, sum, acc[D]) per query head.
//   combine: one block of D threads per (b, query head) merges the nsplit partials.
// Lengths and slots are device tensors, so one launch configuration (from the cache capacity)
// serves every step: the kernel can be captured in a CUDA graph.
// Two cache layouts (a template flag, so the slot path is unchanged):
//   slot cache:  k/v [slots, KV, cap, D], position j of slot s at row (s*KV + h)*cap + j;
//   paged cache: k/v [blocks, KV, bs, D] and an int32 block table [slots, tw] on the device (cap =
//   tw*bs): position j of slot s lives in block table[s*tw + j/bs] at offset j%bs
//   (engine/infer/paged.py).  The table is read in the kernel, so a graph replay sees the
//   scheduler's in-place updates.
#include "qgemm_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace scl_cuda {
namespace {

constexpr int kAttWarps = 4;
constexpr int kMaxG = 8;   // query heads per kv head handled by one block

__device__ __forceinline__ float ld_f(const float* p) { return *p; }
__device__ __forceinline__ float ld_f(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float ld_f(const __nv_bfloat16* p) { return __bfloat162float(*p); }
template <typename T> __device__ __forceinline__ T st_f(float v);
template <> __device__ __forceinline__ float st_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half st_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 st_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// PAGED: minBlocks 1 lifts ptxas's own register target (72 at D = 64), which the table walk
// would exceed by a spill; the slot kernels (minBlocks 0: no hint) compile as before.
template <typename T, int D, bool PAGED>
__global__ void __launch_bounds__(kAttWarps * 32, PAGED ? 1 : 0)
decode_attn_split(const T* __restrict__ q, const T* __restrict__ kc, const T* __restrict__ vc,
                  const int64_t* __restrict__ slots, const int64_t* __restrict__ lens,
                  const int32_t* __restrict__ table, int tw, int bs,
                  float* __restrict__ pm, float* __restrict__ pl, float* __restrict__ pacc,
                  int H, int KV, int cap, int nsplit, int kps, float qscale) {
  constexpr int E = D / 32;
  const int b = blockIdx.x, kh = blockIdx.y, sp = blockIdx.z;
  const int G = H / KV;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t len = lens[b], slot = slots[b];
  const int64_t j0 = (int64_t)sp * kps;
  const int64_t j1 = min(j0 + kps, len);

  float qf[kMaxG][E], acc[kMaxG][E], m[kMaxG], l[kMaxG];
#pragma unroll
  for (int g = 0; g < kMaxG; ++g) {
    m[g] = neg_inf();
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      acc[g][e] = 0.f;
      qf[g][e] = g < G ? ld_f(q + ((size_t)b * H + kh * G + g) * D + lane * E + e) * qscale : 0.f;
    }
  }
  // slot layout: the slot's rows are contiguous; paged: this slot's row of the block table
  const size_t base = PAGED ? (size_t)lane * E : (((size_t)slot * KV + kh) * cap) * D + lane * E;
  const int32_t* trow = PAGED ? table + (size_t)slot * tw : nullptr;
  // paged: key j is at offset jo of the table's block jb, stepped along with j (bs >= kAttWarps)
  int jb = PAGED ? (int)((j0 + warp) / bs) : 0;
  int jo = PAGED ? (int)(j0 + warp - (int64_t)jb * bs) : 0;
  for (int64_t j = j0 + warp; j < j1; j += kAttWarps) {
    size_t row;   // the key's row of D values in k/v
    if (PAGED) {
      row = ((size_t)__ldg(trow + jb) * KV + kh) * bs + jo;
      jo += kAttWarps;
      if (jo >= bs) {
        jo -= bs;
        ++jb;
      }
    } else {
      row = (size_t)j;
    }
    float kf[E], vf[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      kf[e] = ld_f(kc + base + row * D + e);
      vf[e] = ld_f(vc + base + row * D + e);
    }
    float sc[kMaxG];
#pragma unroll
    for (int g = 0; g < kMaxG; ++g) {   // shuffles outside any branch (a branch makes them calls)
      float s = 0.f;
#pragma unroll
      for (int e = 0; e < E; ++e) s = fmaf(qf[g][e], kf[e], s);
      sc[g] = s;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int g = 0; g < kMaxG; ++g) sc[g] += __shfl_xor_sync(0xffffffffu, sc[g], o);
#pragma unroll
    for (int g = 0; g < kMaxG; ++g) {
      if (g < G) {
        const float s = sc[g];
        const float mn = fmaxf(m[g], s);
        const float corr = exp2f(m[g] - mn), p = exp2f(s - mn);
        l[g] = l[g] * corr + p;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[g][e] = fmaf(p, vf[e], acc[g][e] * corr);
        m[g] = mn;
      }
    }
  }
  __shared__ float sm_m[kAttWarps][kMaxG], sm_l[kAttWarps][kMaxG];
  __shared__ float sm_acc[kAttWarps][kMaxG][D];
#pragma unroll
  for (int g = 0; g < kMaxG; ++g) {
    if (lane == 0) {
      sm_m[warp][g] = m[g];
      sm_l[warp][g] = l[g];
    }
#pragma unroll
    for (int e = 0; e < E; ++e) sm_acc[warp][g][lane * E + e] = acc[g][e];
  }
  __syncthreads();
  for (int t = threadIdx.x; t < G * D; t += blockDim.x) {
    const int g = t / D, d = t % D;
    float M = neg_inf();
#pragma unroll
    for (int w = 0; w < kAttWarps; ++w) M = fmaxf(M, sm_m[w][g]);
    float L = 0.f, A = 0.f;
    if (M != neg_inf()) {
#pragma unroll
      for (int w = 0; w < kAttWarps; ++w) {
        const float f = exp2f(sm_m[w][g] - M);   // a warp without keys: exp2(-inf) = 0
        L = fmaf(f, sm_l[w][g], L);
        A = fmaf(f, sm_acc[w][g][d], A);
      }
    }
    const size_t idx = ((size_t)b * H + kh * G + g) * nsplit + sp;
    if (d == 0) {
      pm[idx] = M;
      pl[idx] = L;
    }
    pacc[idx * D + d] = A;
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(D)
decode_attn_combine(const float* __restrict__ pm, const float* __restrict__ pl, const float* __restrict__ pacc,
                    T* __restrict__ out, int nsplit) {
  const size_t row = blockIdx.x;   // b * H + head
  const int d = threadIdx.x;
  float M = neg_inf();
  for (int s = 0; s < nsplit; ++s) M = fmaxf(M, pm[row * nsplit + s]);
  float L = 0.f, A = 0.f;
  if (M != neg_inf()) {
    for (int s = 0; s < nsplit; ++s) {
      const float f = exp2f(pm[row * nsplit + s] - M);
      L = fmaf(f, pl[row * nsplit + s], L);
      A = fmaf(f, pacc[(row * nsplit + s) * D + d], A);
    }
  }
  out[row * D + d] = st_f<T>(L > 0.f ? A / L : 0.f);
}

template <typename T, int D>
cudaError_t launch(const void* q, const void* k, const void* v, const int64_t* slots, const int64_t* lens,
                   const int32_t* table, int tw, int bs, float* ws, void* out, int B, int H, int KV, int cap,
                   float scale, cudaStream_t stream) {
  const int nsplit = attention_splits(cap), kps = (cap + nsplit - 1) / nsplit;
  float* pm = ws;
  float* pl = pm + (size_t)B * H * nsplit;
  float* pacc = pl + (size_t)B * H * nsplit;
  const dim3 grid(B, KV, nsplit);
  const float qs = scale * 1.44269504088896341f;
  if (table)
    decode_attn_split<T, D, true><<<grid, kAttWarps * 32, 0, stream>>>(
        (const T*)q, (const T*)k, (const T*)v, slots, lens, table, tw, bs, pm, pl, pacc, H, KV, cap, nsplit, kps, qs);
  else
    decode_attn_split<T, D, false><<<grid, kAttWarps * 32, 0, stream>>>(
        (const T*)q, (const T*)k, (const T*)v, slots, lens, nullptr, 0, 0, pm, pl, pacc, H, KV, cap, nsplit, kps, qs);
  decode_attn_combine<T, D><<<B * H, D, 0, stream>>>(pm, pl, pacc, (T*)out, nsplit);
  return cudaGetLastError();
}

}  // namespace

int attention_splits(int cap) {
  // about 256 keys per block, at most 32 blocks per (sequence, kv head)
  int s = (cap + 255) / 256;
  return s < 1 ? 1 : (s > 32 ? 32 : s);
}

size_t attention_workspace_floats(int B, int H, int D, int cap) {
  const size_t n = (size_t)B * H * attention_splits(cap);
  return n * (2 + D);
}

cudaError_t decode_attention(const void* q, const void* k, const void* v, const int64_t* slots,
                             const int64_t* lens, const int32_t* table, int table_w, int block_size,
                             float* workspace, void* out, int B, int H, int KV, int D, int cap, float scale,
                             DType dt, cudaStream_t stream) {
  if (H % KV != 0 || H / KV > kMaxG || (D != 64 && D != 128) || B < 1 || cap < 1)
    return cudaErrorInvalidValue;
  if (table && (table_w < 1 || block_size < kAttWarps || (int64_t)table_w * block_size != cap))
    return cudaErrorInvalidValue;
#define SCL_ATT_LAUNCH(T, DD) \
  launch<T, DD>(q, k, v, slots, lens, table, table_w, block_size, workspace, out, B, H, KV, cap, scale, stream)
  if (D == 64) {
    if (dt == kF32) return SCL_ATT_LAUNCH(float, 64);
    if (dt == kF16) return SCL_ATT_LAUNCH(__half, 64);
    return SCL_ATT_LAUNCH(__nv_bfloat16, 64);
  }
  if (dt == kF32) return SCL_ATT_LAUNCH(float, 128);
  if (dt == kF16) return SCL_ATT_LAUNCH(__half, 128);
  return SCL_ATT_LAUNCH(__nv_bfloat16, 128);
#undef SCL_ATT_LAUNCH
}

}  // namespace scl_cuda
