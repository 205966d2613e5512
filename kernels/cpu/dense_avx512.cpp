// AVX-512 dense kernels (dense_kernels.h): the shift/FMA kernel for bf16, fp16 and fp32 weights
// (AVX-512F/BW), and the VDPBF16PS kernel for bf16 weights (AVX512_BF16).  Compiled with
// `#pragma GCC target`; selected at run time only if the CPU has the instructions.
#include "dense_kernels.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")

namespace scl {
namespace avx512 {

#include "dense_bf16_x86.h"

// One output's sum of its 16 lanes, in GCC's _mm512_reduce_add_ps order written out (so it does not hang on a
// compiler's choice): lanes at distance 8, then 4, then 2, then 1.
static inline float hsum1(__m512 v) {
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 e = _mm_add_ps(q, _mm_shuffle_ps(q, q, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(e) + _mm_cvtss_f32(_mm_shuffle_ps(e, e, 1));
}

// The 16 sums of v[0..15] at once, each added in hsum1's order (the same pairs at each level, so the same
// bits): 45 shuffles and adds where 16 separate sums take about 130. Lane 4 * (s % 4) + s / 4 holds v[s]'s
// sum, so with v[r * 4 + m] a 4 x 4 block's outputs come out as y's rows (finish4x4).
static inline __m512 hsum16(const __m512* v) {
  __m512 a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i)  // distance 8: each vector's halves; a[i] holds v[2i]'s 8 then v[2i+1]'s
    a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // distance 4: b[i]'s 128-bit block k holds v[4i + k]'s 4
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // distance 2: block k holds v[8i + k]'s 2, then v[8i + 4 + k]'s
    c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
  // distance 1: block k holds the sums of v[k], v[4 + k], v[8 + k], v[12 + k]
  return _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xDD));
}

// dense_finish for a 4 x 4 block with no k tail, vectorized: s is hsum16 of acc[r][m] (r * 4 + m), so its
// 128-bit block m holds y[m0 + m][n0 .. n0 + 3]. Bias added in fp32, then float_to_bf16's rounding (nearest
// even, NaN kept quiet) or fp32 stores: the same values as 16 dense_finish calls. At K = 896 (28 chunks a
// block) those calls and their 16 separate sums cost a sixth of the kernel's time at 64 rows.
static inline void finish4x4(const DenseParams& p, int64_t n0, int64_t m0, __m512 s) {
  if (p.bias) {
    const __m128 b = p.bias_bf16
        ? _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(_mm_loadl_epi64(
              (const __m128i*)((const uint16_t*)p.bias + n0))), 16))
        : _mm_loadu_ps((const float*)p.bias + n0);
    s = _mm512_add_ps(s, _mm512_broadcast_f32x4(b));
  }
  if (p.io_bf16 && !p.y_f32) {
    alignas(32) uint16_t o[16];
    _mm256_store_si256((__m256i*)o, bf16_round16(s));
    for (int m = 0; m < 4; ++m) std::memcpy((uint16_t*)p.y + (m0 + m) * p.N + n0, o + 4 * m, 8);
  } else {
    alignas(64) float o[16];
    _mm512_store_ps(o, s);
    for (int m = 0; m < 4; ++m) std::memcpy((float*)p.y + (m0 + m) * p.N + n0, o + 4 * m, 16);
  }
}

struct DOps {
  using V = __m512;
  static constexpr int W = 16;
  static constexpr int MB = 4;   // 4 rows x 4 m accumulators + 8 x vectors + 2 w: 26 of 32 zmm
  static inline V zero() { return _mm512_setzero_ps(); }
  static inline V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static inline V loadf(const float* p) { return _mm512_loadu_ps(p); }
  static inline float hsum(V v) { return hsum1(v); }
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

// pf: npf cache lines to prefetch, one per chunk (the next block's rows of W, while this one computes).
template <int R, int MB>
static inline void dp_block(const DenseParams& p, int64_t n0, int64_t m0, const char* pf = nullptr,
                            int64_t npf = 0) {
  __m512 acc[R][MB];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MB; ++m) acc[r][m] = _mm512_setzero_ps();
  const int64_t K = p.K, Kc = p.Kc;
  const uint16_t* xb = (const uint16_t*)p.x + m0 * K;
  const uint16_t* wb = (const uint16_t*)p.w + n0 * K;
  for (int64_t c = 0; c < Kc; c += 32) {
    if (c / 32 < npf) _mm_prefetch(pf + 2 * c, _MM_HINT_T0);
    __m512bh xv[MB];
    for (int m = 0; m < MB; ++m) xv[m] = (__m512bh)_mm512_loadu_si512((const void*)(xb + m * K + c));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const uint16_t* wr = wb + r * K + c;
      const __m512bh wv = (__m512bh)_mm512_loadu_si512((const void*)wr);
      for (int m = 0; m < MB; ++m) acc[r][m] = _mm512_dpbf16_ps(acc[r][m], wv, xv[m]);
    }
  }
  if constexpr (R * MB == 16)
    if (Kc == K) return finish4x4(p, n0, m0, hsum16(&acc[0][0]));
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MB; ++m) dense_finish(p, m0 + m, n0 + r, hsum1(acc[r][m]));
}

template <int R, int MBX>
static inline void dp_tail_m(const DenseParams& p, int64_t n0, int64_t m0, int64_t rm) {
  if constexpr (MBX >= 1) {
    if (rm == MBX) return dp_block<R, MBX>(p, n0, m0);
    dp_tail_m<R, MBX - 1>(p, n0, m0, rm);
  }
}

// From 16 rows of x on (compute-bound: W's rows are re-read from L1 by M / 4 blocks), the next R rows of W are
// prefetched over those blocks' chunks: the short row streams (K = 896: 28 lines a row) left the hardware
// prefetcher behind, a fifth of the time at M = 64. Fewer rows are bandwidth-bound and stream as they are.
template <int R>
static inline void dp_rows_m(const DenseParams& p, int64_t n0) {
  int64_t m0 = 0;
  const int64_t nmb = p.M / DPMB;
  const int64_t next = std::min<int64_t>(R, std::max<int64_t>(0, p.N - n0 - R));  // rows of the next block
  const int64_t lines = p.M >= 16 ? (next * p.K * 2 + 63) / 64 : 0, per = nmb ? (lines + nmb - 1) / nmb : 0;
  const char* pf = (const char*)((const uint16_t*)p.w + (n0 + R) * p.K);
  for (int64_t b = 0; m0 + DPMB <= p.M; m0 += DPMB, ++b)
    dp_block<R, DPMB>(p, n0, m0, pf + 64 * b * per, std::max<int64_t>(0, std::min(per, lines - b * per)));
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
