// The tile loop of the int8-weight x int8-activation kernels (qgemm_kernels.h, Int8Q8Params), included (textually)
// by qgemm_avx512.cpp and qgemm_avx2.cpp inside their ISA namespace after `MB8Q` (the most activation rows one
// micro-kernel call takes) and `uk8q8_rows<MB>` (MB rows, 32-k blocks [b0, b1) of one tile, accumulating into C).
// One activation-row block walks each slice over the whole K; several re-read k-chunks of 8 blocks from L1.
// The accumulators live in C between calls, so the chunking changes no rounding; then y = fma(acc, scale, bias).

static void uk8q8_dispatch(int mb, const Int8Q8Params& p, const int8_t* wt, int64_t b0, int64_t b1, int64_t m0,
                           float* C) {
  static_assert(MB8Q <= 8, "extend the switch");
  switch (mb) {
    case 1: uk8q8_rows<1>(p, wt, b0, b1, m0, C); break;
#define SCL_CASE8Q(n) \
    case n: if constexpr (MB8Q >= n) { uk8q8_rows<n>(p, wt, b0, b1, m0, C); } break;
    SCL_CASE8Q(2) SCL_CASE8Q(3) SCL_CASE8Q(4) SCL_CASE8Q(5) SCL_CASE8Q(6) SCL_CASE8Q(7) SCL_CASE8Q(8)
#undef SCL_CASE8Q
    default: break;
  }
}

void int8q8_tiles(const Int8Q8Params& p, int64_t tb, int64_t te) {
  alignas(64) float C[MAX_M * TILE];
  const int64_t M = p.M, nbk = p.Kq / 32;
  const int64_t nblk = (M + MB8Q - 1) / MB8Q;
  const int64_t kb = nblk == 1 ? nbk : KB8 / 32;
  for (int64_t t = tb; t < te; ++t) {
    for (int64_t i = 0; i < M * TILE; ++i) C[i] = 0.f;
    const int8_t* wt = p.w + t * p.Kq * TILE;
    for (int64_t b0 = 0; b0 < nbk; b0 += kb) {
      const int64_t b1 = (nbk - b0 < kb) ? nbk : b0 + kb;
      for (int64_t bi = 0; bi < nblk; ++bi) {
        int64_t m0; int mb;
        mblock(M, MB8Q, bi, &m0, &mb);
        uk8q8_dispatch(mb, p, wt, b0, b1, m0, C);
      }
    }
    const int64_t n0 = t * TILE;
    const int64_t nr = (p.N - n0 < TILE) ? p.N - n0 : TILE;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t r = 0; r < nr; ++r)
        p.y[m * p.N + n0 + r] = __builtin_fmaf(C[m * TILE + r], p.scale[n0 + r], p.bias ? p.bias[n0 + r] : 0.f);
  }
}
