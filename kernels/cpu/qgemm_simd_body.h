// Generic SIMD micro-kernels, included (textually) by qgemm_avx2.cpp and
// qgemm_avx512.cpp inside an ISA namespace and a `#pragma GCC target` region.
// The including file defines `struct Ops` with:
//   V, VI        float / int32 vector types, W lanes
//   NV8, MB8     int8: vectors (of W rows) per micro-kernel, max m-rows per block
//   NV4, MB4     int4: same
//   zero(), bcast(const float*), fma(a,b,c), add(a,b), mul(a,b),
//   loadf(const float*), storef(float*, V),
//   loadq(const int8_t*)         4W bytes: W rows x 4 consecutive k, one row per lane
//   s8_at(VI q, int j)           float(byte j of each lane, signed)
//   loadi(const uint32_t*)       W uint32
//   nib(VI q, int j)             float(q & (0xF<<4j)) for j<7, float(q>>28) j=7
//   load_h(const uint16_t*)      W fp16 -> float
// No lambdas here: GCC does not always propagate target pragmas into them.

#ifndef SCL_UNROLL
#define SCL_UNROLL _Pragma("GCC unroll 64")
#endif

using V = Ops::V;
using VI = Ops::VI;
constexpr int W = Ops::W;

// Software prefetch distance (bytes ahead in the packed weight stream).  The
// hardware prefetcher alone leaves a single core well below its streaming
// bandwidth because the loop is busy converting; one prefetch per 64-byte line.
#ifndef SCL_PF_BYTES
#define SCL_PF_BYTES 4096
#endif
static inline void pf(const void* p) { _mm_prefetch((const char*)p, _MM_HINT_T0); }

// ---------------------------------------------------------------- int8 ----
// C[m][r] (ld TILE) += sum_{k<kn} w[k][r] * x[m*ldx + k]  for the NV8*W rows starting at the
// (pre-offset) pointer: w is quad 0 of this k range, row 0 of the slice ([quad][64][4] bytes).
// Each row's sum runs over k in order, one FMA per k.
template <int MB>
static inline void uk8(const int8_t* __restrict w, int64_t kn,
                       const float* __restrict x, int64_t ldx,
                       float* __restrict C) {
  constexpr int NV = Ops::NV8;
  V acc[MB][NV];
  SCL_UNROLL for (int m = 0; m < MB; ++m)
    SCL_UNROLL for (int v = 0; v < NV; ++v) acc[m][v] = Ops::zero();
  const int64_t nq = (kn + 3) / 4;
  for (int64_t o = 0; o < nq; ++o) {
    const int8_t* wo = w + o * TILE * 4;
    SCL_UNROLL for (int l = 0; l < NV * W * 4; l += 64) pf(wo + l + SCL_PF_BYTES);
    const float* xk = x + 4 * o;
    const int nj = (o + 1 < nq || kn % 4 == 0) ? 4 : (int)(kn % 4);   // the last quad of a K tail
    SCL_UNROLL for (int v = 0; v < NV; ++v) {
      const VI q = Ops::loadq(wo + v * W * 4);
      SCL_UNROLL for (int j = 0; j < 4; ++j) {
        if (j >= nj) break;
        const V f = Ops::s8_at(q, j);
        SCL_UNROLL for (int m = 0; m < MB; ++m) acc[m][v] = Ops::fma(f, Ops::bcast(xk + m * ldx + j), acc[m][v]);
      }
    }
  }
  SCL_UNROLL for (int m = 0; m < MB; ++m)
    SCL_UNROLL for (int v = 0; v < NV; ++v) {
      float* c = C + m * TILE + v * W;
      Ops::storef(c, Ops::add(Ops::loadf(c), acc[m][v]));
    }
}

template <int MB>
static void uk8_tile(const Int8Params& p, const int8_t* wt, int64_t k0, int64_t kn,
                     int64_t m0, float* C) {
  constexpr int SUB = Ops::NV8 * W;  // rows per micro-kernel call
  for (int s = 0; s < TILE; s += SUB)
    uk8<MB>(wt + (k0 / 4 * TILE + s) * 4, kn, p.x + m0 * p.K + k0, p.K, C + m0 * TILE + s);
}

static void uk8_dispatch(int mb, const Int8Params& p, const int8_t* wt, int64_t k0,
                         int64_t kn, int64_t m0, float* C) {
  static_assert(Ops::MB8 <= 8, "extend the switch");
  switch (mb) {
    case 1: uk8_tile<1>(p, wt, k0, kn, m0, C); break;
#define SCL_CASE8(n) \
    case n: if constexpr (Ops::MB8 >= n) { uk8_tile<n>(p, wt, k0, kn, m0, C); } break;
    SCL_CASE8(2) SCL_CASE8(3) SCL_CASE8(4) SCL_CASE8(5) SCL_CASE8(6) SCL_CASE8(7) SCL_CASE8(8)
#undef SCL_CASE8
    default: break;
  }
}

// Split M rows into ceil(M/MBMAX) nearly equal blocks.
static inline void mblock(int64_t M, int mbmax, int64_t i, int64_t* m0, int* mb) {
  int64_t nb = (M + mbmax - 1) / mbmax;
  int64_t base = M / nb, rem = M % nb;
  *m0 = i * base + (i < rem ? i : rem);
  *mb = (int)(base + (i < rem ? 1 : 0));
}

void int8_tiles(const Int8Params& p, int64_t tb, int64_t te) {
  alignas(64) float C[MAX_M * TILE];
  const int64_t M = p.M, K = p.K;
  const int64_t nblk = (M + Ops::MB8 - 1) / Ops::MB8;
  // k-blocks of KB8 always (not K when one m-block would do): several m-blocks re-use a tile
  // slice from L1, and a row's sum is then the same sequence of block partial sums whatever M
  // is, so a row's output never depends on the other rows of the call (row independence).
  const int64_t kb = KB8;
  for (int64_t t = tb; t < te; ++t) {
    for (int64_t i = 0; i < M * TILE; ++i) C[i] = 0.f;
    const int8_t* wt = p.w + t * p.Kq * TILE;
    for (int64_t k0 = 0; k0 < K; k0 += kb) {
      const int64_t kn = (K - k0 < kb) ? K - k0 : kb;
      for (int64_t b = 0; b < nblk; ++b) {
        int64_t m0; int mb;
        mblock(M, Ops::MB8, b, &m0, &mb);
        uk8_dispatch(mb, p, wt, k0, kn, m0, C);
      }
    }
    const int64_t n0 = t * TILE;
    const int64_t nr = (p.N - n0 < TILE) ? p.N - n0 : TILE;
    for (int64_t m = 0; m < M; ++m) {
      float* y = p.y + m * p.N + n0;
      const float* c = C + m * TILE;
      for (int64_t r = 0; r < nr; ++r)
        y[r] = c[r] * p.scale[n0 + r] + (p.bias ? p.bias[n0 + r] : 0.f);
    }
  }
}

// ---------------------------------------------------------------- int4 ----
// One group (no = gs/8 octets) for NV4*W rows:
//   C[m][r] += scale[r] * sum_k q[r][k] x[m][k] + min[r] * xsum[m]
template <int MB>
static inline void uk4(const uint32_t* __restrict w, int64_t no,
                       const float* __restrict xp, int64_t ldx,
                       const float* __restrict xs, int64_t ldxs,
                       const uint16_t* __restrict sm, float* __restrict C) {
  constexpr int NV = Ops::NV4;
  V acc[MB][NV];
  SCL_UNROLL for (int m = 0; m < MB; ++m)
    SCL_UNROLL for (int v = 0; v < NV; ++v) acc[m][v] = Ops::zero();
  for (int64_t o = 0; o < no; ++o) {
    SCL_UNROLL for (int l = 0; l < NV * W * 4; l += 64) pf((const char*)(w + o * TILE) + l + SCL_PF_BYTES);
    const float* xo = xp + o * 8;
    // v outer: only one packed vector live; the activation broadcasts are
    // re-read per v (cheap L1 loads, folded into the FMA on AVX-512).
    SCL_UNROLL for (int v = 0; v < NV; ++v) {
      const VI q = Ops::loadi(w + o * TILE + v * W);
      SCL_UNROLL for (int j = 0; j < 8; ++j) {
        const V f = Ops::nib(q, j);
        SCL_UNROLL for (int m = 0; m < MB; ++m)
          acc[m][v] = Ops::fma(f, Ops::bcast(xo + m * ldx + j), acc[m][v]);
      }
    }
  }
  SCL_UNROLL for (int v = 0; v < NV; ++v) {
    V s = Ops::load_h(sm + v * W);
    V mn = Ops::load_h(sm + TILE + v * W);
    SCL_UNROLL for (int m = 0; m < MB; ++m) {
      float* c = C + m * TILE + v * W;
      V cv = Ops::fma(acc[m][v], s, Ops::loadf(c));
      cv = Ops::fma(mn, Ops::bcast(xs + m * ldxs), cv);
      Ops::storef(c, cv);
    }
  }
}

template <int MB>
static void uk4_groups(const Int4Params& p, const uint32_t* wt, const uint16_t* smt,
                       int64_t g0, int64_t g1, int64_t m0, float* C) {
  constexpr int SUB = Ops::NV4 * W;
  const int64_t no = p.gs / 8;
  for (int64_t g = g0; g < g1; ++g)
    for (int s = 0; s < TILE; s += SUB)
      uk4<MB>(wt + g * no * TILE + s, no, p.xp + m0 * p.Kp + g * p.gs, p.Kp,
              p.xsum + m0 * p.G + g, p.G, smt + g * 2 * TILE + s, C + m0 * TILE + s);
}

static void uk4_dispatch(int mb, const Int4Params& p, const uint32_t* wt,
                         const uint16_t* smt, int64_t g0, int64_t g1, int64_t m0,
                         float* C) {
  static_assert(Ops::MB4 <= 8, "extend the switch");
  switch (mb) {
    case 1: uk4_groups<1>(p, wt, smt, g0, g1, m0, C); break;
#define SCL_CASE4(n) \
    case n: if constexpr (Ops::MB4 >= n) { uk4_groups<n>(p, wt, smt, g0, g1, m0, C); } break;
    SCL_CASE4(2) SCL_CASE4(3) SCL_CASE4(4) SCL_CASE4(5) SCL_CASE4(6) SCL_CASE4(7) SCL_CASE4(8)
#undef SCL_CASE4
    default: break;
  }
}

void int4_tiles(const Int4Params& p, int64_t tb, int64_t te) {
  alignas(64) float C[MAX_M * TILE];
  const int64_t M = p.M, G = p.G;
  const int64_t nblk = (M + Ops::MB4 - 1) / Ops::MB4;
  int64_t gb = KB4 / p.gs;
  if (gb < 1) gb = 1;
  if (nblk == 1) gb = G;
  for (int64_t t = tb; t < te; ++t) {
    for (int64_t i = 0; i < M * TILE; ++i) C[i] = 0.f;
    const uint32_t* wt = p.w + t * (p.Kp / 8) * TILE;
    const uint16_t* smt = p.sm + t * G * 2 * TILE;
    for (int64_t g0 = 0; g0 < G; g0 += gb) {
      const int64_t g1 = (G - g0 < gb) ? G : g0 + gb;
      for (int64_t b = 0; b < nblk; ++b) {
        int64_t m0; int mb;
        mblock(M, Ops::MB4, b, &m0, &mb);
        uk4_dispatch(mb, p, wt, smt, g0, g1, m0, C);
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
