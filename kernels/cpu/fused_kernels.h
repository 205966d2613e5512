// Serving Cost Lab -- the fused decode step's per-ISA pieces (torch-free).
//
// fused_cpu.cpp runs a whole forward pass of up to FUSED_MAX_ROWS token rows in one OpenMP
// parallel region: per layer RMSNorm, the fused qkv projection, RoPE, the KV-cache write,
// attention over each sequence's own length, o projection + residual, RMSNorm, gate/up,
// silu * up, down + residual; then the final norm and the head.  The projections are the
// per-op kernels' tile functions (qgemm_kernels.h; a bf16 model's, dense_kernels.h through
// fused_bf16.h); the rest is here, compiled once per ISA
// (fused_avx512.cpp, fused_avx2.cpp, fused_scalar.cpp) from fused_simd_body.h.
#pragma once
#include <cstdint>

#include "qgemm_kernels.h"

namespace scl {

constexpr int FUSED_MAX_ROWS = 64;   // rows per fused call (= MAX_M of the tile kernels); more are chunked
constexpr int ATT_ROWS = 16;         // rows of one sequence per attention work item
constexpr int FUSED_MAX_Q = 512;     // queries per attention item: ATT_ROWS x q heads per kv head
constexpr int64_t KEY_TILE = 64;     // keys per tile of the attention kernel: a paged cache's block size is a multiple

// One attention work item: the rows of one sequence x one kv head (its G query heads).
// Query qi = row (qi / G), head (qi % G); row i attends to keys [start[i], len[i]) (start > 0:
// a sliding window; keys before the item's first start are never read).
// The arithmetic of one query never depends on the others (fixed key blocks from 0), so a
// row's output is the same in any batch.
struct AttnItem {
  const float* q;        // [nq][D] queries, RoPE applied
  int64_t nq, G;
  const int64_t* start;  // [nq / G] first key per row
  const int64_t* len;    // [nq / G] keys per row
  // key tile t (keys [t * KEY_TILE, (t + 1) * KEY_TILE), contiguous [KEY_TILE][D]) of this (layer,
  // sequence, kv head): in a slot cache consecutive tiles, in a paged cache wherever its block is
  const float* const* kt;
  const float* const* vt;
  float* scores;         // [nq][maxlen] workspace
  float* out;            // [nq][D]
  int64_t D, maxlen;
  float scale;
  float softcap;         // 0: none; else scores become softcap * tanh(score / softcap)
  // an int8 cache (engine/infer/paged.py): kt/vt unused; tile t's int8 keys/values [KEY_TILE][D] and
  // their fp16 scales ([KEY_TILE][D / 32] per key, [KEY_TILE] per value); the queries quantized as the
  // keys are (q8 [nq][D], qs [nq][D / 32] as floats), so q.k is an integer dot product per 32 values
  const int8_t* const* kt8 = nullptr;
  const int8_t* const* vt8 = nullptr;
  const uint16_t* const* ks = nullptr;
  const uint16_t* const* vs = nullptr;
  const int8_t* q8 = nullptr;
  const float* qs = nullptr;
  // a bf16 cache (a bf16 model's): kt/vt unused; tile t's bf16 keys/values [KEY_TILE][D], widened as read
  const uint16_t* const* kt16 = nullptr;
  const uint16_t* const* vt16 = nullptr;
};

#define SCL_DECLARE_FUSED                                                        \
  void rmsnorm(const float* x, const float* w, float eps, int64_t K, float* out); \
  void silu_mul(const float* g, const float* u, float* h, int64_t n);            \
  void gelu_tanh_mul(const float* g, const float* u, float* h, int64_t n);       \
  void rope(float* v, const float* cs, const float* sn, int64_t D);              \
  void attention(const AttnItem& a);                                             \
  void add_inplace(float* x, const float* y, int64_t n);
namespace scalar { SCL_DECLARE_FUSED }
namespace avx2 { SCL_DECLARE_FUSED }
namespace avx512 { SCL_DECLARE_FUSED }
#undef SCL_DECLARE_FUSED

}  // namespace scl
