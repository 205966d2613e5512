// AVX2+FMA(+F16C) micro-kernels: 8 fp32 lanes, 16 ymm registers, so a
// 64-row tile is processed in sub-tiles of NV*8 rows.
// Compiled with `#pragma GCC target` so the rest of the extension stays
// baseline x86-64; selected at run time only if __builtin_cpu_supports says so.
#include "qgemm_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace scl {
namespace avx2 {

struct Ops {
  using V = __m256;
  using VI = __m256i;
  static constexpr int W = 8;
  static constexpr int NV8 = 4, MB8 = 3;
  static constexpr int NV4 = 2, MB4 = 4;
  static inline V zero() { return _mm256_setzero_ps(); }
  static inline V bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static inline V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static inline V add(V a, V b) { return _mm256_add_ps(a, b); }
  static inline V loadf(const float* p) { return _mm256_loadu_ps(p); }
  static inline void storef(float* p, V v) { _mm256_storeu_ps(p, v); }
  static inline V load_s8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
  }
  static inline VI loadi(const uint32_t* p) { return _mm256_loadu_si256((const __m256i*)p); }
  static inline V nib(VI q, int j) {
    if (j == 7) return _mm256_cvtepi32_ps(_mm256_srli_epi32(q, 28));
    return _mm256_cvtepi32_ps(_mm256_and_si256(q, _mm256_set1_epi32(0xF << (4 * j))));
  }
  static inline V load_h(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
  }
};

bool compiled() { return true; }

#include "qgemm_simd_body.h"

}  // namespace avx2
}  // namespace scl

#pragma GCC pop_options

#else  // not x86: stubs, never selected

namespace scl {
namespace avx2 {
bool compiled() { return false; }
void int8_tiles(const Int8Params&, int64_t, int64_t) {}
void int4_tiles(const Int4Params&, int64_t, int64_t) {}
}  // namespace avx2
}  // namespace scl
#endif
