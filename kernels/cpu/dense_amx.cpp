// AMX dense kernel for bf16 weights and activations (dense_kernels.h): TDPBF16PS with the weight as the A
// operand in its own [N, K] layout (a tile is 16 rows of W x 32 k, loaded with W's row stride: no packed
// copy of W, nothing reordered per call) against x packed once per call as the B operand (16 columns = 16
// rows of x, k in pairs), so each tile product is a 16 x 16 block of y^T.
//
// Why not torch's bf16 GEMM, which also runs on AMX here: through F.linear oneDNN packs the weight into its
// blocked layout on every call, so in a batch-8 step the projections read 8-15 GB/s of a 22 GB/s machine
// (profile-bf16-batch8.txt in docs/runs/2026-12-05/session27-dense-rows); this kernel reads W once.
//
// Tiles: C 0-3 = (two 16-row blocks of W) x (two 16-row blocks of x), A 4-5, B 6-7; 32 rows of W per block,
// 32 rows of x per pass (M up to 64: two passes, the block's rows re-read from L2). Rows past the last whole
// 16 go to the VDPBF16PS kernel, so a row's path depends on N only (blocks are fixed by N, not by threads).
// Sums: fp32, the hardware's order within a tile product (round to nearest even, denormals flushed), then the
// tail k in [Kc, K), bias and one rounding to bf16 (finish_tile: 16 outputs at a time, or dense_finish).
#include "dense_kernels.h"

#if defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")

namespace scl {
namespace amx {

#include "dense_bf16_x86.h"

namespace {

constexpr int ARCH_REQ_XCOMP_PERM = 0x1023;  // Linux: ask for a dynamically enabled XSAVE feature
constexpr int XFEATURE_XTILEDATA = 18;       // the AMX tile data

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

inline void configure() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  _tile_loadconfig(&c);
}

// y[m0 + j][n0 .. n0 + 16) for j < mn from a stored tile c[n][m]: the tile's column j gathered, bias added,
// rounded to bf16 to nearest even with NaN kept quiet (bf16_round16: float_to_bf16, 16 lanes at once). With k
// beyond the last whole 32 (K % 32) the scalar dense_finish adds the tail first.
inline void finish_tile(const DenseParams& p, const float (*c)[16], int64_t n0, int64_t m0, int64_t mn) {
  if (p.Kc != p.K) {
    for (int i = 0; i < 16; ++i)
      for (int64_t j = 0; j < mn; ++j) dense_finish(p, m0 + j, n0 + i, c[i][j]);
    return;
  }
  __m512 bias = _mm512_setzero_ps();
  if (p.bias)
    bias = p.bias_bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
                             _mm256_loadu_si256((const __m256i*)((const uint16_t*)p.bias + n0))), 16))
                       : _mm512_loadu_ps((const float*)p.bias + n0);
  const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(16));
  for (int64_t j = 0; j < mn; ++j) {
    const __m512 v = _mm512_add_ps(_mm512_i32gather_ps(_mm512_add_epi32(rows, _mm512_set1_epi32((int)j)), &c[0][0], 4),
                                   bias);
    _mm256_storeu_si256((__m256i*)((uint16_t*)p.y + (m0 + j) * p.N + n0), bf16_round16(v));
  }
}

// One block of 16 * NA rows of W (NA = 1 or 2) against x's m-blocks [mb, mb + NB) (NB = 1 or 2).
template <int NA, int NB>
inline void block(const DenseParams& p, int64_t n0, int64_t mb) {
  const int64_t K = p.K, KC = p.Kc / 32;
  const uint16_t* w = (const uint16_t*)p.w + n0 * K;
  const uint32_t* xb = p.xb + mb * KC * 256;
  _tile_zero(0);
  if (NB > 1) _tile_zero(1);
  if (NA > 1) _tile_zero(2);
  if (NA > 1 && NB > 1) _tile_zero(3);
  for (int64_t kc = 0; kc < KC; ++kc) {
    _tile_loadd(6, xb + kc * 256, 64);
    if (NB > 1) _tile_loadd(7, xb + (KC + kc) * 256, 64);
    _tile_loadd(4, w + kc * 32, K * 2);
    _tile_dpbf16ps(0, 4, 6);
    if (NB > 1) _tile_dpbf16ps(1, 4, 7);
    if (NA > 1) {
      _tile_loadd(5, w + 16 * K + kc * 32, K * 2);
      _tile_dpbf16ps(2, 5, 6);
      if (NB > 1) _tile_dpbf16ps(3, 5, 7);
    }
  }
  alignas(64) float c[16][16];
  for (int a = 0; a < NA; ++a)
    for (int b = 0; b < NB; ++b) {
      switch (2 * a + b) {
        case 0: _tile_stored(0, c, 64); break;
        case 1: _tile_stored(1, c, 64); break;
        case 2: _tile_stored(2, c, 64); break;
        default: _tile_stored(3, c, 64); break;
      }
      const int64_t m0 = (mb + b) * 16;
      finish_tile(p, c, n0 + 16 * a, m0, std::min<int64_t>(16, p.M - m0));
    }
}

template <int NA>
inline void rows_all_m(const DenseParams& p, int64_t n0) {
  const int64_t MB = (p.M + 15) / 16;
  int64_t mb = 0;
  for (; mb + 2 <= MB; mb += 2) block<NA, 2>(p, n0, mb);
  if (mb < MB) block<NA, 1>(p, n0, mb);
}

}  // namespace

bool available() {
  static const bool ok = [] {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16")) return false;
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    const bool tile = d & (1u << 24), bf16 = d & (1u << 22);  // CPUID.7.0:EDX AMX-TILE, AMX-BF16
    return tile && bf16 && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return ok;
}

void pack_x(const uint16_t* x, int64_t M, int64_t K, int64_t Kc, uint32_t* xb) {
  const int64_t KC = Kc / 32, MB = (M + 15) / 16;
  std::memset(xb, 0, (size_t)(MB * KC * 256) * sizeof(uint32_t));
  for (int64_t m = 0; m < M; ++m) {
    const uint16_t* xm = x + m * K;
    uint32_t* o = xb + (m / 16) * KC * 256 + (m % 16);
    for (int64_t kc = 0; kc < KC; ++kc)
      for (int r = 0; r < 16; ++r) {
        const int64_t k = kc * 32 + 2 * r;
        o[kc * 256 + r * 16] = (uint32_t)xm[k] | ((uint32_t)xm[k + 1] << 16);
      }
  }
}

void dense_rows(const DenseParams& p, int64_t n0, int64_t n1) {
  configure();
  int64_t n = n0;
  for (; n + 32 <= n1; n += 32) rows_all_m<2>(p, n);
  if (n + 16 <= n1) {
    rows_all_m<1>(p, n);
    n += 16;
  }
  _tile_release();
  if (n < n1) avx512::dense_rows_dp(p, n, n1);
}

}  // namespace amx
}  // namespace scl

#pragma GCC pop_options

#else  // not x86-64 Linux: never selected

namespace scl {
namespace amx {
bool available() { return false; }
void pack_x(const uint16_t*, int64_t, int64_t, int64_t, uint32_t*) {}
void dense_rows(const DenseParams&, int64_t, int64_t) {}
}  // namespace amx
}  // namespace scl
#endif
