// Serving Cost Lab -- torch binding for the CPU weight-only quantized kernels.
//
// Built just-in-time by engine/ops/build.py with torch.utils.cpp_extension.load
// (ninja, -O3 -fopenmp).  The SIMD code lives in qgemm_{scalar,avx2,avx512}.cpp
// (no torch headers) and is chosen at run time:
//   best_isa(): 2 = AVX-512F/BW (+FMA, F16C), 1 = AVX2+FMA+F16C, 0 = scalar,
// and every entry point takes an explicit `isa` argument so tests and
// benchmarks can force a lower ISA.  Threads: at::parallel_for over 64-row
// output tiles (OpenMP, honours torch.set_num_threads).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "qgemm_kernels.h"

namespace {

using namespace scl;

bool cpu_has(const char* what) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (!std::strcmp(what, "avx512"))
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("avx2");
  if (!std::strcmp(what, "avx512vnni"))
    return cpu_has("avx512") && __builtin_cpu_supports("avx512vnni");
  if (!std::strcmp(what, "avx2"))
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#endif
  (void)what;
  return false;
}

bool isa_supported(int64_t isa) {
  if (isa == 0) return true;
  if (isa == 1) return avx2::compiled() && cpu_has("avx2");
  if (isa == 2) return avx512::compiled() && cpu_has("avx512");
  return false;
}

int64_t best_isa() {
  if (isa_supported(2)) return 2;
  if (isa_supported(1)) return 1;
  return 0;
}

using Fn8 = void (*)(const Int8Params&, int64_t, int64_t);
using Fn4 = void (*)(const Int4Params&, int64_t, int64_t);

Fn8 pick8(int64_t isa) {
  TORCH_CHECK(isa_supported(isa), "scl_qgemm: ISA ", isa, " not supported on this CPU/build");
  return isa == 2 ? avx512::int8_tiles : isa == 1 ? avx2::int8_tiles : scalar::int8_tiles;
}
Fn4 pick4(int64_t isa) {
  TORCH_CHECK(isa_supported(isa), "scl_qgemm: ISA ", isa, " not supported on this CPU/build");
  return isa == 2 ? avx512::int4_tiles : isa == 1 ? avx2::int4_tiles : scalar::int4_tiles;
}

const float* bias_ptr(const c10::optional<torch::Tensor>& bias, int64_t N) {
  if (!bias.has_value() || !bias->defined()) return nullptr;
  TORCH_CHECK(bias->scalar_type() == torch::kFloat32 && bias->is_contiguous() &&
                  bias->numel() == N,
              "bias must be a contiguous float32 tensor with N elements");
  return bias->data_ptr<float>();
}

// x: contiguous float32 [..., K]; M = prod(leading dims).  Returns M.
int64_t check_x(const torch::Tensor& x, int64_t K) {
  TORCH_CHECK(x.device().is_cpu(), "x must be on CPU");
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
              "x must be a contiguous float32 [..., K] tensor");
  TORCH_CHECK(x.size(-1) == K, "x has K=", x.size(-1), ", weight has K=", K);
  const int64_t M = K > 0 ? x.numel() / K : 0;
  TORCH_CHECK(M >= 1 && M <= MAX_M, "small-M kernel needs 1 <= M <= ", MAX_M, ", got ", M);
  return M;
}

torch::Tensor out_like(const torch::Tensor& x, int64_t N) {
  auto sizes = x.sizes().vec();
  sizes.back() = N;
  return torch::empty(sizes, x.options());
}

// Nibble position (bits 4p..4p+3 of a packed dword) holding k offset j of an
// octet: byte i = q[8o+i] | q[8o+4+i] << 4  ->  pos(j) = 2j (j<4), 2(j-4)+1 (j>=4).
inline int nib_pos(int j) { return j < 4 ? 2 * j : 2 * (j - 4) + 1; }

using PrepXp = void (*)(const float*, int64_t, int64_t, int64_t, float*, float*);
using PrepQ8 = void (*)(const float*, int64_t, int64_t, int64_t, int8_t*, float*, int32_t*, float*);
PrepXp pick_prep_xp(int64_t isa) {
  return isa == 2 ? avx512::prep_xp : isa == 1 ? avx2::prep_xp : scalar::prep_xp;
}
PrepQ8 pick_prep_q8(int64_t isa) {
  return isa == 2 ? avx512::prep_q8 : isa == 1 ? avx2::prep_q8 : scalar::prep_q8;
}

// The int8 tiled layout's padded K (a multiple of 32) after checking w is one; x's K must fit it.
int64_t check_w8(const torch::Tensor& w, const torch::Tensor& scale, int64_t N, int64_t K) {
  TORCH_CHECK(w.scalar_type() == torch::kInt8 && w.dim() == 4 && w.size(2) == TILE && w.size(3) == 4 &&
                  w.is_contiguous(), "w must be int8 [NT, Kq/4, 64, 4] contiguous");
  const int64_t NT = w.size(0), Kq = w.size(1) * 4;
  TORCH_CHECK(Kq % 32 == 0 && K <= Kq && K > Kq - 32, "x has K=", K, ", the weight's padded K is ", Kq);
  TORCH_CHECK(N > (NT - 1) * TILE && N <= NT * TILE, "N inconsistent with tiles");
  TORCH_CHECK(scale.scalar_type() == torch::kFloat32 && scale.is_contiguous() &&
                  scale.numel() == NT * TILE, "scale must be float32 [NT*64]");
  return Kq;
}

// y[..., N] = x[..., K] @ (w8 * scale)^T + bias   (M = rows of x <= MAX_M)
torch::Tensor int8_gemm(torch::Tensor x, torch::Tensor w, torch::Tensor scale,
                        c10::optional<torch::Tensor> bias, int64_t N, int64_t isa) {
  const int64_t K = x.dim() >= 1 ? x.size(-1) : 0, Kq = check_w8(w, scale, N, K), NT = w.size(0);
  const int64_t M = check_x(x, K);
  auto y = out_like(x, N);
  Int8Params p{w.data_ptr<int8_t>(), scale.data_ptr<float>(), bias_ptr(bias, N),
               x.data_ptr<float>(), y.data_ptr<float>(), M, N, K, Kq};
  Fn8 fn = pick8(isa);
  at::parallel_for(0, NT, 1, [&](int64_t tb, int64_t te) { fn(p, tb, te); });
  return y;
}

// y[..., N] = x[..., K] @ dequant(w4, scales, mins)^T + bias
torch::Tensor int4_gemm(torch::Tensor x, torch::Tensor w, torch::Tensor sm,
                        c10::optional<torch::Tensor> bias, int64_t N, int64_t K, int64_t gs,
                        int64_t isa) {
  TORCH_CHECK(gs == 32 || gs == 64 || gs == 128, "group size must be 32, 64 or 128");
  TORCH_CHECK(w.scalar_type() == torch::kInt32 && w.dim() == 3 && w.size(2) == TILE &&
                  w.is_contiguous(), "w must be int32 [NT, Kp/8, 64] contiguous");
  const int64_t NT = w.size(0), Kp = w.size(1) * 8, G = Kp / gs;
  TORCH_CHECK(Kp % gs == 0 && K <= Kp && K > Kp - gs, "K / group size inconsistent with w");
  TORCH_CHECK(N > (NT - 1) * TILE && N <= NT * TILE, "N inconsistent with tiles");
  TORCH_CHECK((sm.scalar_type() == torch::kFloat16 || sm.scalar_type() == torch::kInt16) &&
                  sm.is_contiguous() && sm.numel() == NT * G * 2 * TILE,
              "sm must be float16 [NT, G, 2, 64]");
  const int64_t M = check_x(x, K);
  Fn4 fn = pick4(isa);
  // Pre-scaled, zero-padded, nibble-ordered activations and per-group sums (O(M*K)).
  const int64_t nbk = Kp / 32;
  std::vector<float> xp((size_t)(M * Kp)), xsum((size_t)(M * G)), fsum((size_t)(M * nbk));
  const PrepXp prep = pick_prep_xp(isa);
  const float* xd = x.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    prep(xd + m * K, K, 0, Kp, xp.data() + m * Kp, fsum.data() + m * nbk);
    xsum_from_fsum(fsum.data() + m * nbk, G, gs, xsum.data() + m * G);
  }
  auto y = out_like(x, N);
  Int4Params p{reinterpret_cast<const uint32_t*>(w.data_ptr<int32_t>()),
               reinterpret_cast<const uint16_t*>(sm.data_ptr()),
               bias_ptr(bias, N), xp.data(), xsum.data(), y.data_ptr<float>(),
               M, N, K, Kp, G, gs};
  at::parallel_for(0, NT, 1, [&](int64_t tb, int64_t te) { fn(p, tb, te); });
  return y;
}

bool has_vnni() { return avx512::compiled() && cpu_has("avx512vnni"); }

// The int8-activation tile kernels for an ISA level (qgemm_kernels.h's q8_tiles; this CPU's VNNI).
Q8Tiles pick_q8(int64_t isa) {
  TORCH_CHECK(isa_supported(isa), "scl_qgemm: ISA ", isa, " not supported on this CPU/build");
  return q8_tiles(isa, has_vnni());
}

// Activation rows quantized per 32-k block as the int8-activation kernels read them (prep_q8), zero to Kpad.
struct Q8Rows {
  std::vector<int8_t> xq;        // [M][Kpad]
  std::vector<float> sx, fsum;   // [M][Kpad/32]
  std::vector<int32_t> bsum;     // [M][Kpad/32]
};
Q8Rows quantize_rows(const torch::Tensor& x, int64_t M, int64_t K, int64_t Kpad, int64_t isa) {
  const int64_t nbk = Kpad / 32;
  Q8Rows r{std::vector<int8_t>((size_t)(M * Kpad)), std::vector<float>((size_t)(M * nbk)),
           std::vector<float>((size_t)(M * nbk)), std::vector<int32_t>((size_t)(M * nbk))};
  const float* xd = x.data_ptr<float>();
  const PrepQ8 prep = pick_prep_q8(isa);
  for (int64_t m = 0; m < M; ++m)
    prep(xd + m * K, K, 0, Kpad, r.xq.data() + m * Kpad, r.sx.data() + m * nbk, r.bsum.data() + m * nbk,
         r.fsum.data() + m * nbk);
  return r;
}

// int4 weights x int8 activations.  Activations are quantized per row and per block of 32 k:
// sx = max|x| / 127, xq = round(x / sx) (half to even); bsum = sum of xq per block (for the
// centred integer part, see qgemm_avx512.cpp); xsum = per-group sums of x (qgemm_kernels.h).
torch::Tensor int4_gemm_q8(torch::Tensor x, torch::Tensor w, torch::Tensor sm,
                           c10::optional<torch::Tensor> bias, int64_t N, int64_t K, int64_t gs,
                           int64_t isa) {
  TORCH_CHECK(gs == 32 || gs == 64 || gs == 128, "group size must be 32, 64 or 128");
  TORCH_CHECK(w.scalar_type() == torch::kInt32 && w.dim() == 3 && w.size(2) == TILE &&
                  w.is_contiguous(), "w must be int32 [NT, Kp/8, 64] contiguous");
  const int64_t NT = w.size(0), Kp = w.size(1) * 8, G = Kp / gs;
  TORCH_CHECK(Kp % gs == 0 && K <= Kp && K > Kp - gs, "K / group size inconsistent with w");
  TORCH_CHECK(N > (NT - 1) * TILE && N <= NT * TILE, "N inconsistent with tiles");
  TORCH_CHECK((sm.scalar_type() == torch::kFloat16 || sm.scalar_type() == torch::kInt16) &&
                  sm.is_contiguous() && sm.numel() == NT * G * 2 * TILE,
              "sm must be float16 [NT, G, 2, 64]");
  const auto fn = pick_q8(isa).int4;
  const int64_t M = check_x(x, K);
  Q8Rows q = quantize_rows(x, M, K, Kp, isa);
  std::vector<float> xsum((size_t)(M * G));
  for (int64_t m = 0; m < M; ++m) xsum_from_fsum(q.fsum.data() + m * (Kp / 32), G, gs, xsum.data() + m * G);
  auto y = out_like(x, N);
  Int4Q8Params p{reinterpret_cast<const uint32_t*>(w.data_ptr<int32_t>()),
                 reinterpret_cast<const uint16_t*>(sm.data_ptr()), bias_ptr(bias, N), q.xq.data(),
                 q.sx.data(), q.bsum.data(), xsum.data(), y.data_ptr<float>(), M, N, K, Kp, G, gs};
  at::parallel_for(0, NT, 1, [&](int64_t tb, int64_t te) { fn(p, tb, te); });
  return y;
}

// int8 weights x int8 activations, quantized per row and 32-k block as int4_gemm_q8's are.
torch::Tensor int8_gemm_q8(torch::Tensor x, torch::Tensor w, torch::Tensor scale,
                           c10::optional<torch::Tensor> bias, int64_t N, int64_t isa) {
  const int64_t K = x.dim() >= 1 ? x.size(-1) : 0, Kq = check_w8(w, scale, N, K), NT = w.size(0);
  const auto fn = pick_q8(isa).int8;
  const int64_t M = check_x(x, K);
  Q8Rows q = quantize_rows(x, M, K, Kq, isa);
  auto y = out_like(x, N);
  Int8Q8Params p{w.data_ptr<int8_t>(), scale.data_ptr<float>(), bias_ptr(bias, N), q.xq.data(), q.sx.data(),
                 q.bsum.data(), y.data_ptr<float>(), M, N, Kq, Kq};
  at::parallel_for(0, NT, 1, [&](int64_t tb, int64_t te) { fn(p, tb, te); });
  return y;
}

// Dequantise tiles [t0, t1) of a packed int8 weight to fp32 rows [.., K] (prefill path).
torch::Tensor int8_dequant(torch::Tensor w, torch::Tensor scale, int64_t N, int64_t K, int64_t t0,
                           int64_t t1) {
  const int64_t Kq = check_w8(w, scale, N, K), NT = w.size(0);
  TORCH_CHECK(0 <= t0 && t0 < t1 && t1 <= NT);
  const int64_t r0 = t0 * TILE, r1 = std::min(N, t1 * TILE);
  auto out = torch::empty({r1 - r0, K}, torch::dtype(torch::kFloat32));
  const int8_t* wd = w.data_ptr<int8_t>();
  const float* sd = scale.data_ptr<float>();
  float* od = out.data_ptr<float>();
  at::parallel_for(t0, t1, 1, [&](int64_t tb, int64_t te) {
    for (int64_t t = tb; t < te; ++t) {
      const int8_t* wt = wd + t * Kq * TILE;
      for (int r = 0; r < TILE; ++r) {
        const int64_t n = t * TILE + r;
        if (n >= r1) break;
        const float s = sd[n];
        float* o = od + (n - r0) * K;
        for (int64_t k = 0; k < K; ++k) o[k] = (float)wt[((k / 4) * TILE + r) * 4 + k % 4] * s;
      }
    }
  });
  return out;
}

torch::Tensor int4_dequant(torch::Tensor w, torch::Tensor sm, int64_t N, int64_t K, int64_t gs,
                           int64_t t0, int64_t t1) {
  TORCH_CHECK(w.scalar_type() == torch::kInt32 && w.dim() == 3 && w.is_contiguous());
  const int64_t NT = w.size(0), Kp = w.size(1) * 8, G = Kp / gs;
  TORCH_CHECK(0 <= t0 && t0 < t1 && t1 <= NT);
  const int64_t r0 = t0 * TILE, r1 = std::min(N, t1 * TILE);
  auto out = torch::empty({r1 - r0, K}, torch::dtype(torch::kFloat32));
  const uint32_t* wd = reinterpret_cast<const uint32_t*>(w.data_ptr<int32_t>());
  const uint16_t* smd = reinterpret_cast<const uint16_t*>(sm.data_ptr());
  float* od = out.data_ptr<float>();
  at::parallel_for(t0, t1, 1, [&](int64_t tb, int64_t te) {
    for (int64_t t = tb; t < te; ++t) {
      const uint32_t* wt = wd + t * (Kp / 8) * TILE;
      const uint16_t* smt = smd + t * G * 2 * TILE;
      for (int r = 0; r < TILE; ++r) {
        const int64_t n = t * TILE + r;
        if (n >= r1) break;
        float* o = od + (n - r0) * K;
        for (int64_t g = 0; g < G; ++g) {
          const float s = half_to_float(smt[g * 2 * TILE + r]);
          const float mn = half_to_float(smt[g * 2 * TILE + TILE + r]);
          const int64_t k1 = std::min(K, (g + 1) * gs);
          for (int64_t k = g * gs; k < k1; ++k) {
            const uint32_t q = (wt[(k >> 3) * TILE + r] >> (4 * nib_pos((int)(k & 7)))) & 0xFu;
            o[k] = s * (float)q + mn;
          }
        }
      }
    }
  });
  return out;
}

// One row of int4_quantize (below); cloned for AVX2 so the division and the rounding vectorize (vdivps, vroundps:
// the same IEEE results as the scalar clone, which other hosts run). False when a weight is NaN or infinite.
__attribute__((target_clones("avx2", "default")))
static bool int4_quantize_row(const float* x, int64_t K, int64_t gs, uint8_t* q, at::Half* S, at::Half* M) {
  const int64_t G = (K + gs - 1) / gs;
  bool ok = true;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t k0 = g * gs, k1 = std::min(K, k0 + gs);
    float lo = x[k0], hi = x[k0];
    for (int64_t k = k0; k < k1; ++k) {
      ok &= std::isfinite(x[k]);
      lo = std::min(lo, x[k]);
      hi = std::max(hi, x[k]);
    }
    at::Half s16 = at::Half((hi - lo) / 15.0f);
    float s = static_cast<float>(s16);
    if (!(s > 0.0f)) {
      s16 = at::Half(1.0f);
      s = 1.0f;
    }
    const at::Half m16 = at::Half(lo);
    const float m = static_cast<float>(m16);
    for (int64_t k = k0; k < k1; ++k) {
      const float v = std::nearbyint((x[k] - m) / s);
      q[k] = static_cast<uint8_t>(std::min(std::max(v, 0.0f), 15.0f));
    }
    for (int64_t k = k1; k < k0 + gs; ++k) q[k] = 0;
    S[g] = s16;
    M[g] = m16;
  }
  return ok;
}

// Group-wise asymmetric int4 of fp32 rows, the same values as engine/ops/formats.quantize_int4 (the definition):
// per group min/max; scale = half((max - min) / 15), 1 where that half is 0; min = half(min);
// q = round-half-even((w - float(min)) / float(scale)) clamped to 0..15, 0 past K; two codes a byte, low nibble
// first. Plain IEEE float arithmetic (no -ffast-math), so each value is the one torch computes; one pass, where
// torch's ops took most of a load. Returns {packed, scales, mins, finite}: finite is false when a weight is NaN or
// infinite, and then the torch definition decides.
std::vector<torch::Tensor> int4_quantize(torch::Tensor w, int64_t gs) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kFloat32 && w.device().is_cpu(),
              "int4_quantize: w must be a 2-D float32 CPU tensor");
  TORCH_CHECK(gs == 32 || gs == 64 || gs == 128, "int4_quantize: group size must be 32, 64 or 128");
  w = w.contiguous();
  const int64_t N = w.size(0), K = w.size(1), G = (K + gs - 1) / gs, Kp = G * gs;
  auto packed = torch::empty({N, Kp / 2}, torch::kUInt8);
  auto scales = torch::empty({N, G}, torch::kHalf);
  auto mins = torch::empty({N, G}, torch::kHalf);
  const float* W = w.data_ptr<float>();
  uint8_t* P = packed.data_ptr<uint8_t>();
  at::Half* S = scales.data_ptr<at::Half>();
  at::Half* M = mins.data_ptr<at::Half>();
  std::atomic<bool> finite{true};
  at::parallel_for(0, N, 16, [&](int64_t r0, int64_t r1) {
    std::vector<uint8_t> q(Kp);
    for (int64_t r = r0; r < r1; ++r) {
      if (!int4_quantize_row(W + r * K, K, gs, q.data(), S + r * G, M + r * G))
        finite.store(false, std::memory_order_relaxed);
      uint8_t* out = P + r * (Kp / 2);
      for (int64_t j = 0; j < Kp / 2; ++j) out[j] = static_cast<uint8_t>(q[2 * j] | (q[2 * j + 1] << 4));
    }
  });
  return {packed, scales, mins, torch::scalar_tensor(finite.load(), torch::kBool)};
}

// One row of int8_quantize (below); cloned for AVX2 as int4_quantize_row is (the same IEEE results on every clone).
__attribute__((target_clones("avx2", "default")))
static bool int8_quantize_row(const float* x, int64_t K, int8_t* q, float* scale) {
  float amax = 0.0f;
  bool ok = true;
  for (int64_t k = 0; k < K; ++k) {
    ok &= std::isfinite(x[k]);
    amax = std::max(amax, std::fabs(x[k]));
  }
  float s = amax / 127.0f;
  if (!(s > 0.0f)) s = 1.0f;
  *scale = s;
  for (int64_t k = 0; k < K; ++k)
    q[k] = static_cast<int8_t>(std::min(std::max(std::nearbyint(x[k] / s), -127.0f), 127.0f));
  return ok;
}

// Per-row symmetric int8 of fp32 rows, the same values as engine/ops/formats.quantize_int8 (the definition):
// scale = max|w| / 127 (1 for an all-zero row), q = round-half-even(w / scale) clamped to +-127.
// Returns {qweight, scale, finite}; finite false leaves the weight to the torch definition.
std::vector<torch::Tensor> int8_quantize(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kFloat32 && w.device().is_cpu(),
              "int8_quantize: w must be a 2-D float32 CPU tensor");
  w = w.contiguous();
  const int64_t N = w.size(0), K = w.size(1);
  auto q = torch::empty({N, K}, torch::kInt8);
  auto scale = torch::empty({N}, torch::kFloat32);
  const float* W = w.data_ptr<float>();
  int8_t* Q = q.data_ptr<int8_t>();
  float* S = scale.data_ptr<float>();
  std::atomic<bool> finite{true};
  at::parallel_for(0, N, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      if (!int8_quantize_row(W + r * K, K, Q + r * K, S + r)) finite.store(false, std::memory_order_relaxed);
  });
  return {q, scale, torch::scalar_tensor(finite.load(), torch::kBool)};
}

// Canonical int8 (qweight [N, K], scale fp32 [N]) -> the CPU tiled layout: w int8 [NT, Kq/4, 64, 4] (tile t,
// quad o, row r, byte i = q[64t + r, 4o + i]; Kq = K rounded up to 32), scale fp32 [NT * 64]; rows past N and
// k past K are zero. prepare_int8's torch form (prepared.tile_int8), in one pass.
std::vector<torch::Tensor> int8_tile(torch::Tensor qweight, torch::Tensor scale) {
  TORCH_CHECK(qweight.dim() == 2 && qweight.scalar_type() == torch::kInt8 && qweight.device().is_cpu() &&
              scale.scalar_type() == torch::kFloat32 && scale.numel() == qweight.size(0),
              "int8_tile: qweight must be int8 [N, K] on the CPU with a float32 scale [N]");
  qweight = qweight.contiguous();
  scale = scale.contiguous();
  const int64_t N = qweight.size(0), K = qweight.size(1), NT = (N + TILE - 1) / TILE, Kq = (K + 31) / 32 * 32;
  auto w = torch::empty({NT, Kq / 4, TILE, 4}, torch::kInt8);
  auto sp = torch::zeros({NT * TILE}, torch::kFloat32);
  const int8_t* Q = qweight.data_ptr<int8_t>();
  int8_t* Wt = w.data_ptr<int8_t>();
  std::memcpy(sp.data_ptr<float>(), scale.data_ptr<float>(), N * sizeof(float));
  at::parallel_for(0, NT, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t r = 0; r < TILE; ++r) {
        const int64_t n = t * TILE + r;
        for (int64_t k = 0; k < Kq; ++k)
          Wt[((t * (Kq / 4) + k / 4) * TILE + r) * 4 + k % 4] = (n < N && k < K) ? Q[n * K + k] : 0;
      }
  });
  return {w, sp};
}

// Canonical int4 (packed uint8 [N, Kp/2], scales/mins fp16 [N, G]) -> the CPU tiled layout engine/ops/prepared.py
// documents: w int32 [NT, Kp/8, 64], dword (t, o, r) byte i = q[8o+i] | q[8o+4+i] << 4 of row 64t + r;
// sm fp16 [NT, G, 2, 64]; rows past N are zero. The same bytes as prepare_int4's torch form, in one pass.
std::vector<torch::Tensor> int4_tile(torch::Tensor packed, torch::Tensor scales, torch::Tensor mins) {
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == torch::kUInt8 && packed.device().is_cpu(),
              "int4_tile: packed must be a 2-D uint8 CPU tensor");
  TORCH_CHECK(scales.scalar_type() == torch::kHalf && mins.scalar_type() == torch::kHalf,
              "int4_tile: scales and mins must be float16");
  packed = packed.contiguous();
  scales = scales.contiguous();
  mins = mins.contiguous();
  const int64_t N = packed.size(0), Kp = packed.size(1) * 2, G = scales.size(1), NT = (N + TILE - 1) / TILE;
  TORCH_CHECK(Kp % 8 == 0 && scales.size(0) == N && mins.size(0) == N && mins.size(1) == G,
              "int4_tile: shapes do not agree");
  auto w = torch::empty({NT, Kp / 8, TILE}, torch::kInt32);
  auto sm = torch::empty({NT, G, 2, TILE}, torch::kHalf);
  const uint8_t* P = packed.data_ptr<uint8_t>();
  const at::Half* S = scales.data_ptr<at::Half>();
  const at::Half* M = mins.data_ptr<at::Half>();
  uint8_t* Wb = reinterpret_cast<uint8_t*>(w.data_ptr<int32_t>());
  at::Half* SM = sm.data_ptr<at::Half>();
  const int64_t O = Kp / 8;
  at::parallel_for(0, NT, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t r = 0; r < TILE; ++r) {
        const int64_t n = t * TILE + r;
        for (int64_t o = 0; o < O; ++o) {
          uint8_t* d = Wb + ((t * O + o) * TILE + r) * 4;
          if (n >= N) {
            d[0] = d[1] = d[2] = d[3] = 0;
            continue;
          }
          const uint8_t* c = P + n * (Kp / 2) + 4 * o;  // q[8o..8o+7], two a byte, low nibble first
          d[0] = static_cast<uint8_t>((c[0] & 0x0F) | ((c[2] & 0x0F) << 4));
          d[1] = static_cast<uint8_t>((c[0] >> 4) | (c[2] & 0xF0));
          d[2] = static_cast<uint8_t>((c[1] & 0x0F) | ((c[3] & 0x0F) << 4));
          d[3] = static_cast<uint8_t>((c[1] >> 4) | (c[3] & 0xF0));
        }
        for (int64_t g = 0; g < G; ++g) {
          SM[((t * G + g) * 2 + 0) * TILE + r] = n < N ? S[n * G + g] : at::Half(0.0f);
          SM[((t * G + g) * 2 + 1) * TILE + r] = n < N ? M[n * G + g] : at::Half(0.0f);
        }
      }
    }
  });
  return {w, sm};
}

}  // namespace

namespace scl {
void register_fused(pybind11::module& m);  // fused_cpu.cpp
void register_dense(pybind11::module& m);  // dense.cpp
bool cpu_isa_supported(int64_t isa) { return isa_supported(isa); }  // for dense.cpp
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Serving Cost Lab weight-only int8/int4 CPU kernels";
  m.def("best_isa", &best_isa, "best ISA this CPU supports: 2=avx512, 1=avx2, 0=scalar");
  m.def("isa_supported", &isa_supported, "whether an ISA level can run here");
  m.def("max_m", []() { return (int64_t)MAX_M; });
  m.def("tile", []() { return (int64_t)TILE; });
  m.def("int8_gemm", &int8_gemm, "int8 weight-only GEMV/small-M GEMM", py::arg("x"),
        py::arg("w"), py::arg("scale"), py::arg("bias"), py::arg("N"), py::arg("isa"));
  m.def("int4_gemm", &int4_gemm, "int4 group-wise weight-only GEMV/small-M GEMM", py::arg("x"),
        py::arg("w"), py::arg("sm"), py::arg("bias"), py::arg("N"), py::arg("K"),
        py::arg("gs"), py::arg("isa"));
  m.def("has_vnni", &has_vnni, "AVX-512 VNNI (the fastest int4 x int8-activation kernel) available");
  m.def("int4_gemm_q8", &int4_gemm_q8, "int4 weights x int8 (per-32-block) activations",
        py::arg("x"), py::arg("w"), py::arg("sm"), py::arg("bias"), py::arg("N"), py::arg("K"),
        py::arg("gs"), py::arg("isa"));
  m.def("int8_gemm_q8", &int8_gemm_q8, "int8 weights x int8 (per-32-block) activations",
        py::arg("x"), py::arg("w"), py::arg("scale"), py::arg("bias"), py::arg("N"), py::arg("isa"));
  m.def("int8_dequant", &int8_dequant, "dequantise int8 tiles [t0, t1) to fp32 rows [.., K]");
  m.def("int4_dequant", &int4_dequant, "dequantise int4 tiles [t0, t1) to fp32 rows");
  m.def("int4_quantize", &int4_quantize, "round-to-nearest int4 of fp32 rows, bit-identical to formats.quantize_int4",
        py::arg("w"), py::arg("group_size"));
  m.def("int8_quantize", &int8_quantize, "per-row int8 of fp32 rows, bit-identical to formats.quantize_int8",
        py::arg("w"));
  m.def("int8_tile", &int8_tile, "canonical int8 -> the CPU tiled layout (prepare_int8's, one pass)",
        py::arg("qweight"), py::arg("scale"));
  m.def("int4_tile", &int4_tile, "canonical int4 -> the CPU tiled layout (prepare_int4's, one pass)",
        py::arg("packed"), py::arg("scales"), py::arg("mins"));
  m.def("q8_kernel", [](int64_t isa) -> std::string {
    if (isa == 2 && has_vnni()) return "avx512-vnni";
    return isa >= 1 ? "avx2-maddubs" : "scalar";
  }, "which int8-activation int4 kernel an ISA level runs");
  scl::register_fused(m);
  scl::register_dense(m);
}
