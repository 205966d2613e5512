// The fused step's pieces with AVX-512F (16 fp32 lanes); selected at run time only when the
// CPU has AVX-512 (fused_cpu.cpp), like qgemm_avx512.cpp.
#include "fused_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

namespace scl {
namespace avx512 {

#include "fused_q8_x86.h"

struct FOps {
  using V = __m512;
  static constexpr int W = 16;
  static inline V zero() { return _mm512_setzero_ps(); }
  static inline V set1(float f) { return _mm512_set1_ps(f); }
  static inline V load(const float* p) { return _mm512_loadu_ps(p); }
  static inline V load_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static inline V load_bf16(const uint16_t* p) {   // bf16 -> fp32 is a shift into the high half: exact
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  }
  static inline void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static inline V add(V a, V b) { return _mm512_add_ps(a, b); }
  static inline V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static inline V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static inline V div(V a, V b) { return _mm512_div_ps(a, b); }
  static inline V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static inline V max(V a, V b) { return _mm512_max_ps(a, b); }
  static inline V min(V a, V b) { return _mm512_min_ps(a, b); }
  static inline float hsum(V v) { return _mm512_reduce_add_ps(v); }
  static inline float hmax(V v) { return _mm512_reduce_max_ps(v); }
  // the 4 horizontal sums of a..d into o[0..3] (folds to 8 lanes, then three hadds: ~3 ops per sum)
  static inline void hsum4(V a, V b, V c, V d, float* o) {
    const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
    const __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    const __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
    sum8x4(a8, b8, c8, d8, o);
  }
  static inline V round(V v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static inline V pow2i(V n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
};

#include "fused_simd_body.h"

}  // namespace avx512
}  // namespace scl

#pragma GCC pop_options

#else
namespace scl {
namespace avx512 {
void rmsnorm(const float*, const float*, float, int64_t, float*) {}
void silu_mul(const float*, const float*, float*, int64_t) {}
void gelu_tanh_mul(const float*, const float*, float*, int64_t) {}
void rope(float*, const float*, const float*, int64_t) {}
void attention(const AttnItem&) {}
void add_inplace(float*, const float*, int64_t) {}
}  // namespace avx512
}  // namespace scl
#endif
