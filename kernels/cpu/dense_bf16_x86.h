// fp32 -> bf16 for 16 lanes at once with float_to_bf16's rounding (dense_kernels.h): to nearest even, a NaN kept
// quiet. Included inside an ISA namespace by dense_avx512.cpp and dense_amx.cpp, under their AVX-512 targets.
static inline __m256i bf16_round16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v), hi = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i rne = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_or_epi32(rne, nan, hi, _mm512_set1_epi32(0x40)));
}
