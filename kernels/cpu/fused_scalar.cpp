// The fused step's pieces in portable C++ (one lane; the compiler may vectorise).
#include "fused_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace scl {
namespace scalar {

struct FOps {
  using V = float;
  static constexpr int W = 1;
  static inline V zero() { return 0.f; }
  static inline V set1(float f) { return f; }
  static inline V load(const float* p) { return *p; }
  static inline V load_i8(const int8_t* p) { return (float)*p; }
  static inline V load_bf16(const uint16_t* p) {
    const uint32_t u = (uint32_t)*p << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static inline void store(float* p, V v) { *p = v; }
  static inline V add(V a, V b) { return a + b; }
  static inline V sub(V a, V b) { return a - b; }
  static inline V mul(V a, V b) { return a * b; }
  static inline V div(V a, V b) { return a / b; }
  static inline V fma(V a, V b, V c) { return a * b + c; }
  static inline V max(V a, V b) { return std::max(a, b); }
  static inline V min(V a, V b) { return std::min(a, b); }
  static inline float hsum(V v) { return v; }
  static inline float hmax(V v) { return v; }
  static inline void hsum4(V a, V b, V c, V d, float* o) { o[0] = a, o[1] = b, o[2] = c, o[3] = d; }
  static inline V round(V v) { return std::nearbyint(v); }
  static inline V pow2i(V n) {
    const int32_t bits = ((int32_t)n + 127) << 23;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
};

// Integer dot products for an int8 KV cache (fused_q8_x86.h's, one lane).
struct QOps {
  using I = float;
  static inline I zero() { return 0.f; }
  static inline float h2f(uint16_t h) { return half_to_float(h); }
  static inline I gdot(const int8_t* q, const int8_t* k, float scale, I acc) {
    int32_t s = 0;
    for (int i = 0; i < 32; ++i) s += (int32_t)q[i] * (int32_t)k[i];
    return acc + scale * (float)s;
  }
  static inline float sum(I v) { return v; }
  static inline void hsum4(I a, I b, I c, I d, float* o) { o[0] = a, o[1] = b, o[2] = c, o[3] = d; }
};

#include "fused_simd_body.h"

}  // namespace scalar
}  // namespace scl
