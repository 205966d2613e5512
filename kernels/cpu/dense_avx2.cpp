// AVX2+FMA dense shift/FMA kernel (dense_kernels.h): 8 fp32 lanes, 16 ymm registers.
// Compiled with `#pragma GCC target`; selected at run time only if the CPU has AVX2+FMA.
#include "dense_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace scl {
namespace avx2 {

struct DOps {
  using V = __m256;
  static constexpr int W = 8;
  static constexpr int MB = 2;   // 4 rows x 2 m accumulators + 4 x vectors + 2 w: 14 of 16 ymm
  static inline V zero() { return _mm256_setzero_ps(); }
  static inline V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static inline V loadf(const float* p) { return _mm256_loadu_ps(p); }
  static inline float hsum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static inline void prefetch(const char* p) { _mm_prefetch(p, _MM_HINT_T0); }
  static inline void split_bf16(const uint16_t* p, V& a, V& b) {
    const __m256i v = _mm256_loadu_si256((const __m256i*)p);
    a = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    b = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xFFFF0000u)));
  }
  static inline void load_f16(const uint16_t* p, V& a, V& b) {
    a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
    b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 8)));
  }
};

#include "dense_simd_body.h"

}  // namespace avx2
}  // namespace scl

#pragma GCC pop_options

#else  // not x86: stubs, never selected

namespace scl {
namespace avx2 {
void dense_prep_x(const uint16_t*, int64_t, int64_t, int64_t, float*) {}
void dense_prep_x(const float*, int64_t, int64_t, int64_t, float*) {}
void dense_rows(const DenseParams&, int64_t, int64_t) {}
}  // namespace avx2
}  // namespace scl
#endif
