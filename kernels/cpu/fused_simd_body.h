// The fused step's elementwise pieces and attention, generic over a vector type.  Included
// (textually) by fused_avx512.cpp / fused_avx2.cpp / fused_scalar.cpp inside an ISA namespace
// (and a `#pragma GCC target` region); the including file defines `struct FOps` with
//   V, W (lanes), zero(), set1(f), load(p), load_i8(p), load_bf16(p) (W int8 or bf16 values as fp32),
//   store(p, v), add, sub, mul, div, fma(a, b, c) = a*b + c,
//   max, min, hsum(v), hsum4(a, b, c, d, out[4]), hmax(v), round(v) (to nearest even), pow2i(v)
//   (2^n for integral n).
// No lambdas: GCC does not always propagate target pragmas into them.  The including file
// includes <algorithm>, <cmath> and <cstring> before opening its namespaces.

using FV = FOps::V;
constexpr int FW = FOps::W;

// exp(x), Cephes-style: x = n ln2 + r, |r| <= ln2 / 2, degree-6 polynomial (about 1 ulp),
// clamped to [-87, 88] (so 2^n stays a normal float; exp(-87) = 1.6e-38 stands for 0).
static inline FV vexp(FV x) {
  x = FOps::min(FOps::max(x, FOps::set1(-87.f)), FOps::set1(88.f));
  const FV n = FOps::round(FOps::mul(x, FOps::set1(1.44269504088896341f)));
  FV r = FOps::sub(x, FOps::mul(n, FOps::set1(0.693359375f)));
  r = FOps::sub(r, FOps::mul(n, FOps::set1(-2.12194440e-4f)));
  FV p = FOps::set1(1.9875691500E-4f);
  p = FOps::fma(p, r, FOps::set1(1.3981999507E-3f));
  p = FOps::fma(p, r, FOps::set1(8.3334519073E-3f));
  p = FOps::fma(p, r, FOps::set1(4.1665795894E-2f));
  p = FOps::fma(p, r, FOps::set1(1.6666665459E-1f));
  p = FOps::fma(p, r, FOps::set1(5.0000001201E-1f));
  const FV y = FOps::fma(p, FOps::mul(r, r), FOps::add(r, FOps::set1(1.f)));
  return FOps::mul(y, FOps::pow2i(n));
}

// The same polynomial for one float (vector tails).
static inline float sexp(float x) {
  x = std::min(std::max(x, -87.f), 88.f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  return std::ldexp(p * (r * r) + (r + 1.f), (int)n);
}

// out = x / rms(x) * w  (F.rms_norm: x * rsqrt(mean(x^2) + eps), then * weight)
void rmsnorm(const float* x, const float* w, float eps, int64_t K, float* out) {
  FV a0 = FOps::zero(), a1 = FOps::zero(), a2 = FOps::zero(), a3 = FOps::zero();
  int64_t k = 0;
  for (; k + 4 * FW <= K; k += 4 * FW) {
    const FV v0 = FOps::load(x + k), v1 = FOps::load(x + k + FW);
    const FV v2 = FOps::load(x + k + 2 * FW), v3 = FOps::load(x + k + 3 * FW);
    a0 = FOps::fma(v0, v0, a0);
    a1 = FOps::fma(v1, v1, a1);
    a2 = FOps::fma(v2, v2, a2);
    a3 = FOps::fma(v3, v3, a3);
  }
  for (; k + FW <= K; k += FW) {
    const FV v = FOps::load(x + k);
    a0 = FOps::fma(v, v, a0);
  }
  float ss = FOps::hsum(FOps::add(FOps::add(a0, a1), FOps::add(a2, a3)));
  for (; k < K; ++k) ss += x[k] * x[k];
  const float inv = 1.f / std::sqrt(ss / (float)K + eps);
  const FV vi = FOps::set1(inv);
  k = 0;
  for (; k + FW <= K; k += FW)
    FOps::store(out + k, FOps::mul(FOps::mul(FOps::load(x + k), vi), FOps::load(w + k)));
  for (; k < K; ++k) out[k] = (x[k] * inv) * w[k];
}

// h = silu(g) * u = g / (1 + exp(-g)) * u
void silu_mul(const float* g, const float* u, float* h, int64_t n) {
  const FV one = FOps::set1(1.f);
  int64_t i = 0;
  for (; i + FW <= n; i += FW) {
    const FV gv = FOps::load(g + i);
    const FV s = FOps::div(gv, FOps::add(one, vexp(FOps::sub(FOps::zero(), gv))));
    FOps::store(h + i, FOps::mul(s, FOps::load(u + i)));
  }
  for (; i < n; ++i) h[i] = g[i] / (1.f + sexp(-g[i])) * u[i];
}

// tanh(y) = 1 - 2 / (exp(2y) + 1): exact at the clamps (+-1), absolute error ~1e-7 near 0, where
// every caller adds it to 1 or multiplies it by a cap (soft-capping), so its relative error is harmless.
static inline FV vtanh(FV y) {
  const FV one = FOps::set1(1.f);
  const FV e = vexp(FOps::add(y, y));
  return FOps::sub(one, FOps::div(FOps::set1(2.f), FOps::add(e, one)));
}

static inline float stanh(float y) { return 1.f - 2.f / (sexp(y + y) + 1.f); }

// h = gelu_tanh(g) * u = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * u, as torch's approximate="tanh"
void gelu_tanh_mul(const float* g, const float* u, float* h, int64_t n) {
  const float kb = 0.7978845608028654f, kk = 0.044715f;
  const FV half = FOps::set1(0.5f), one = FOps::set1(1.f), vb = FOps::set1(kb), vk = FOps::set1(kk);
  int64_t i = 0;
  for (; i + FW <= n; i += FW) {
    const FV x = FOps::load(g + i);
    const FV inner = FOps::mul(vb, FOps::add(x, FOps::mul(vk, FOps::mul(FOps::mul(x, x), x))));
    const FV y = FOps::mul(FOps::mul(half, x), FOps::add(one, vtanh(inner)));
    FOps::store(h + i, FOps::mul(y, FOps::load(u + i)));
  }
  for (; i < n; ++i) {
    const float x = g[i];
    h[i] = 0.5f * x * (1.f + stanh(kb * (x + kk * (x * x * x)))) * u[i];
  }
}

// Rotary embedding in place (the half-split convention of the model: rot = [-x2, x1]).
void rope(float* v, const float* cs, const float* sn, int64_t D) {
  const int64_t half = D / 2;
  int64_t i = 0;
  for (; i + FW <= half; i += FW) {
    const FV a = FOps::load(v + i), b = FOps::load(v + half + i);
    const FV c = FOps::load(cs + i), s = FOps::load(sn + i);
    FOps::store(v + i, FOps::sub(FOps::mul(a, c), FOps::mul(b, s)));
    FOps::store(v + half + i, FOps::add(FOps::mul(b, c), FOps::mul(a, s)));
  }
  for (; i < half; ++i) {
    const float a = v[i], b = v[half + i];
    v[i] = a * cs[i] - b * sn[i];
    v[half + i] = b * cs[i] + a * sn[i];
  }
}

void add_inplace(float* x, const float* y, int64_t n) {
  int64_t i = 0;
  for (; i + FW <= n; i += FW) FOps::store(x + i, FOps::add(FOps::load(x + i), FOps::load(y + i)));
  for (; i < n; ++i) x[i] += y[i];
}

// Attention of one item (fused_kernels.h), exact softmax in three passes over key blocks of
// JB keys (a block of K or V stays in L1 while every query of the item uses it):
// scores = q.k * scale (soft-capped if asked); e = exp(s - max), sum; out = sum_j e_j v_j / sum.
// A query reads only its keys [start, len): a sliding window skips the blocks before it.
// Over an int8 cache (a.kt8 set) q.k is an integer dot product per 32 values, scaled by the query's and
// the key's scales of those values; a value row is converted from int8 as it is read, times its scale.
// Over a bf16 cache (a.kt16 set) keys and values are widened to fp32 as they are read (exact).
constexpr int64_t ATT_JB = KEY_TILE;

// The score of query q against 4 keys (or 1) of an int8 tile: scale * sum over groups of 32 values of
// q_scale * k_scale * (q8 . k8).
template <int64_t D>
static inline void scores_q8(const AttnItem& a, int64_t qi, int64_t jb, int64_t j0, int64_t je, float* s) {
  constexpr int64_t NG = D / 32;
  const int8_t* q = a.q8 + qi * D;
  const float* qs = a.qs + qi * NG;
  const int8_t* ktile = a.kt8[jb / ATT_JB];
  const uint16_t* kst = a.ks[jb / ATT_JB];
  int64_t j = j0;
  for (; j + 4 <= je; j += 4) {
    typename QOps::I c[4] = {QOps::zero(), QOps::zero(), QOps::zero(), QOps::zero()};
    for (int t = 0; t < 4; ++t) {
      const int8_t* kr = ktile + (j + t - jb) * D;
      const uint16_t* ksr = kst + (j + t - jb) * NG;
      for (int64_t g = 0; g < NG; ++g) c[t] = QOps::gdot(q + 32 * g, kr + 32 * g, qs[g] * QOps::h2f(ksr[g]), c[t]);
    }
    QOps::hsum4(c[0], c[1], c[2], c[3], s + j);
    for (int t = 0; t < 4; ++t) s[j + t] *= a.scale;
  }
  for (; j < je; ++j) {
    typename QOps::I c = QOps::zero();
    const int8_t* kr = ktile + (j - jb) * D;
    const uint16_t* ksr = kst + (j - jb) * NG;
    for (int64_t g = 0; g < NG; ++g) c = QOps::gdot(q + 32 * g, kr + 32 * g, qs[g] * QOps::h2f(ksr[g]), c);
    s[j] = QOps::sum(c) * a.scale;
  }
}

// A key or value vector's FW lanes as fp32, from an fp32 cache or (widened exactly) a bf16 one.
static inline FV load_kv(const float* p) { return FOps::load(p); }
static inline FV load_kv(const uint16_t* p) { return FOps::load_bf16(p); }

// Scores of query qi against keys [j0, je) of the block at jb, from a float (T = float) or bf16 (uint16_t) tile:
// the same products and sums either way (a bf16 key widened is exactly the float key).
template <int NDV, typename T>
static inline void scores_fp(const AttnItem& a, const T* ktile, int64_t qi, int64_t jb, int64_t j0, int64_t je,
                             float* s) {
  constexpr int64_t D = (int64_t)NDV * FW;
  FV qv[NDV];
  for (int d = 0; d < NDV; ++d) qv[d] = FOps::load(a.q + qi * D + d * FW);
  int64_t j = j0;
  for (; j + 4 <= je; j += 4) {   // 4 keys at once: one 4-way horizontal sum instead of four
    const T* kr = ktile + (j - jb) * D;
    FV c0 = FOps::mul(qv[0], load_kv(kr)), c1 = FOps::mul(qv[0], load_kv(kr + D));
    FV c2 = FOps::mul(qv[0], load_kv(kr + 2 * D)), c3 = FOps::mul(qv[0], load_kv(kr + 3 * D));
    for (int d = 1; d < NDV; ++d) {
      c0 = FOps::fma(qv[d], load_kv(kr + d * FW), c0);
      c1 = FOps::fma(qv[d], load_kv(kr + D + d * FW), c1);
      c2 = FOps::fma(qv[d], load_kv(kr + 2 * D + d * FW), c2);
      c3 = FOps::fma(qv[d], load_kv(kr + 3 * D + d * FW), c3);
    }
    FOps::hsum4(c0, c1, c2, c3, s + j);
    for (int t = 0; t < 4; ++t) s[j + t] *= a.scale;
  }
  for (; j < je; ++j) {
    const T* kr = ktile + (j - jb) * D;
    FV acc = FOps::mul(qv[0], load_kv(kr));
    for (int d = 1; d < NDV; ++d) acc = FOps::fma(qv[d], load_kv(kr + d * FW), acc);
    s[j] = FOps::hsum(acc) * a.scale;
  }
}

// out[qi] += sum over keys [j0, je) of e_j * v_j, from a float or bf16 value tile.
template <int NDV, typename T>
static inline void values_fp(const T* vtile, const float* e, int64_t jb, int64_t j0, int64_t je, FV* acc) {
  constexpr int64_t D = (int64_t)NDV * FW;
  for (int64_t j = j0; j < je; ++j) {
    const FV p = FOps::set1(e[j]);
    const T* vr = vtile + (j - jb) * D;
    for (int d = 0; d < NDV; ++d) acc[d] = FOps::fma(p, load_kv(vr + d * FW), acc[d]);
  }
}

template <int NDV>
static void attention_t(const AttnItem& a) {
  constexpr int64_t D = (int64_t)NDV * FW;
  const int64_t nq = a.nq, ML = a.maxlen;
  const bool q8 = a.kt8 != nullptr;
  float inv_sum[FUSED_MAX_Q];
  int64_t lo = ML;
  for (int64_t r = 0; r < nq / a.G; ++r) lo = std::min(lo, a.start[r]);
  const int64_t jb0 = lo / ATT_JB * ATT_JB;   // blocks stay aligned to 0: a query's arithmetic is its own
  for (int64_t jb = jb0; jb < ML; jb += ATT_JB) {
    for (int64_t qi = 0; qi < nq; ++qi) {
      const int64_t j0 = std::max(jb, a.start[qi / a.G]), je = std::min(jb + ATT_JB, a.len[qi / a.G]);
      if (je <= j0) continue;
      float* s = a.scores + qi * ML;
      if (q8) scores_q8<D>(a, qi, jb, j0, je, s);
      else if (a.kt16) scores_fp<NDV>(a, a.kt16[jb / ATT_JB], qi, jb, j0, je, s);
      else scores_fp<NDV>(a, a.kt[jb / ATT_JB], qi, jb, j0, je, s);
      if (a.softcap > 0.f) {   // cap * tanh(score / cap), before the softmax (Gemma 2)
        const FV cap = FOps::set1(a.softcap);
        int64_t j = j0;
        for (; j + FW <= je; j += FW)
          FOps::store(s + j, FOps::mul(vtanh(FOps::div(FOps::load(s + j), cap)), cap));
        for (; j < je; ++j) s[j] = stanh(s[j] / a.softcap) * a.softcap;
      }
    }
  }
  for (int64_t qi = 0; qi < nq; ++qi) {
    const int64_t L = a.len[qi / a.G], st = a.start[qi / a.G];
    float* s = a.scores + qi * ML;
    int64_t j = st;
    FV mv = FOps::set1(-INFINITY);
    for (; j + FW <= L; j += FW) mv = FOps::max(mv, FOps::load(s + j));
    float m = FOps::hmax(mv);
    for (; j < L; ++j) m = std::max(m, s[j]);
    const FV vm = FOps::set1(m);
    FV sv = FOps::zero();
    j = st;
    for (; j + FW <= L; j += FW) {
      const FV e = vexp(FOps::sub(FOps::load(s + j), vm));
      FOps::store(s + j, e);
      sv = FOps::add(sv, e);
    }
    float sum = FOps::hsum(sv);
    for (; j < L; ++j) {
      s[j] = sexp(s[j] - m);
      sum += s[j];
    }
    inv_sum[qi] = 1.f / sum;
    for (int64_t d = 0; d < D; d += FW) FOps::store(a.out + qi * D + d, FOps::zero());
  }
  for (int64_t jb = jb0; jb < ML; jb += ATT_JB) {
    for (int64_t qi = 0; qi < nq; ++qi) {
      const int64_t j0 = std::max(jb, a.start[qi / a.G]), je = std::min(jb + ATT_JB, a.len[qi / a.G]);
      if (je <= j0) continue;
      FV acc[NDV];
      float* o = a.out + qi * D;
      for (int d = 0; d < NDV; ++d) acc[d] = FOps::load(o + d * FW);
      const float* e = a.scores + qi * ML;
      if (q8) {   // e_j * v_scale_j * v8_j, converted as read
        const int8_t* vtile = a.vt8[jb / ATT_JB];
        const uint16_t* vst = a.vs[jb / ATT_JB];
        for (int64_t j = j0; j < je; ++j) {
          const FV p = FOps::set1(e[j] * QOps::h2f(vst[j - jb]));
          const int8_t* vr = vtile + (j - jb) * D;
          for (int d = 0; d < NDV; ++d) acc[d] = FOps::fma(p, FOps::load_i8(vr + d * FW), acc[d]);
        }
      } else if (a.vt16) {
        values_fp<NDV>(a.vt16[jb / ATT_JB], e, jb, j0, je, acc);
      } else {
        values_fp<NDV>(a.vt[jb / ATT_JB], e, jb, j0, je, acc);
      }
      for (int d = 0; d < NDV; ++d) FOps::store(o + d * FW, acc[d]);
    }
  }
  for (int64_t qi = 0; qi < nq; ++qi) {
    const FV is = FOps::set1(inv_sum[qi]);
    for (int64_t d = 0; d < D; d += FW)
      FOps::store(a.out + qi * D + d, FOps::mul(FOps::load(a.out + qi * D + d), is));
  }
}

// head_dim 64, 96 (Phi-3), 128 and 256 (Gemma); make_fused_plan refuses others
void attention(const AttnItem& a) {
  if (a.D == 64) attention_t<64 / FW>(a);
  else if (a.D == 96) attention_t<96 / FW>(a);
  else if (a.D == 128) attention_t<128 / FW>(a);
  else if (a.D == 256) attention_t<256 / FW>(a);
}
