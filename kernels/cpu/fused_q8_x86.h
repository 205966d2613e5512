// Integer dot products for the fused attention over an int8 KV cache, with 256-bit integer ops (AVX2;
// also used under AVX-512's target, whose integer units run them at the same width), and 8-lane float
// sums.  Included inside an ISA namespace by fused_avx2.cpp and fused_avx512.cpp, before their FOps.
//   gdot(q, k, scale, acc): acc + scale * (q . k) over 32 int8 values, as 8 float lanes.  q and k lie
//   in [-127, 127] (paged.quantize_int8 clamps), so vpmaddubsw's pairs (|q| * sign-moved k, at most
//   2 * 127 * 127 = 32258) never saturate: the dot product is exact in int32.
// Horizontal sums of 8 fp32 lanes (one, and four at once: three hadds), shared by the float ops of both ISAs.
static inline float sum8(__m256 v) {
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

static inline void sum8x4(__m256 a, __m256 b, __m256 c, __m256 d, float* o) {
  const __m256 x = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  _mm_storeu_ps(o, _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1)));
}

struct QOps {
  using I = __m256;
  static inline I zero() { return _mm256_setzero_ps(); }
  static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
  static inline I gdot(const int8_t* q, const int8_t* k, float scale, I acc) {
    const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    const __m256i kv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k));
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(qv, qv), _mm256_sign_epi8(kv, qv));
    const __m256i p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), _mm256_set1_ps(scale), acc);
  }
  static inline float sum(I v) { return sum8(v); }
  static inline void hsum4(I a, I b, I c, I d, float* o) { sum8x4(a, b, c, d, o); }
};
