// Serving Cost Lab -- the fused step's bf16 linears (a bf16 model's, Lin kind 16): the model's own bf16
// weight [N][K] through the dense kernels (dense_kernels.h), tile by tile as the quantized kinds.
//
// What a bf16 linear computes here: its input rows (fp32 in the step) rounded once to bf16, products
// with the bf16 weights exact in fp32, fp32 sums, an fp32 output (no rounding of y). Everything between
// the linears (norms, RoPE, attention, the residual) stays fp32, and the KV cache holds bf16 values. This is
// llama.cpp's BF16 (ggml rounds a matmul's fp32 input to bf16; the rest is fp32), one rounding per linear
// fewer than torch's bf16 path, which rounds after every op (engine/ops/fused.py says which ran).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "dense_kernels.h"
#include "qgemm_kernels.h"

namespace scl {
namespace fused {

// Rows of one input prepared for bf16 consumers: rounded to bf16 ([rows][K]), and for the shift/FMA
// kernels (AVX2, AVX-512 without BF16) the even/odd-split fp32 copy of those bf16 values ([rows][K]), made
// by the first step that runs those kernels (VDPBF16PS reads xb: the copy would be twice xb's bytes unread).
struct BAct {
  int64_t K = 0;
  std::vector<uint16_t> xb;
  std::vector<float> xs;
  void init(int64_t rows, int64_t k) {
    K = k;
    xb.assign((size_t)(rows * k), 0);
    xs.clear();
  }
  void need_split() {  // before a step's threads start: never resized while they run
    if (xs.size() != xb.size()) xs.assign(xb.size(), 0.f);
  }
};

using DenseRowsFn = void (*)(const DenseParams&, int64_t, int64_t);
using DenseSplitFn = void (*)(const uint16_t*, int64_t, int64_t, int64_t, float*);

// Columns [k0, k1) of row m (multiples of 32: the kernels' chunks, so a split chunk never straddles k0).
inline void prep_bf16_cols(DenseSplitFn split, const float* xrow, int64_t k0, int64_t k1, int64_t m, BAct& a) {
  uint16_t* b = a.xb.data() + m * a.K;
  for (int64_t k = k0; k < k1; ++k) b[k] = float_to_bf16(xrow[k]);
  if (split) split(b + k0, 1, k1 - k0, k1 - k0, a.xs.data() + m * a.K + k0);
}

// Output columns of tiles [tb, te) (TILE weight rows each) for M prepared rows; bias fp32 or none.
inline void bf16_tiles(DenseRowsFn rows, const void* w, const float* bias, int64_t N, int64_t K, const BAct& a,
                       int64_t M, float* y, int64_t tb, int64_t te) {
  DenseParams p{w, a.xb.data(), a.xs.data(), K, bias, y, M, N, K, K, true, false, true, false};
  p.y_f32 = true;
  rows(p, tb * TILE, std::min(N, te * TILE));
}

}  // namespace fused
}  // namespace scl
