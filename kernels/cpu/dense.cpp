// Serving Cost Lab -- torch binding for the dense fp32/bf16/fp16 GEMV / small-M GEMM kernels
// (dense_kernels.h).  Registered into the scl_qgemm_cpu module by qgemm.cpp.
//
// Kernel ids (the `kernel` argument; tests and benchmarks force each one):
//   0 scalar reference, 1 AVX2 shift/FMA, 2 AVX-512 shift/FMA, 3 AVX-512 BF16 VDPBF16PS (bf16 w and x only),
//   4 AMX TDPBF16PS (bf16 w and x only; dense_amx.cpp).
// Threads: at::parallel_for over blocks of DR rows of W (OpenMP, honours torch.set_num_threads).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "dense_kernels.h"

namespace scl {
bool cpu_isa_supported(int64_t isa);  // qgemm.cpp

bool has_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return avx512::dense_bf16_compiled() && cpu_isa_supported(2) && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

namespace {

bool has_f16c() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

// io_bf16: x and y are bf16 (then w is too); w_f16: fp16 weights (VCVTPH2PS: F16C under AVX2, AVX-512F).
bool kernel_supported(int64_t kernel, bool io_bf16, bool w_f16) {
  switch (kernel) {
    case 0: return true;
    case 1: return cpu_isa_supported(1) && (!w_f16 || has_f16c());
    case 2: return cpu_isa_supported(2);
    case 3: return io_bf16 && has_avx512_bf16();
    case 4: return io_bf16 && has_avx512_bf16() && amx::available();
    default: return false;
  }
}

constexpr int64_t MIN_THREAD_ELEMS = 1 << 17;  // weights per thread below which a 2nd thread costs more

// y[..., N] = x[..., K] @ w[N, K]^T (+ bias); x and w both bf16 or both fp32, or fp32 x with bf16 or fp16 w;
// y in x's dtype.
torch::Tensor dense_gemm(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias,
                         int64_t kernel) {
  TORCH_CHECK(w.device().is_cpu() && x.device().is_cpu(), "dense_gemm: x and w must be on CPU");
  const auto wt = w.scalar_type(), xt = x.scalar_type();
  const bool bf = wt == torch::kBFloat16, f16 = wt == torch::kHalf;
  TORCH_CHECK(bf || f16 || wt == torch::kFloat32, "dense_gemm: w must be bfloat16, float16 or float32, got ", wt);
  TORCH_CHECK(xt == wt ? !f16 : xt == torch::kFloat32, "dense_gemm: x dtype ", xt, " with w dtype ", wt,
              " (x and w both bf16 or both fp32, or fp32 x with bf16 or fp16 w)");
  const bool io_bf16 = xt == torch::kBFloat16;
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous(), "dense_gemm: w must be a contiguous [N, K] tensor");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(K >= 1 && N >= 1, "dense_gemm: empty weight");
  TORCH_CHECK(x.dim() >= 1 && x.is_contiguous() && x.size(-1) == K,
              "dense_gemm: x must be a contiguous [..., K] tensor with K=", K);
  TORCH_CHECK(kernel_supported(kernel, io_bf16, f16), "dense_gemm: kernel ", kernel,
              " not supported on this CPU/build for x ", xt, " and w ", wt);
  const int64_t M = x.numel() / K;
  auto sizes = x.sizes().vec();
  sizes.back() = N;
  auto y = torch::empty(sizes, x.options());
  if (M == 0) return y;
  const void* bp = nullptr;
  bool bias_bf16 = false;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->device().is_cpu() && bias->is_contiguous() && bias->numel() == N &&
                    (bias->scalar_type() == torch::kFloat32 || bias->scalar_type() == torch::kBFloat16),
                "dense_gemm: bias must be a contiguous float32 or bfloat16 tensor with N elements");
    bp = bias->data_ptr();
    bias_bf16 = bias->scalar_type() == torch::kBFloat16;
  }
  const int64_t chunk = kernel == 1 ? avx2::DENSE_CHUNK : kernel >= 2 ? avx512::DENSE_CHUNK : 1;
  const int64_t Kc = K / chunk * chunk;
  DenseParams p{w.data_ptr(), x.data_ptr(), nullptr, K, bp, y.data_ptr(), M, N, K, Kc, bf, f16, io_bf16, bias_bf16};
  std::vector<float> xp;
  if ((kernel == 1 || kernel == 2) && bf) {  // even/odd-split fp32 copy of x (O(M*K), once per call)
    xp.resize((size_t)(M * Kc));
    if (io_bf16) {
      const uint16_t* xr = reinterpret_cast<const uint16_t*>(x.data_ptr());
      kernel == 1 ? avx2::dense_prep_x(xr, M, K, Kc, xp.data()) : avx512::dense_prep_x(xr, M, K, Kc, xp.data());
    } else {
      const float* xr = x.data_ptr<float>();
      kernel == 1 ? avx2::dense_prep_x(xr, M, K, Kc, xp.data()) : avx512::dense_prep_x(xr, M, K, Kc, xp.data());
    }
    p.xp = xp.data();
    p.ldxp = Kc;
  } else if (!io_bf16) {
    p.xp = x.data_ptr<float>();
  }
  if (kernel == 4) {  // blocks of AMX_ROWS rows of W, fixed by N (a row's path does not depend on threads)
    std::vector<uint32_t> xb((size_t)(((M + 15) / 16) * (Kc / 32) * 256));
    amx::pack_x(reinterpret_cast<const uint16_t*>(x.data_ptr()), M, K, Kc, xb.data());
    p.xb = xb.data();
    const int64_t nb = (N + amx::AMX_ROWS - 1) / amx::AMX_ROWS;
    const int64_t grain = std::max<int64_t>(1, MIN_THREAD_ELEMS / (amx::AMX_ROWS * K));
    at::parallel_for(0, nb, grain, [&](int64_t b0, int64_t b1) {
      amx::dense_rows(p, b0 * amx::AMX_ROWS, std::min(N, b1 * amx::AMX_ROWS));
    });
    return y;
  }
  using Fn = void (*)(const DenseParams&, int64_t, int64_t);
  const Fn fn = kernel == 3 ? avx512::dense_rows_dp
              : kernel == 2 ? avx512::dense_rows
              : kernel == 1 ? avx2::dense_rows
                            : scalar::dense_rows;
  const int64_t nb = (N + DR - 1) / DR;
  const int64_t grain = std::max<int64_t>(1, MIN_THREAD_ELEMS / (DR * K));
  at::parallel_for(0, nb, grain, [&](int64_t b0, int64_t b1) { fn(p, b0 * DR, std::min(N, b1 * DR)); });
  return y;
}

}  // namespace

void register_dense(pybind11::module& m) {
  m.def("dense_gemm", &dense_gemm,
        "y = x @ w^T + bias for bf16, fp16 or fp32 weights in their natural [N, K] layout (x bf16 with bf16 w, "
        "else fp32), fp32 accumulation; "
        "kernel 0 scalar, 1 avx2, 2 avx512 shift/FMA, 3 avx512_bf16 vdpbf16ps, 4 amx tdpbf16ps",
        py::arg("x"), py::arg("w"), py::arg("bias"), py::arg("kernel"));
  m.def("dense_kernel_supported", &kernel_supported, "whether a dense kernel id can run here for a dtype",
        py::arg("kernel"), py::arg("bf16"), py::arg("w_f16") = false);
  m.def("has_avx512_bf16", &has_avx512_bf16, "AVX512_BF16 (VDPBF16PS) available");
  m.def("has_amx_bf16", [] { return has_avx512_bf16() && amx::available(); },
        "AMX-BF16 tiles available to this process (TDPBF16PS)");
}

}  // namespace scl
