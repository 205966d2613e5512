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
  static inline VI loadq(const int8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }
  static inline V s8_at(VI q, int j) {   // byte j of each lane, sign-extended: two shifts (one for j = 3)
    return _mm256_cvtepi32_ps(j == 3 ? _mm256_srai_epi32(q, 24) : _mm256_srai_epi32(_mm256_slli_epi32(q, 24 - 8 * j), 24));
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
#include "act_prep_body.h"

// ---------------------------------------------------------------------------
// int4 weights x int8 activations without VNNI (any AVX2 CPU).  One 32-byte load = 8 rows x 8 k;
// AND 0x0F / (>>4) AND 0x0F give 8 rows x 4 consecutive k as unsigned bytes (the layout's nibble
// order), vpmaddubsw multiplies them with 4 broadcast int8 activations and adds pairs into int16.
// A 32-k block is 16 products per int16 lane, at most 16 * 15 * 127 = 30480 < 2^15: exact, so the
// int16 sums run over the whole block and one vpmaddwd (x 1) widens them to int32 per block.
// Then the same centring and scaling as the VNNI kernel (qgemm_avx512.cpp): identical integers.
constexpr int MBQ = 5;   // 2*MBQ accumulators + 5 temporaries fit the 16 ymm registers

// NV 8-row slices at once (NV * MB <= 4): with few activation rows (decode's one) each activation broadcast
// then serves NV weight vectors and each k step reads NV * 32 contiguous bytes, which is what bounds this kernel
// on CPUs without VNNI (its instructions, not memory: session 31's hot/cold profile). Each slice's float steps are
// the same, in the same order, as with NV = 1: identical outputs.
template <int MB, int NV>
static inline void uk4q8(const uint32_t* __restrict w, int64_t nb, const int8_t* __restrict xq,
                         int64_t ldq, const float* __restrict sx, const int32_t* __restrict bsum,
                         int64_t ldsx, const float* __restrict xs, int64_t ldxs,
                         const uint16_t* __restrict sm, float* __restrict C) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 accg[MB][NV];
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NV; ++n) accg[m][n] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i acc16[MB][NV];
    for (int m = 0; m < MB; ++m)
      for (int n = 0; n < NV; ++n) acc16[m][n] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int o = 0; o < 4; ++o) {
      const uint32_t* wo = w + (b * 4 + o) * TILE;
      for (int l = 0; l < NV * 32; l += 64)  // the cache lines of this k step's NV * 32 bytes
        _mm_prefetch((const char*)(wo + l / 4) + SCL_PF_BYTES, _MM_HINT_T0);
      const int8_t* xo = xq + (b * 4 + o) * 8;
#pragma GCC unroll 4
      for (int n = 0; n < NV; ++n) {
        const __m256i q = _mm256_loadu_si256((const __m256i*)(wo + 8 * n));
        const __m256i lo = _mm256_and_si256(q, mask);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) {
          int32_t x0, x1;
          __builtin_memcpy(&x0, xo + m * ldq, 4);
          __builtin_memcpy(&x1, xo + m * ldq + 4, 4);
          const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(x0)),
                                             _mm256_maddubs_epi16(hi, _mm256_set1_epi32(x1)));
          acc16[m][n] = _mm256_add_epi16(acc16[m][n], p);
        }
      }
    }
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m256i b8 = _mm256_set1_epi32(8 * bsum[m * ldsx + b]);
      const __m256 sxm = _mm256_set1_ps(sx[m * ldsx + b]);
      for (int n = 0; n < NV; ++n) {
        const __m256i c = _mm256_sub_epi32(_mm256_madd_epi16(acc16[m][n], ones), b8);
        accg[m][n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c), sxm, accg[m][n]);
      }
    }
  }
  for (int n = 0; n < NV; ++n) {
    const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(sm + 8 * n)));
    const __m256 mn = _mm256_fmadd_ps(s, _mm256_set1_ps(8.f),
                                      _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(sm + TILE + 8 * n))));
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      float* c = C + m * TILE + 8 * n;
      __m256 cv = _mm256_fmadd_ps(accg[m][n], s, _mm256_loadu_ps(c));
      cv = _mm256_fmadd_ps(mn, _mm256_set1_ps(xs[m * ldxs]), cv);
      _mm256_storeu_ps(c, cv);
    }
  }
}

template <int MB>
static void uk4q8_groups(const Int4Q8Params& p, const uint32_t* wt, const uint16_t* smt,
                         int64_t g0, int64_t g1, int64_t m0, float* C) {
  constexpr int NV = MB == 1 ? 8 : MB == 2 ? 4 : MB <= 4 ? 2 : 1;
  const int64_t no = p.gs / 8, nb = p.gs / 32, nbk = p.Kp / 32;
  for (int64_t g = g0; g < g1; ++g)
    for (int v = 0; v < TILE; v += 8 * NV)
      uk4q8<MB, NV>(wt + g * no * TILE + v, nb, p.xq + m0 * p.Kp + g * p.gs, p.Kp,
                    p.sx + m0 * nbk + g * nb, p.bsum + m0 * nbk + g * nb, nbk, p.xsum + m0 * p.G + g, p.G,
                    smt + g * 2 * TILE + v, C + m0 * TILE + v);
}

void int4q8_tiles(const Int4Q8Params& p, int64_t tb, int64_t te) {
  alignas(64) float C[MAX_M * TILE];
  const int64_t M = p.M, G = p.G;
  const int64_t nblk = (M + MBQ - 1) / MBQ;
  int64_t gb = KB4 / p.gs;
  if (gb < 1) gb = 1;
  if (nblk == 1) gb = G;
  for (int64_t t = tb; t < te; ++t) {
    for (int64_t i = 0; i < M * TILE; ++i) C[i] = 0.f;
    const uint32_t* wt = p.w + t * (p.Kp / 8) * TILE;
    const uint16_t* smt = p.sm + t * G * 2 * TILE;
    for (int64_t g0 = 0; g0 < G; g0 += gb) {
      const int64_t g1 = (G - g0 < gb) ? G : g0 + gb;
      for (int64_t bi = 0; bi < nblk; ++bi) {
        int64_t m0; int mb;
        mblock(M, MBQ, bi, &m0, &mb);
        switch (mb) {
          case 1: uk4q8_groups<1>(p, wt, smt, g0, g1, m0, C); break;
          case 2: uk4q8_groups<2>(p, wt, smt, g0, g1, m0, C); break;
          case 3: uk4q8_groups<3>(p, wt, smt, g0, g1, m0, C); break;
          case 4: uk4q8_groups<4>(p, wt, smt, g0, g1, m0, C); break;
          case 5: uk4q8_groups<5>(p, wt, smt, g0, g1, m0, C); break;
          default: break;
        }
      }
    }
    const int64_t n0 = t * TILE;
    const int64_t nr = (p.N - n0 < TILE) ? p.N - n0 : TILE;
    for (int64_t m = 0; m < M; ++m) {
      float* y = p.y + m * p.N + n0;
      const float* c = C + m * TILE;
      for (int64_t r = 0; r < nr; ++r) y[r] = c[r] + (p.bias ? p.bias[n0 + r] : 0.f);
    }
  }
}

// ---------------------------------------------------------------------------
// int8 weights x int8 activations without VNNI.  One 32-byte load = 8 rows x 4 consecutive k;
// vpmaddubsw multiplies |w| (unsigned) by xq carrying w's sign, pairs into int16 (exact: at most
// 2 * 128 * 127 = 32512), vpmaddwd (x 1) widens each quad into int32; a 32-k block's sum is then
// exactly the VNNI kernel's, and the float steps are Int8Q8Params's (acc read from and written to
// C once per block, so the accumulators leave room for NV = 4 slices at one activation row).
constexpr int MB8Q = 6;

template <int MB, int NV>
static inline void uk8q8(const int8_t* __restrict w, int64_t nb, const int8_t* __restrict xq, int64_t ldq,
                         const float* __restrict sx, int64_t ldsx, float* __restrict C) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    __m256i ai[MB][NV];
    for (int m = 0; m < MB; ++m)
      for (int n = 0; n < NV; ++n) ai[m][n] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int o = 0; o < 8; ++o) {
      const int8_t* wo = w + (b * 8 + o) * TILE * 4;
      for (int l = 0; l < NV * 32; l += 64) _mm_prefetch((const char*)(wo + l) + SCL_PF_BYTES, _MM_HINT_T0);
      __m256i wv[NV], aw[NV];
#pragma GCC unroll 4
      for (int n = 0; n < NV; ++n) {
        wv[n] = _mm256_loadu_si256((const __m256i*)(wo + 32 * n));
        aw[n] = _mm256_abs_epi8(wv[n]);
      }
      const int8_t* xo = xq + b * 32 + o * 4;
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) {
        int32_t x4;
        __builtin_memcpy(&x4, xo + m * ldq, 4);
        const __m256i bx = _mm256_set1_epi32(x4);
#pragma GCC unroll 4
        for (int n = 0; n < NV; ++n)
          ai[m][n] = _mm256_add_epi32(ai[m][n], _mm256_madd_epi16(
              _mm256_maddubs_epi16(aw[n], _mm256_sign_epi8(bx, wv[n])), ones));
      }
    }
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m256 sxv = _mm256_set1_ps(sx[m * ldsx + b]);
#pragma GCC unroll 4
      for (int n = 0; n < NV; ++n) {
        float* c = C + m * TILE + 8 * n;
        _mm256_storeu_ps(c, _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai[m][n]), sxv, _mm256_loadu_ps(c)));
      }
    }
  }
}

template <int MB>
static void uk8q8_rows(const Int8Q8Params& p, const int8_t* wt, int64_t b0, int64_t b1, int64_t m0, float* C) {
  constexpr int NV = MB == 1 ? 4 : (MB <= 3 ? 2 : 1);
  const int64_t ldsx = p.ldq / 32;
  for (int v = 0; v < TILE; v += 8 * NV)
    uk8q8<MB, NV>(wt + (b0 * 8 * TILE + v) * 4, b1 - b0, p.xq + m0 * p.ldq + b0 * 32, p.ldq,
                  p.sx + m0 * ldsx + b0, ldsx, C + m0 * TILE + v);
}

#include "q8w_tiles_body.h"

}  // namespace avx2
}  // namespace scl

#pragma GCC pop_options

#else  // not x86: stubs, never selected

namespace scl {
namespace avx2 {
bool compiled() { return false; }
void int8_tiles(const Int8Params&, int64_t, int64_t) {}
void int4_tiles(const Int4Params&, int64_t, int64_t) {}
void int4q8_tiles(const Int4Q8Params&, int64_t, int64_t) {}
void int8q8_tiles(const Int8Q8Params&, int64_t, int64_t) {}
void prep_xp(const float*, int64_t, int64_t, int64_t, float*, float*) {}
void prep_q8(const float*, int64_t, int64_t, int64_t, int8_t*, float*, int32_t*, float*) {}
}  // namespace avx2
}  // namespace scl
#endif
