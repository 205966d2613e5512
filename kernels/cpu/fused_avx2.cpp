// The fused step's pieces with AVX2 + FMA (8 fp32 lanes).
#include "fused_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace scl {
namespace avx2 {

#include "fused_q8_x86.h"

struct FOps {
  using V = __m256;
  static constexpr int W = 8;
  static inline V zero() { return _mm256_setzero_ps(); }
  static inline V set1(float f) { return _mm256_set1_ps(f); }
  static inline V load(const float* p) { return _mm256_loadu_ps(p); }
  static inline V load_i8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static inline V load_bf16(const uint16_t* p) {   // bf16 -> fp32 is a shift into the high half: exact
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  }
  static inline void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static inline V add(V a, V b) { return _mm256_add_ps(a, b); }
  static inline V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static inline V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static inline V div(V a, V b) { return _mm256_div_ps(a, b); }
  static inline V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static inline V max(V a, V b) { return _mm256_max_ps(a, b); }
  static inline V min(V a, V b) { return _mm256_min_ps(a, b); }
  static inline float hsum(V v) { return sum8(v); }
  static inline float hmax(V v) {
    __m128 t = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_max_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_max_ss(t, _mm_shuffle_ps(t, t, 1)));
  }
  static inline void hsum4(V a, V b, V c, V d, float* o) { sum8x4(a, b, c, d, o); }
  static inline V round(V v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static inline V pow2i(V n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
};

#include "fused_simd_body.h"

}  // namespace avx2
}  // namespace scl

#pragma GCC pop_options

#else
namespace scl {
namespace avx2 {
void rmsnorm(const float*, const float*, float, int64_t, float*) {}
void silu_mul(const float*, const float*, float*, int64_t) {}
void gelu_tanh_mul(const float*, const float*, float*, int64_t) {}
void rope(float*, const float*, const float*, int64_t) {}
void attention(const AttnItem&) {}
void add_inplace(float*, const float*, int64_t) {}
}  // namespace avx2
}  // namespace scl
#endif
