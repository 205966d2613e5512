// Portable reference for the dense kernels (dense_kernels.h): one fp32 sum per output, k in order.
#include "dense_kernels.h"

namespace scl {
namespace scalar {

void dense_rows(const DenseParams& p, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < p.M; ++m) {
      float s = 0.f;
      for (int64_t k = 0; k < p.Kc; ++k) s += dense_w(p, n, k) * dense_x(p, m, k);
      dense_finish(p, m, n, s);  // adds k in [Kc, K)
    }
}

}  // namespace scalar
}  // namespace scl
