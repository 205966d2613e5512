// Shared body of the dense shift/FMA kernels (dense_kernels.h), included inside namespace
// scl::<isa> after a `DOps` struct:
//   V, W (fp32 lanes), MB (m-rows per block), zero(), fma(a, b, c), loadf(p), hsum(v),
//   split_bf16(p, a, b): 2*W bf16 at p -> a = even k, b = odd k (fp32, exact),
//   load_f16(p, a, b): 2*W fp16 at p -> a = w[0..W), b = w[W..2W) (fp32, exact), prefetch(p).
// A chunk is CK = 2*W values of k.  fp32 and fp16 weights: a = w[0..W), b = w[W..2W) against x as is;
// bf16 weights: a/b = even/odd k against the even/odd-split copy of x (dense_prep_x).

#ifndef SCL_DENSE_PF_BYTES
#define SCL_DENSE_PF_BYTES 1024   // software prefetch distance along each row (bytes)
#endif

static constexpr int CK = 2 * DOps::W;
static_assert(CK == DENSE_CHUNK, "chunk size declared in dense_kernels.h");

static inline float as_float(uint16_t v) { return bf16_to_float(v); }
static inline float as_float(float v) { return v; }

template <typename T>
static void prep_x(const T* x, int64_t M, int64_t K, int64_t Kc, float* xp) {
  for (int64_t m = 0; m < M; ++m) {
    const T* xm = x + m * K;
    float* o = xp + m * Kc;
    for (int64_t c = 0; c < Kc; c += CK)
      for (int i = 0; i < DOps::W; ++i) {
        o[c + i] = as_float(xm[c + 2 * i]);
        o[c + DOps::W + i] = as_float(xm[c + 2 * i + 1]);
      }
  }
}

void dense_prep_x(const uint16_t* x, int64_t M, int64_t K, int64_t Kc, float* xp) { prep_x(x, M, K, Kc, xp); }
void dense_prep_x(const float* x, int64_t M, int64_t K, int64_t Kc, float* xp) { prep_x(x, M, K, Kc, xp); }

enum : int { WK_F32 = 0, WK_BF16 = 1, WK_F16 = 2 };

// R rows starting at n0, m-rows [m0, m0 + MB).
template <int R, int MB, int WK>
static inline void dense_block(const DenseParams& p, int64_t n0, int64_t m0) {
  using V = typename DOps::V;
  constexpr int W = DOps::W;
  V acc[R][MB];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MB; ++m) acc[r][m] = DOps::zero();
  const int64_t K = p.K, Kc = p.Kc;
  const float* xb = p.xp + m0 * p.ldxp;
  for (int64_t c = 0; c < Kc; c += CK) {
    V xa[MB], xo[MB];
    for (int m = 0; m < MB; ++m) {
      xa[m] = DOps::loadf(xb + m * p.ldxp + c);
      xo[m] = DOps::loadf(xb + m * p.ldxp + c + W);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      V wa, wo;
      if (WK == WK_BF16) {
        const uint16_t* wr = (const uint16_t*)p.w + (n0 + r) * K + c;
        DOps::prefetch((const char*)wr + SCL_DENSE_PF_BYTES);
        DOps::split_bf16(wr, wa, wo);
      } else if (WK == WK_F16) {
        const uint16_t* wr = (const uint16_t*)p.w + (n0 + r) * K + c;
        DOps::prefetch((const char*)wr + SCL_DENSE_PF_BYTES);
        DOps::load_f16(wr, wa, wo);
      } else {
        const float* wr = (const float*)p.w + (n0 + r) * K + c;
        DOps::prefetch((const char*)wr + SCL_DENSE_PF_BYTES);
        DOps::prefetch((const char*)wr + SCL_DENSE_PF_BYTES + 64);
        wa = DOps::loadf(wr);
        wo = DOps::loadf(wr + W);
      }
      for (int m = 0; m < MB; ++m) acc[r][m] = DOps::fma(wo, xo[m], DOps::fma(wa, xa[m], acc[r][m]));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MB; ++m) dense_finish(p, m0 + m, n0 + r, DOps::hsum(acc[r][m]));
}

// The last partial m-block (rm < MB rows) in one block of exactly rm rows.
template <int R, int MBX, int WK>
static inline void dense_tail_m(const DenseParams& p, int64_t n0, int64_t m0, int64_t rm) {
  if constexpr (MBX >= 1) {
    if (rm == MBX) return dense_block<R, MBX, WK>(p, n0, m0);
    dense_tail_m<R, MBX - 1, WK>(p, n0, m0, rm);
  }
}

template <int R, int WK>
static inline void dense_rows_m(const DenseParams& p, int64_t n0) {
  constexpr int MB = DOps::MB;
  int64_t m0 = 0;
  for (; m0 + MB <= p.M; m0 += MB) dense_block<R, MB, WK>(p, n0, m0);
  dense_tail_m<R, MB - 1, WK>(p, n0, m0, p.M - m0);
}

template <int WK>
static void dense_rows_t(const DenseParams& p, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + DR <= n1; n += DR) dense_rows_m<DR, WK>(p, n);
  for (; n < n1; ++n) dense_rows_m<1, WK>(p, n);
}

void dense_rows(const DenseParams& p, int64_t n0, int64_t n1) {
  if (p.w_bf16)
    dense_rows_t<WK_BF16>(p, n0, n1);
  else if (p.w_f16)
    dense_rows_t<WK_F16>(p, n0, n1);
  else
    dense_rows_t<WK_F32>(p, n0, n1);
}
