// Portable fallback (no intrinsics; the compiler may auto-vectorise the
// 64-wide inner loops with the baseline ISA, e.g. SSE2 on x86-64 or NEON).
// Same packed layout and same arithmetic decomposition as the SIMD kernels.
#include "qgemm_kernels.h"

#include <algorithm>
#include <cmath>

namespace scl {
namespace scalar {

void int8_tiles(const Int8Params& p, int64_t tb, int64_t te) {
  alignas(64) float C[MAX_M * TILE];
  const int64_t M = p.M, K = p.K;
  for (int64_t t = tb; t < te; ++t) {
    for (int64_t i = 0; i < M * TILE; ++i) C[i] = 0.f;
    const int8_t* wt = p.w + t * p.Kq * TILE;
    for (int64_t k0 = 0; k0 < K; k0 += KB8) {
      const int64_t k1 = (K - k0 < KB8) ? K : k0 + KB8;
      for (int64_t m = 0; m < M; ++m) {
        float* c = C + m * TILE;
        const float* x = p.x + m * K;
        for (int64_t k = k0; k < k1; ++k) {
          const float xv = x[k];
          const int8_t* wk = wt + (k / 4) * TILE * 4 + k % 4;
          for (int r = 0; r < TILE; ++r) c[r] += (float)wk[4 * r] * xv;
        }
      }
    }
    const int64_t n0 = t * TILE;
    const int64_t nr = (p.N - n0 < TILE) ? p.N - n0 : TILE;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t r = 0; r < nr; ++r)
        p.y[m * p.N + n0 + r] =
            C[m * TILE + r] * p.scale[n0 + r] + (p.bias ? p.bias[n0 + r] : 0.f);
  }
}

void int4_tiles(const Int4Params& p, int64_t tb, int64_t te) {
  alignas(64) float C[MAX_M * TILE];
  alignas(64) float acc[TILE];
  alignas(64) float s[TILE], mn[TILE];
  const int64_t M = p.M, G = p.G, no = p.gs / 8;
  for (int64_t t = tb; t < te; ++t) {
    for (int64_t i = 0; i < M * TILE; ++i) C[i] = 0.f;
    const uint32_t* wt = p.w + t * (p.Kp / 8) * TILE;
    const uint16_t* smt = p.sm + t * G * 2 * TILE;
    for (int64_t g = 0; g < G; ++g) {
      for (int r = 0; r < TILE; ++r) {
        s[r] = half_to_float(smt[g * 2 * TILE + r]);
        mn[r] = half_to_float(smt[g * 2 * TILE + TILE + r]);
      }
      const uint32_t* wg = wt + g * no * TILE;
      for (int64_t m = 0; m < M; ++m) {
        for (int r = 0; r < TILE; ++r) acc[r] = 0.f;
        const float* xg = p.xp + m * p.Kp + g * p.gs;
        for (int64_t o = 0; o < no; ++o) {
          const uint32_t* wo = wg + o * TILE;
          for (int j = 0; j < 7; ++j) {
            const float xv = xg[o * 8 + j];
            const uint32_t mask = 0xFu << (4 * j);
            for (int r = 0; r < TILE; ++r) acc[r] += (float)(int32_t)(wo[r] & mask) * xv;
          }
          const float xv = xg[o * 8 + 7];
          for (int r = 0; r < TILE; ++r) acc[r] += (float)(int32_t)(wo[r] >> 28) * xv;
        }
        const float xs = p.xsum[m * G + g];
        float* c = C + m * TILE;
        for (int r = 0; r < TILE; ++r) c[r] += acc[r] * s[r] + mn[r] * xs;
      }
    }
    const int64_t n0 = t * TILE;
    const int64_t nr = (p.N - n0 < TILE) ? p.N - n0 : TILE;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t r = 0; r < nr; ++r)
        p.y[m * p.N + n0 + r] = C[m * TILE + r] + (p.bias ? p.bias[n0 + r] : 0.f);
  }
}

}  // namespace scalar
}  // namespace scl

namespace scl {
namespace scalar {

// Portable reference of the int4 x int8-activation kernel (same integer
// arithmetic as the VNNI kernel: exact int32 block sums, then float scaling).
void int4q8_tiles(const Int4Q8Params& p, int64_t tb, int64_t te) {
  const int64_t M = p.M, G = p.G, nb = p.gs / 32, nbk = p.Kp / 32;
  alignas(64) float C[MAX_M * TILE];
  for (int64_t t = tb; t < te; ++t) {
    for (int64_t i = 0; i < M * TILE; ++i) C[i] = 0.f;
    const uint32_t* wt = p.w + t * (p.Kp / 8) * TILE;
    const uint16_t* smt = p.sm + t * G * 2 * TILE;
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t m = 0; m < M; ++m) {
        const int8_t* xq = p.xq + m * p.Kp;
        for (int r = 0; r < TILE; ++r) {
          float accg = 0.f;
          for (int64_t b = 0; b < nb; ++b) {
            int32_t acci = 0;
            for (int o = 0; o < 4; ++o) {
              const int64_t oo = g * (p.gs / 8) + b * 4 + o;
              const uint32_t d = wt[oo * TILE + r];
              for (int i = 0; i < 4; ++i) {
                acci += (int32_t)((d >> (8 * i)) & 0xFu) * xq[oo * 8 + i];
                acci += (int32_t)((d >> (8 * i + 4)) & 0xFu) * xq[oo * 8 + 4 + i];
              }
            }
            acci -= 8 * p.bsum[m * nbk + g * nb + b];   // centred: sum (q - 8) * xq
            accg += (float)acci * p.sx[m * nbk + g * nb + b];
          }
          const float s = half_to_float(smt[g * 2 * TILE + r]);
          const float mn = half_to_float(smt[g * 2 * TILE + TILE + r]) + 8.f * s;
          C[m * TILE + r] += accg * s + mn * p.xsum[m * G + g];
        }
      }
    }
    const int64_t n0 = t * TILE;
    const int64_t nr = (p.N - n0 < TILE) ? p.N - n0 : TILE;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t r = 0; r < nr; ++r)
        p.y[m * p.N + n0 + r] = C[m * TILE + r] + (p.bias ? p.bias[n0 + r] : 0.f);
  }
}

void int8q8_tiles(const Int8Q8Params& p, int64_t tb, int64_t te) {
  const int64_t nb = p.Kq / 32, ldsx = p.ldq / 32;
  for (int64_t t = tb; t < te; ++t) {
    const int8_t* wt = p.w + t * p.Kq * TILE;
    const int64_t n0 = t * TILE;
    const int64_t nr = (p.N - n0 < TILE) ? p.N - n0 : TILE;
    for (int64_t m = 0; m < p.M; ++m) {
      const int8_t* xq = p.xq + m * p.ldq;
      for (int64_t r = 0; r < nr; ++r) {
        float acc = 0.f;
        for (int64_t b = 0; b < nb; ++b) {
          int32_t s = 0;
          for (int64_t k = 32 * b; k < 32 * b + 32; ++k) s += (int32_t)wt[((k / 4) * TILE + r) * 4 + k % 4] * xq[k];
          acc = std::fma((float)s, p.sx[m * ldsx + b], acc);
        }
        p.y[m * p.N + n0 + r] = std::fma(acc, p.scale[n0 + r], p.bias ? p.bias[n0 + r] : 0.f);
      }
    }
  }
}

}  // namespace scalar
}  // namespace scl

// ---------------------------------------------------------------------------
// Activation preparation, portable twin of act_prep_body.h (bit-identical results).

namespace scl {
namespace scalar {

namespace {
inline float canon_sum32(const float* s) {
  float l[8];
  for (int i = 0; i < 8; ++i) l[i] = ((s[i] + s[8 + i]) + s[16 + i]) + s[24 + i];
  const float t0 = l[0] + l[4], t1 = l[1] + l[5], t2 = l[2] + l[6], t3 = l[3] + l[7];
  return (t0 + t2) + (t1 + t3);
}

inline const float* block_src(const float* x, int64_t K, int64_t k, float* buf) {
  if (k + 32 <= K) return x + k;
  for (int i = 0; i < 32; ++i) buf[i] = (k + i < K) ? x[k + i] : 0.f;
  return buf;
}
}  // namespace

void prep_xp(const float* x, int64_t K, int64_t k0, int64_t k1, float* xp, float* fsum) {
  static const int perm[8] = {0, 4, 1, 5, 2, 6, 3, 7};   // nibble position p holds k offset perm[p]
  static const float f16[8] = {1.f, 1.f / 16, 1.f / 256, 1.f / 4096, 1.f / 65536,
                               1.f / 1048576, 1.f / 16777216, 1.f};
  float buf[32];
  for (int64_t k = k0; k < k1; k += 32) {
    const float* s = block_src(x, K, k, buf);
    for (int o = 0; o < 4; ++o)
      for (int p = 0; p < 8; ++p) xp[k + 8 * o + p] = s[8 * o + perm[p]] * f16[p];
    fsum[k / 32] = canon_sum32(s);
  }
}

void prep_q8(const float* x, int64_t K, int64_t k0, int64_t k1, int8_t* xq, float* sx,
             int32_t* bsum, float* fsum) {
  float buf[32];
  for (int64_t k = k0; k < k1; k += 32) {
    const float* s = block_src(x, K, k, buf);
    fsum[k / 32] = canon_sum32(s);
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(s[i]));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    sx[k / 32] = amax / 127.f;
    int32_t bs = 0;
    for (int i = 0; i < 32; ++i) {
      float v = std::nearbyint(s[i] * inv);
      v = std::min(127.f, std::max(-127.f, v));
      xq[k + i] = (int8_t)v;
      bs += (int32_t)v;
    }
    bsum[k / 32] = bs;
  }
}

}  // namespace scalar
}  // namespace scl
