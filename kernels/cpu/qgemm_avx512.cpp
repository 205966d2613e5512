// AVX-512F/BW (+FMA) micro-kernels: 16 fp32 lanes, 64-row tile = 4 zmm.
// Compiled with `#pragma GCC target` so the rest of the extension stays
// baseline x86-64; selected at run time only if __builtin_cpu_supports says so.
#include "qgemm_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")

namespace scl {
namespace avx512 {

struct Ops {
  using V = __m512;
  using VI = __m512i;
  static constexpr int W = 16;
  static constexpr int NV8 = 4, MB8 = 6;
  static constexpr int NV4 = 4, MB4 = 5;
  static inline V zero() { return _mm512_setzero_ps(); }
  static inline V bcast(const float* p) { return _mm512_set1_ps(*p); }
  static inline V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static inline V add(V a, V b) { return _mm512_add_ps(a, b); }
  static inline V loadf(const float* p) { return _mm512_loadu_ps(p); }
  static inline void storef(float* p, V v) { _mm512_storeu_ps(p, v); }
  static inline VI loadq(const int8_t* p) { return _mm512_loadu_si512((const void*)p); }
  static inline V s8_at(VI q, int j) {   // byte j of each lane, sign-extended: two shifts (one for j = 3)
    return _mm512_cvtepi32_ps(j == 3 ? _mm512_srai_epi32(q, 24) : _mm512_srai_epi32(_mm512_slli_epi32(q, 24 - 8 * j), 24));
  }
  static inline VI loadi(const uint32_t* p) { return _mm512_loadu_si512((const void*)p); }
  static inline V nib(VI q, int j) {
    if (j == 7) return _mm512_cvtepi32_ps(_mm512_srli_epi32(q, 28));
    return _mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(0xF << (4 * j))));
  }
  static inline V load_h(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
  }
};

bool compiled() { return true; }

#include "qgemm_simd_body.h"
#include "act_prep_body.h"

}  // namespace avx512
}  // namespace scl

#pragma GCC pop_options

#else  // not x86: stubs, never selected

namespace scl {
namespace avx512 {
bool compiled() { return false; }
void int8_tiles(const Int8Params&, int64_t, int64_t) {}
void int4_tiles(const Int4Params&, int64_t, int64_t) {}
void prep_xp(const float*, int64_t, int64_t, int64_t, float*, float*) {}
void prep_q8(const float*, int64_t, int64_t, int64_t, int8_t*, float*, int32_t*, float*) {}
}  // namespace avx512
}  // namespace scl
#endif

// ---------------------------------------------------------------------------
// int4 x int8-activation kernel (AVX-512 VNNI, opt-in via SCL_KERNEL_ACT=int8).
// One 64-byte load = 16 rows x 8 k; AND 0x0F gives 16 rows x k0..k3 as bytes,
// (>>4) & 0x0F gives k4..k7; VPDPBUSD multiplies them (unsigned) with 4 int8
// activations broadcast to all lanes (signed) and adds into int32 lanes.  Per
// 32-k block the int32 sums are centred (sum (q-8)*xq = sum q*xq - 8*sum xq, so
// the activation-rounding error scales with |q-8|, not q), converted and scaled by
// the activation scale; per group by the weight scale, plus (min + 8*scale)*sum(x).
#if defined(__x86_64__) || defined(__i386__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
namespace scl {
namespace avx512 {

constexpr int MBQ = 8;   // max m-rows per block (2*MBQ accumulators + temporaries)

// NV vectors of 16 rows per call: every broadcast activation feeds NV weight vectors (fewer
// broadcast loads per multiply-add; NV = 4 at M <= 2 also reads each octet's 256 bytes as one
// contiguous run).  The arithmetic of each row is the same for every NV (bit-identical outputs).
template <int MB, int NV>
static inline void uk4q8(const uint32_t* __restrict w, int64_t nb, const int8_t* __restrict xq,
                         int64_t ldq, const float* __restrict sx, const int32_t* __restrict bsum,
                         int64_t ldsx, const float* __restrict xs, int64_t ldxs,
                         const uint16_t* __restrict sm, float* __restrict C) {
  const __m512i mask = _mm512_set1_epi8(0x0F);
  __m512 accg[MB][NV];
  for (int m = 0; m < MB; ++m)
    for (int v = 0; v < NV; ++v) accg[m][v] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i acci[MB][NV];
    for (int m = 0; m < MB; ++m)
      for (int v = 0; v < NV; ++v) acci[m][v] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int o = 0; o < 4; ++o) {
      const uint32_t* wo = w + (b * 4 + o) * TILE;
      __m512i lo[NV], hi[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        _mm_prefetch((const char*)(wo + 16 * v) + SCL_PF_BYTES, _MM_HINT_T0);
        const __m512i q = _mm512_loadu_si512((const void*)(wo + 16 * v));
        lo[v] = _mm512_and_si512(q, mask);
        hi[v] = _mm512_and_si512(_mm512_srli_epi16(q, 4), mask);
      }
      const int8_t* xo = xq + (b * 4 + o) * 8;
#pragma GCC unroll 16
      for (int m = 0; m < MB; ++m) {
        int32_t x0, x1;
        __builtin_memcpy(&x0, xo + m * ldq, 4);
        __builtin_memcpy(&x1, xo + m * ldq + 4, 4);
        const __m512i b0 = _mm512_set1_epi32(x0), b1 = _mm512_set1_epi32(x1);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
          acci[m][v] = _mm512_dpbusd_epi32(acci[m][v], lo[v], b0);
          acci[m][v] = _mm512_dpbusd_epi32(acci[m][v], hi[v], b1);
        }
      }
    }
    // centre the weights: sum (q - 8) * xq = sum q * xq - 8 * sum xq (exact int32)
#pragma GCC unroll 16
    for (int m = 0; m < MB; ++m) {
      const __m512i c8 = _mm512_set1_epi32(8 * bsum[m * ldsx + b]);
      const __m512 sxv = _mm512_set1_ps(sx[m * ldsx + b]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        accg[m][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acci[m][v], c8)), sxv, accg[m][v]);
    }
  }
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(sm + 16 * v)));
    // min' = min + 8 * scale pairs with the centred integer part
    const __m512 mn = _mm512_fmadd_ps(s, _mm512_set1_ps(8.f),
                                      _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(sm + TILE + 16 * v))));
#pragma GCC unroll 16
    for (int m = 0; m < MB; ++m) {
      float* c = C + m * TILE + 16 * v;
      __m512 cv = _mm512_fmadd_ps(accg[m][v], s, _mm512_loadu_ps(c));
      cv = _mm512_fmadd_ps(mn, _mm512_set1_ps(xs[m * ldxs]), cv);
      _mm512_storeu_ps(c, cv);
    }
  }
}

template <int MB>
static void uk4q8_groups(const Int4Q8Params& p, const uint32_t* wt, const uint16_t* smt,
                         int64_t g0, int64_t g1, int64_t m0, float* C) {
  constexpr int NV = MB <= 2 ? 4 : (MB <= 5 ? 2 : 1);   // 2*MB*NV accumulators fit the 32 zmm
  const int64_t no = p.gs / 8, nb = p.gs / 32, nbk = p.Kp / 32;
  for (int64_t g = g0; g < g1; ++g)
    for (int v = 0; v < TILE; v += 16 * NV)   // v outer: one group's slice stays in L1
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
        const int64_t nb_ = nblk, base = M / nb_, rem = M % nb_;
        const int64_t m0 = bi * base + (bi < rem ? bi : rem);
        const int mb = (int)(base + (bi < rem ? 1 : 0));
        switch (mb) {
          case 1: uk4q8_groups<1>(p, wt, smt, g0, g1, m0, C); break;
          case 2: uk4q8_groups<2>(p, wt, smt, g0, g1, m0, C); break;
          case 3: uk4q8_groups<3>(p, wt, smt, g0, g1, m0, C); break;
          case 4: uk4q8_groups<4>(p, wt, smt, g0, g1, m0, C); break;
          case 5: uk4q8_groups<5>(p, wt, smt, g0, g1, m0, C); break;
          case 6: uk4q8_groups<6>(p, wt, smt, g0, g1, m0, C); break;
          case 7: uk4q8_groups<7>(p, wt, smt, g0, g1, m0, C); break;
          case 8: uk4q8_groups<8>(p, wt, smt, g0, g1, m0, C); break;
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
// int8 weights x int8 activations (VNNI).  One 64-byte load = 16 rows x 4 consecutive k (signed);
// XOR 0x80 makes them unsigned (w + 128) for VPDPBUSD, and per 32-k block
// sum (w + 128) * xq - 128 * sum xq = sum w * xq, exact in int32; then the float steps
// Int8Q8Params documents (acc lives in C between calls, so k-chunking changes no rounding).
constexpr int MB8Q = 8;

template <int MB, int NV>
static inline void uk8q8(const int8_t* __restrict w, int64_t nb, const int8_t* __restrict xq, int64_t ldq,
                         const float* __restrict sx, const int32_t* __restrict bsum, int64_t ldsx,
                         float* __restrict C) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  __m512 acc[MB][NV];
  for (int m = 0; m < MB; ++m)
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_loadu_ps(C + m * TILE + 16 * v);
  for (int64_t b = 0; b < nb; ++b) {
    __m512i ai[MB][NV];
    for (int m = 0; m < MB; ++m)
      for (int v = 0; v < NV; ++v) ai[m][v] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int o = 0; o < 8; ++o) {
      const int8_t* wo = w + (b * 8 + o) * TILE * 4;
      __m512i wu[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        _mm_prefetch((const char*)(wo + 64 * v) + SCL_PF_BYTES, _MM_HINT_T0);
        wu[v] = _mm512_xor_si512(_mm512_loadu_si512((const void*)(wo + 64 * v)), flip);
      }
      const int8_t* xo = xq + b * 32 + o * 4;
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) {
        int32_t x4;
        __builtin_memcpy(&x4, xo + m * ldq, 4);
        const __m512i bx = _mm512_set1_epi32(x4);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) ai[m][v] = _mm512_dpbusd_epi32(ai[m][v], wu[v], bx);
      }
    }
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m512i c = _mm512_set1_epi32(128 * bsum[m * ldsx + b]);
      const __m512 sxv = _mm512_set1_ps(sx[m * ldsx + b]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        acc[m][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(ai[m][v], c)), sxv, acc[m][v]);
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(C + m * TILE + 16 * v, acc[m][v]);
}

template <int MB>
static void uk8q8_rows(const Int8Q8Params& p, const int8_t* wt, int64_t b0, int64_t b1, int64_t m0, float* C) {
  constexpr int NV = MB <= 2 ? 4 : (MB <= 5 ? 2 : 1);   // 2*MB*NV + NV + 2 of the 32 zmm
  const int64_t ldsx = p.ldq / 32;
  for (int v = 0; v < TILE; v += 16 * NV)
    uk8q8<MB, NV>(wt + (b0 * 8 * TILE + v) * 4, b1 - b0, p.xq + m0 * p.ldq + b0 * 32, p.ldq,
                  p.sx + m0 * ldsx + b0, p.bsum + m0 * ldsx + b0, ldsx, C + m0 * TILE + v);
}

#include "q8w_tiles_body.h"

}  // namespace avx512
}  // namespace scl
#pragma GCC pop_options
#else
namespace scl {
namespace avx512 {
void int4q8_tiles(const Int4Q8Params&, int64_t, int64_t) {}
void int8q8_tiles(const Int8Q8Params&, int64_t, int64_t) {}
}  // namespace avx512
}  // namespace scl
#endif
