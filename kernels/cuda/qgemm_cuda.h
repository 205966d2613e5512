// Serving Cost Lab -- CUDA weight-only quantized GEMV / small-M GEMM and fused
// speculative verification.  Torch-free interface: the kernels (.cu) include
// only CUDA headers so they compile fast with plain nvcc; the torch binding is
// qgemm_cuda.cpp.
//
// Layouts (the canonical formats, see engine/ops/formats.py; prepared on device by
// engine/ops/prepared.py):
//   int8: w [N, Kpad] int8 row-major, Kpad = K rounded up to 16 (zero padded)
//         so each row is 16-byte aligned; scale [N] float32.
//   int4: w [N, Kp/2] uint8 row-major (canonical nibble order: byte j = q[2j] |
//         q[2j+1] << 4), Kp = G*gs; sm [N, G] half2 = (scale, min) fp16 pairs.
// Activations x [M, K] and outputs y [M, N] are fp32, fp16 or bf16 (same dtype),
// accumulation is fp32.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace scl_cuda {

enum DType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// Largest M handled by one kernel launch; larger M is split into chunks.
constexpr int kMaxMT = 16;

cudaError_t int8_gemm(const void* x, const int8_t* w, const float* scale, const void* bias,
                      void* y, int M, int N, int K, int Kpad, DType dt, cudaStream_t stream);

cudaError_t int4_gemm(const void* x, const uint8_t* w, const void* sm, const void* bias,
                      void* y, int M, int N, int K, int gs, DType dt, cudaStream_t stream);

// target_probs [B, gamma+1, V], draft_probs [B, gamma, V] (dtype dt) or nullptr for a
// deterministic draft (q one-hot on the drafted token), draft_tokens [B, gamma] int64,
// uniforms [B, gamma+1] float32 -> accepted [B], next_token [B] int64.
// The rule is engine/ops/verify.py's (see fused_verify.cu).
cudaError_t fused_verify(const void* target_probs, const void* draft_probs,
                         const int64_t* draft_tokens, const float* uniforms,
                         int64_t* accepted, int64_t* next_token, int B, int gamma, int V,
                         DType dt, cudaStream_t stream);

// Decode attention for ragged batches (decode_attention.cu): q [B, H, D], one row per sequence;
// k/v: one layer's cache [slots, KV, cap, D]; slots/lens int64 [B] on the device (row b attends
// to positions < lens[b] of its slot); workspace: attention_workspace_floats(B, H, D, cap)
// floats; out [B, H, D].  H/KV <= 8, D in {64, 128}.  q, k, v, out share the dtype dt.
// table null: the slot layout above.  table non-null: a paged cache, k/v [blocks, KV, block_size, D]
// and table int32 [slots, table_w] on the device (position p of slot s: block table[s][p / block_size],
// offset p % block_size); cap must be table_w * block_size.
int attention_splits(int cap);
size_t attention_workspace_floats(int B, int H, int D, int cap);
cudaError_t decode_attention(const void* q, const void* k, const void* v, const int64_t* slots,
                             const int64_t* lens, const int32_t* table, int table_w, int block_size,
                             float* workspace, void* out, int B, int H, int KV, int D, int cap, float scale,
                             DType dt, cudaStream_t stream);

// residual += x (x may be null), out = rmsnorm(residual) * weight; [rows, n] (rmsnorm_residual.cu).
cudaError_t rmsnorm_residual(const void* x, void* residual, const void* weight, void* out, int rows, int n,
                             float eps, DType dt, cudaStream_t stream);

}  // namespace scl_cuda
