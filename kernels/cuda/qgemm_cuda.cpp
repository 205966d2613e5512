// Torch binding for the CUDA kernels in qgemm_cuda.cu, fused_verify.cu, decode_attention.cu and
// rmsnorm_residual.cu.
// Built lazily by engine/ops/build.py (torch.utils.cpp_extension.load) when a CUDA
// build of torch and a GPU are present.
//
// Only torch/extension.h + the CUDA runtime are included (no c10/cuda headers):
// the caller passes the current stream as an integer handle
// (torch.cuda.current_stream(device).cuda_stream) and the device is selected with
// cudaSetDevice.  This keeps the file compilable (syntax-checked in
// tests/test_kernels_cuda_compile.py) against a CPU-only torch install.
#include <torch/extension.h>
#include <cuda_runtime.h>

#include "qgemm_cuda.h"

namespace {

scl_cuda::DType dtype_of(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat32: return scl_cuda::kF32;
    case torch::kFloat16: return scl_cuda::kF16;
    case torch::kBFloat16: return scl_cuda::kBF16;
    default: TORCH_CHECK(false, "unsupported dtype ", t.scalar_type(), " (need fp32/fp16/bf16)");
  }
  return scl_cuda::kF32;
}

void check_cuda(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

const void* opt_bias(const c10::optional<torch::Tensor>& bias, const torch::Tensor& x, int64_t N) {
  if (!bias.has_value() || !bias->defined()) return nullptr;
  check_cuda(*bias, "bias");
  TORCH_CHECK(bias->scalar_type() == x.scalar_type() && bias->numel() == N,
              "bias must have x's dtype and N elements");
  return bias->data_ptr();
}

void check_err(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, what, " failed: ", cudaGetErrorString(e));
}

// RAII: make t's device current for the launch, restore afterwards.
struct DeviceGuard {
  int prev = -1;
  explicit DeviceGuard(const torch::Tensor& t) {
    check_err(cudaGetDevice(&prev), "cudaGetDevice");
    if (prev != t.get_device()) check_err(cudaSetDevice(t.get_device()), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != prev && prev >= 0) cudaSetDevice(prev);
  }
};

inline cudaStream_t as_stream(int64_t s) { return reinterpret_cast<cudaStream_t>(s); }

// Output buffer: a fresh tensor, or the caller's `out` (lets tests poison it with NaN).
torch::Tensor make_out(const c10::optional<torch::Tensor>& out, const torch::Tensor& x, int64_t M,
                       int64_t N) {
  if (out.has_value() && out->defined()) {
    check_cuda(*out, "out");
    TORCH_CHECK(out->scalar_type() == x.scalar_type() && out->numel() == M * N &&
                    out->device() == x.device(), "out must be [M, N] with x's dtype and device");
    return *out;
  }
  return torch::empty({M, N}, x.options());
}

torch::Tensor int8_gemm(torch::Tensor x, torch::Tensor w, torch::Tensor scale,
                        c10::optional<torch::Tensor> bias, int64_t K,
                        int64_t stream, c10::optional<torch::Tensor> out) {
  check_cuda(x, "x");
  check_cuda(w, "w");
  check_cuda(scale, "scale");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be [M, K]");
  TORCH_CHECK(w.scalar_type() == torch::kInt8 && w.dim() == 2 && w.size(1) >= K &&
                  w.size(1) % 16 == 0, "w must be int8 [N, Kpad], Kpad = roundup(K, 16)");
  const int64_t M = x.size(0), N = w.size(0);
  TORCH_CHECK(scale.scalar_type() == torch::kFloat32 && scale.numel() == N, "scale must be fp32 [N]");
  TORCH_CHECK(w.device() == x.device() && scale.device() == x.device(), "device mismatch");
  const DeviceGuard guard(x);
  auto y = make_out(out, x, M, N);
  check_err(scl_cuda::int8_gemm(x.data_ptr(), w.data_ptr<int8_t>(), scale.data_ptr<float>(),
                                opt_bias(bias, x, N), y.data_ptr(), (int)M, (int)N, (int)K,
                                (int)w.size(1), dtype_of(x), as_stream(stream)),
            "scl int8_gemm");
  return y;
}

torch::Tensor int4_gemm(torch::Tensor x, torch::Tensor w, torch::Tensor sm,
                        c10::optional<torch::Tensor> bias, int64_t K, int64_t gs,
                        int64_t stream, c10::optional<torch::Tensor> out) {
  check_cuda(x, "x");
  check_cuda(w, "w");
  check_cuda(sm, "sm");
  TORCH_CHECK(gs == 32 || gs == 64 || gs == 128, "group size must be 32, 64 or 128");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be [M, K]");
  const int64_t G = (K + gs - 1) / gs;
  TORCH_CHECK(w.scalar_type() == torch::kUInt8 && w.dim() == 2 && w.size(1) == G * gs / 2,
              "w must be uint8 [N, G*gs/2]");
  const int64_t M = x.size(0), N = w.size(0);
  TORCH_CHECK(sm.scalar_type() == torch::kFloat16 && sm.numel() == N * G * 2,
              "sm must be fp16 [N, G, 2]");
  TORCH_CHECK(w.device() == x.device() && sm.device() == x.device(), "device mismatch");
  const DeviceGuard guard(x);
  auto y = make_out(out, x, M, N);
  check_err(scl_cuda::int4_gemm(x.data_ptr(), w.data_ptr<uint8_t>(), sm.data_ptr(),
                                opt_bias(bias, x, N), y.data_ptr(), (int)M, (int)N, (int)K,
                                (int)gs, dtype_of(x), as_stream(stream)),
            "scl int4_gemm");
  return y;
}

// draft_probs None: a deterministic draft (q one-hot on the drafted token).
std::vector<torch::Tensor> fused_verify(torch::Tensor tp, c10::optional<torch::Tensor> dp,
                                        torch::Tensor toks, torch::Tensor u, int64_t stream) {
  check_cuda(tp, "target_probs");
  check_cuda(toks, "draft_tokens");
  check_cuda(u, "uniforms");
  TORCH_CHECK(tp.dim() == 3, "target_probs must be [B, gamma+1, V]");
  const int64_t B = tp.size(0), gamma = tp.size(1) - 1, V = tp.size(2);
  TORCH_CHECK(gamma >= 0, "gamma must be >= 0");
  const void* dptr = nullptr;
  if (dp.has_value() && dp->defined()) {
    check_cuda(*dp, "draft_probs");
    TORCH_CHECK(dp->dim() == 3 && dp->size(0) == B && dp->size(1) == gamma && dp->size(2) == V &&
                    dp->scalar_type() == tp.scalar_type() && dp->device() == tp.device(),
                "draft_probs must be [B, gamma, V] with target_probs' dtype and device");
    dptr = dp->data_ptr();
  }
  TORCH_CHECK(toks.scalar_type() == torch::kInt64 && toks.dim() == 2 && toks.size(0) == B &&
                  toks.size(1) == gamma && toks.device() == tp.device(),
              "draft_tokens must be int64 [B, gamma] on target_probs' device");
  TORCH_CHECK(u.scalar_type() == torch::kFloat32 && u.dim() == 2 && u.size(0) == B &&
                  u.size(1) == gamma + 1 && u.device() == tp.device(),
              "uniforms must be float32 [B, gamma+1] on target_probs' device");
  const DeviceGuard guard(tp);
  auto opts = torch::dtype(torch::kInt64).device(tp.device());
  auto n = torch::empty({B}, opts), nxt = torch::empty({B}, opts);
  check_err(scl_cuda::fused_verify(tp.data_ptr(), dptr, toks.data_ptr<int64_t>(),
                                   u.data_ptr<float>(), n.data_ptr<int64_t>(),
                                   nxt.data_ptr<int64_t>(), (int)B, (int)gamma, (int)V,
                                   dtype_of(tp), as_stream(stream)),
            "scl fused_verify");
  return {n, nxt};
}

// q [B, H, D]; k/v one layer's cache [slots, KV, cap, D]; slots/lens int64 [B] (device).
// With table (int32 [slots, blocks per slot], device): a paged cache, k/v [blocks, KV, block size, D].
torch::Tensor decode_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor slots,
                               torch::Tensor lens, double scale, int64_t stream, c10::optional<torch::Tensor> out,
                               c10::optional<torch::Tensor> table) {
  for (auto* t : {&q, &k, &v, &slots, &lens}) check_cuda(*t, "decode_attention input");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 4 && k.sizes() == v.sizes(),
              "q [B, H, D], k/v [slots, KV, cap, D] (or [blocks, KV, block size, D] with a table)");
  const bool paged = table.has_value() && table->defined();
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), KV = k.size(1);
  int64_t cap = k.size(2), tw = 0, bs = 0;
  if (paged) {
    check_cuda(*table, "table");
    TORCH_CHECK(table->scalar_type() == torch::kInt32 && table->dim() == 2 && table->size(1) >= 1,
                "table: int32 [slots, blocks per slot]");
    bs = k.size(2);
    tw = table->size(1);
    cap = tw * bs;
    TORCH_CHECK(cap <= INT32_MAX, "table width * block size too large");
  }
  TORCH_CHECK(k.size(3) == D && H % KV == 0 && H / KV <= 8 && (D == 64 || D == 128),
              "head_dim 64/128 and at most 8 query heads per kv head");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), "q, k, v: one dtype");
  TORCH_CHECK(slots.scalar_type() == torch::kInt64 && lens.scalar_type() == torch::kInt64 && slots.numel() == B &&
                  lens.numel() == B, "slots / lens: int64 [B]");
  const DeviceGuard guard(q);
  auto ws = torch::empty({(int64_t)scl_cuda::attention_workspace_floats((int)B, (int)H, (int)D, (int)cap)},
                         q.options().dtype(torch::kFloat32));
  torch::Tensor o;
  if (out.has_value() && out->defined()) {
    check_cuda(*out, "out");
    TORCH_CHECK(out->sizes() == q.sizes() && out->scalar_type() == q.scalar_type(), "out must be like q");
    o = *out;
  } else {
    o = torch::empty_like(q);
  }
  check_err(scl_cuda::decode_attention(q.data_ptr(), k.data_ptr(), v.data_ptr(), slots.data_ptr<int64_t>(),
                                       lens.data_ptr<int64_t>(), paged ? table->data_ptr<int32_t>() : nullptr,
                                       (int)tw, (int)bs, ws.data_ptr<float>(), o.data_ptr(), (int)B, (int)H,
                                       (int)KV, (int)D, (int)cap, (float)scale, dtype_of(q), as_stream(stream)),
            "scl decode_attention");
  return o;
}

// residual += x (x optional), returns rmsnorm(residual) * weight; rows [R, n] contiguous.
torch::Tensor rmsnorm_residual(c10::optional<torch::Tensor> x, torch::Tensor residual, torch::Tensor weight,
                               double eps, int64_t stream, c10::optional<torch::Tensor> out) {
  check_cuda(residual, "residual");
  check_cuda(weight, "weight");
  const int64_t n = residual.size(-1), rows = residual.numel() / n;
  TORCH_CHECK(weight.numel() == n && weight.scalar_type() == residual.scalar_type(), "weight: [n], residual's dtype");
  const void* xp = nullptr;
  if (x.has_value() && x->defined()) {
    check_cuda(*x, "x");
    TORCH_CHECK(x->sizes() == residual.sizes() && x->scalar_type() == residual.scalar_type(), "x must be like residual");
    xp = x->data_ptr();
  }
  const DeviceGuard guard(residual);
  torch::Tensor o = (out.has_value() && out->defined()) ? *out : torch::empty_like(residual);
  TORCH_CHECK(o.sizes() == residual.sizes() && o.scalar_type() == residual.scalar_type() && o.is_contiguous(),
              "out must be like residual");
  check_err(scl_cuda::rmsnorm_residual(xp, residual.data_ptr(), weight.data_ptr(), o.data_ptr(), (int)rows, (int)n,
                                       (float)eps, dtype_of(residual), as_stream(stream)),
            "scl rmsnorm_residual");
  return o;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Serving Cost Lab weight-only int8/int4 CUDA kernels + fused speculative verify";
  m.def("int8_gemm", &int8_gemm, "int8 weight-only GEMV / small-M GEMM", py::arg("x"),
        py::arg("w"), py::arg("scale"), py::arg("bias"), py::arg("K"), py::arg("stream"),
        py::arg("out") = py::none());
  m.def("int4_gemm", &int4_gemm, "int4 group-wise weight-only GEMV / small-M GEMM", py::arg("x"),
        py::arg("w"), py::arg("sm"), py::arg("bias"), py::arg("K"), py::arg("gs"),
        py::arg("stream"), py::arg("out") = py::none());
  m.def("fused_verify", &fused_verify, "speculative sampling verification (draft_probs may be None)",
        py::arg("target_probs"), py::arg("draft_probs"), py::arg("draft_tokens"), py::arg("uniforms"),
        py::arg("stream"));
  m.def("max_mt", []() { return (int64_t)scl_cuda::kMaxMT; });
  m.def("decode_attention", &decode_attention, "ragged decode attention (one query row per sequence, GQA)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("slots"), py::arg("lens"), py::arg("scale"),
        py::arg("stream"), py::arg("out") = py::none(), py::arg("table") = py::none());
  m.def("rmsnorm_residual", &rmsnorm_residual, "residual += x; rmsnorm(residual) * weight", py::arg("x"),
        py::arg("residual"), py::arg("weight"), py::arg("eps"), py::arg("stream"), py::arg("out") = py::none());
}
