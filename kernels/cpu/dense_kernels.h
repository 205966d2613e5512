// Serving Cost Lab -- dense (fp32 / bf16 / fp16 weight) GEMV / small-M GEMM CPU kernels.
//
// y[M, N] = x[M, K] @ W[N, K]^T (+ bias), W in its natural nn.Linear layout (row-major [N, K],
// no packed copy: the model's own parameter is read), accumulation in fp32, one rounding of
// the output to the activation dtype at the end (what torch/oneDNN does).
//
//   bf16 weights, bf16 x -> bf16 y;  fp32 weights, fp32 x -> fp32 y;
//   bf16 or fp16 weights, fp32 x -> fp32 y (a checkpoint's dense head held as stored: every weight
//   widened to fp32 exactly, so the result is the fp32 linear's).  Bias: fp32 or bf16, or none.
//
// Work split: threads take blocks of DR = 4 consecutive rows of W; a block's R rows are
// streamed together (4 independent sequential streams, one FMA chain per row and m-row), and
// M is walked in blocks of Ops::MB rows that re-read the block's rows from L1/L2.
//
// bf16 -> fp32 (the "shift" kernels, AVX-512 and AVX2): a 32-bit lane of W holds the pair
// (w[2i], w[2i+1]); `lane << 16` is w[2i] as fp32 and `lane & 0xFFFF0000` is w[2i+1], exactly.
// So the activations are pre-split once per call into even/odd fp32 halves per chunk of 2*W k
// (xp), and each chunk costs one load, one shift, one AND and two FMAs per row and m.
// AVX-512 BF16 (the "dp" kernel): VDPBF16PS multiplies 32 bf16 pairs and adds them into 16 fp32
// lanes (products exact in fp32; the CPU flushes fp32 denormals, far below any activation scale).
// fp16 -> fp32 (F16C's VCVTPH2PS, exact): a chunk is 2*W consecutive weights against x as is.
// k beyond the last whole chunk (K % chunk) is summed in scalar fp32 code.
#pragma once
#include <cstdint>
#include <cstring>

namespace scl {

constexpr int DR = 4;   // W rows per block (threads split N in these)

struct DenseParams {
  const void* w;        // [N][K] bf16 bits (w_bf16), fp16 bits (w_f16) or fp32
  const void* x;        // [M][K] raw activations: bf16 (io_bf16) or fp32
  const float* xp;      // shift kernels, bf16 w: [M][Kc] even/odd-split fp32 copy; otherwise == x (fp32)
  int64_t ldxp;         // row stride of xp (Kc for the bf16 copy, K when xp == x)
  const void* bias;     // [N] or nullptr
  void* y;              // [M][N], x's dtype
  int64_t M, N, K, Kc;  // Kc: k covered by whole SIMD chunks (multiple of the chunk, <= K)
  bool w_bf16, w_f16, io_bf16, bias_bf16;
  const uint32_t* xb = nullptr;  // AMX kernel: x packed as TDPBF16PS's B operand (amx::pack_x)
  bool y_f32 = false;            // bf16 x with an fp32 y (the fused step's bf16 linears: no rounding of the output)
};

inline float bf16_to_float(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// fp32 -> bf16, round to nearest even (c10::BFloat16's rounding; NaN stays NaN).
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

// IEEE half -> fp32, exact (normals, subnormals, zeros, inf and NaN).
inline float f16_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, u;
  if (exp == 0x1Fu) {
    u = sign | 0x7F800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: shift the mantissa up to a leading 1
    exp = 113u;
    while (!(man & 0x400u)) { man <<= 1; --exp; }
    u = sign | (exp << 23) | ((man & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float dense_w(const DenseParams& p, int64_t n, int64_t k) {
  const int64_t i = n * p.K + k;
  return p.w_bf16 ? bf16_to_float(((const uint16_t*)p.w)[i])
         : p.w_f16 ? f16_to_float(((const uint16_t*)p.w)[i]) : ((const float*)p.w)[i];
}
inline float dense_x(const DenseParams& p, int64_t m, int64_t k) {
  return p.io_bf16 ? bf16_to_float(((const uint16_t*)p.x)[m * p.K + k]) : ((const float*)p.x)[m * p.K + k];
}

// Sum over the tail k in [Kc, K) added to s, then bias, then the one rounding to the output dtype.
inline void dense_finish(const DenseParams& p, int64_t m, int64_t n, float s) {
  for (int64_t k = p.Kc; k < p.K; ++k) s += dense_w(p, n, k) * dense_x(p, m, k);
  if (p.bias)
    s += p.bias_bf16 ? bf16_to_float(((const uint16_t*)p.bias)[n]) : ((const float*)p.bias)[n];
  if (p.io_bf16 && !p.y_f32)
    ((uint16_t*)p.y)[m * p.N + n] = float_to_bf16(s);
  else
    ((float*)p.y)[m * p.N + n] = s;
}

// Each entry point computes output rows [n0, n1) for all M rows.
// prep_x: the even/odd split copy of the activations (bf16 or fp32) for bf16 weights in the shift kernels (k < Kc).
namespace scalar {
void dense_rows(const DenseParams& p, int64_t n0, int64_t n1);
}
namespace avx2 {
constexpr int DENSE_CHUNK = 16;
void dense_prep_x(const uint16_t* x, int64_t M, int64_t K, int64_t Kc, float* xp);
void dense_prep_x(const float* x, int64_t M, int64_t K, int64_t Kc, float* xp);
void dense_rows(const DenseParams& p, int64_t n0, int64_t n1);
}
namespace avx512 {
constexpr int DENSE_CHUNK = 32;
bool dense_bf16_compiled();
void dense_prep_x(const uint16_t* x, int64_t M, int64_t K, int64_t Kc, float* xp);
void dense_prep_x(const float* x, int64_t M, int64_t K, int64_t Kc, float* xp);
void dense_rows(const DenseParams& p, int64_t n0, int64_t n1);
void dense_rows_dp(const DenseParams& p, int64_t n0, int64_t n1);  // needs AVX512_BF16, bf16 w and x only
}
bool has_avx512_bf16();  // dense.cpp: AVX512_BF16 compiled in and on this CPU (VDPBF16PS can run)

namespace amx {  // dense_amx.cpp: TDPBF16PS, bf16 w and x only; rows in blocks of AMX_ROWS (fixed by N)
constexpr int AMX_ROWS = 32;
bool available();  // AMX-TILE + AMX-BF16 + AVX512_BF16, and the OS lets this process use the tiles
void pack_x(const uint16_t* x, int64_t M, int64_t K, int64_t Kc, uint32_t* xb);  // [ceil(M/16)][Kc/32][16][16]
void dense_rows(const DenseParams& p, int64_t n0, int64_t n1);
}

}  // namespace scl
