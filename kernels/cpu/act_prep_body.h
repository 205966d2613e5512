// Activation preparation with 256-bit AVX2 intrinsics, included (textually) inside an ISA
// namespace of qgemm_avx2.cpp and qgemm_avx512.cpp under a target with avx2,fma.  The
// portable twin is in qgemm_scalar.cpp; both give bit-identical results (see qgemm_kernels.h):
// every value is an exact operation (permutation, power-of-two scaling, round-to-nearest-even
// after one IEEE multiply, integer sums) except the float block sum, which follows one fixed
// order: s_l = ((x[l] + x[8+l]) + x[16+l]) + x[24+l], t_l = s_l + s_{l+4}, u_l = t_l + t_{l+2},
// fsum = u_0 + u_1.

static inline float canon_sum8(__m256 v) {
  const __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
}

// round to nearest even (the default MXCSR mode, as std::nearbyint), clamp to +-127
static inline __m256i q8_round(__m256 v, __m256 vi) {
  return _mm256_max_epi32(_mm256_set1_epi32(-127),
                          _mm256_min_epi32(_mm256_set1_epi32(127), _mm256_cvtps_epi32(_mm256_mul_ps(v, vi))));
}

// The 32 values of block starting at k (zero past K) into buf when the block is a tail.
static inline const float* block_src(const float* x, int64_t K, int64_t k, float* buf) {
  if (k + 32 <= K) return x + k;
  for (int i = 0; i < 32; ++i) buf[i] = (k + i < K) ? x[k + i] : 0.f;
  return buf;
}

void prep_xp(const float* x, int64_t K, int64_t k0, int64_t k1, float* xp, float* fsum) {
  alignas(32) float buf[32];
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256 f16 = _mm256_setr_ps(1.f, 1.f / 16, 1.f / 256, 1.f / 4096, 1.f / 65536,
                                    1.f / 1048576, 1.f / 16777216, 1.f);
  for (int64_t k = k0; k < k1; k += 32) {
    const float* s = block_src(x, K, k, buf);
    const __m256 a = _mm256_loadu_ps(s), b = _mm256_loadu_ps(s + 8);
    const __m256 c = _mm256_loadu_ps(s + 16), d = _mm256_loadu_ps(s + 24);
    _mm256_storeu_ps(xp + k, _mm256_mul_ps(_mm256_permutevar8x32_ps(a, perm), f16));
    _mm256_storeu_ps(xp + k + 8, _mm256_mul_ps(_mm256_permutevar8x32_ps(b, perm), f16));
    _mm256_storeu_ps(xp + k + 16, _mm256_mul_ps(_mm256_permutevar8x32_ps(c, perm), f16));
    _mm256_storeu_ps(xp + k + 24, _mm256_mul_ps(_mm256_permutevar8x32_ps(d, perm), f16));
    fsum[k / 32] = canon_sum8(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a, b), c), d));
  }
}

void prep_q8(const float* x, int64_t K, int64_t k0, int64_t k1, int8_t* xq, float* sx,
             int32_t* bsum, float* fsum) {
  alignas(32) float buf[32];
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t k = k0; k < k1; k += 32) {
    const float* s = block_src(x, K, k, buf);
    const __m256 a = _mm256_loadu_ps(s), b = _mm256_loadu_ps(s + 8);
    const __m256 c = _mm256_loadu_ps(s + 16), d = _mm256_loadu_ps(s + 24);
    fsum[k / 32] = canon_sum8(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a, b), c), d));
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(a, absmask), _mm256_and_ps(b, absmask)),
                             _mm256_max_ps(_mm256_and_ps(c, absmask), _mm256_and_ps(d, absmask)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    sx[k / 32] = amax / 127.f;
    const __m256 vi = _mm256_set1_ps(inv);
    const __m256i qa = q8_round(a, vi), qb = q8_round(b, vi), qc = q8_round(c, vi), qd = q8_round(d, vi);
    const __m256i t = _mm256_add_epi32(_mm256_add_epi32(qa, qb), _mm256_add_epi32(qc, qd));
    __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4E));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xB1));
    bsum[k / 32] = _mm_cvtsi128_si32(t4);
    // packs work per 128-bit lane: fix the order with a 64-bit permute after each step
    const __m256i ab = _mm256_permute4x64_epi64(_mm256_packs_epi32(qa, qb), 0xD8);
    const __m256i cd = _mm256_permute4x64_epi64(_mm256_packs_epi32(qc, qd), 0xD8);
    const __m256i all = _mm256_permute4x64_epi64(_mm256_packs_epi16(ab, cd), 0xD8);
    _mm256_storeu_si256((__m256i*)(xq + k), all);
  }
}
