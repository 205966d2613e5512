// AVX-512 dense kernels (dense_kernels.h): the shift/FMA kernel for bf16, fp16 and fp32 weights
// (AVX-512F/BW), and the VDPBF16PS kernel for bf16 weights (AVX512_BF16).  Compiled with
// `#pragma GCC target`; selected at run time only if the CPU has the instructions.
#include "dense_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")

namespace scl {
namespace avx512 {

struct DOps {
  using V = __m512;
  static constexpr int W = 16;
  static constexpr int MB = 4;   // 4 rows x 4 m accumulators + 8 x vectors + 2 w: 26 of 32 zmm
  static inline V zero() { return _mm512_setzero_ps(); }
  static inline V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static inline V loadf(const float* p) { return _mm512_loadu_ps(p); }
  static inline float hsum(V v) { return _mm512_reduce_add_ps(v); }
  static inline void prefetch(const char* p) { _mm_prefetch(p, _MM_HINT_T0); }
  static inline void split_bf16(const uint16_t* p, V& a, V& b) {
    const __m512i v = _mm512_loadu_si512((const void*)p);
    a = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    b = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xFFFF0000u)));
  }
  static inline void load_f16(const uint16_t* p, V& a, V& b) {
    a = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
    b = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p + 16)));
  }
};

#include "dense_simd_body.h"

}  // namespace avx512
}  // namespace scl

#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")

namespace scl {
namespace avx512 {

bool dense_bf16_compiled() { return true; }

constexpr int DPMB = 4;  // m-rows per block: 4 m accumulators + 4 x vectors + 1 w

template <int R, int MB>
static inline void dp_block(const DenseParams& p, int64_t n0, int64_t m0) {
  __m512 acc[R][MB];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MB; ++m) acc[r][m] = _mm512_setzero_ps();
  const int64_t K = p.K, Kc = p.Kc;
  const uint16_t* xb = (const uint16_t*)p.x + m0 * K;
  const uint16_t* wb = (const uint16_t*)p.w + n0 * K;
  for (int64_t c = 0; c < Kc; c += 32) {
    __m512bh xv[MB];
    for (int m = 0; m < MB; ++m) xv[m] = (__m512bh)_mm512_loadu_si512((const void*)(xb + m * K + c));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const uint16_t* wr = wb + r * K + c;
      const __m512bh wv = (__m512bh)_mm512_loadu_si512((const void*)wr);
      for (int m = 0; m < MB; ++m) acc[r][m] = _mm512_dpbf16_ps(acc[r][m], wv, xv[m]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MB; ++m) dense_finish(p, m0 + m, n0 + r, _mm512_reduce_add_ps(acc[r][m]));
}

template <int R, int MBX>
static inline void dp_tail_m(const DenseParams& p, int64_t n0, int64_t m0, int64_t rm) {
  if constexpr (MBX >= 1) {
    if (rm == MBX) return dp_block<R, MBX>(p, n0, m0);
    dp_tail_m<R, MBX - 1>(p, n0, m0, rm);
  }
}

template <int R>
static inline void dp_rows_m(const DenseParams& p, int64_t n0) {
  int64_t m0 = 0;
  for (; m0 + DPMB <= p.M; m0 += DPMB) dp_block<R, DPMB>(p, n0, m0);
  dp_tail_m<R, DPMB - 1>(p, n0, m0, p.M - m0);
}

// One row of W at a time, in address order, no software prefetch: a thread's rows are one sequential
// stream, which the hardware prefetcher follows at full speed. Measured cold (48 distinct 4864 x 896
// bf16 matrices, this EPYC VM, 2 threads): 4 interleaved rows with a 1 KB prefetch read 16 GB/s at
// M = 1 and 9.3 at M = 8; one row at a time 23.1 and 12.3.  At M >= 2 one row's 4 accumulator chains wait
// on VDPBF16PS's latency, so DP_ROWS rows go together (16 chains); each output's sum runs in the same
// order either way.
constexpr int DP_ROWS = 4;
void dense_rows_dp(const DenseParams& p, int64_t n0, int64_t n1) {
  int64_t n = n0;
  if (p.M > 1)
    for (; n + DP_ROWS <= n1; n += DP_ROWS) dp_rows_m<DP_ROWS>(p, n);
  for (; n < n1; ++n) dp_rows_m<1>(p, n);
}

}  // namespace avx512
}  // namespace scl

#pragma GCC pop_options

#else  // not x86: stubs, never selected

namespace scl {
namespace avx512 {
bool dense_bf16_compiled() { return false; }
void dense_prep_x(const uint16_t*, int64_t, int64_t, int64_t, float*) {}
void dense_prep_x(const float*, int64_t, int64_t, int64_t, float*) {}
void dense_rows(const DenseParams&, int64_t, int64_t) {}
void dense_rows_dp(const DenseParams&, int64_t, int64_t) {}
}  // namespace avx512
}  // namespace scl
#endif
