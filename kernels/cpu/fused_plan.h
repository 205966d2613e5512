// Serving Cost Lab -- the fused CPU forward pass: the plan (the model's weights as pointers, the
// workspaces) shared by fused_plan.cpp (building it, the binding) and fused_cpu.cpp (the step).
#pragma once
#include <torch/extension.h>

#include <omp.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "fused_bf16.h"
#include "fused_kernels.h"


namespace scl {
namespace fused {

struct IsaFns {
  void (*int8_tiles)(const Int8Params&, int64_t, int64_t);
  void (*int4_tiles)(const Int4Params&, int64_t, int64_t);
  void (*int4q8_tiles)(const Int4Q8Params&, int64_t, int64_t);
  void (*int8q8_tiles)(const Int8Q8Params&, int64_t, int64_t);
  void (*prep_xp)(const float*, int64_t, int64_t, int64_t, float*, float*);
  void (*prep_q8)(const float*, int64_t, int64_t, int64_t, int8_t*, float*, int32_t*, float*);
  void (*rmsnorm)(const float*, const float*, float, int64_t, float*);
  void (*silu_mul)(const float*, const float*, float*, int64_t);
  void (*gelu_tanh_mul)(const float*, const float*, float*, int64_t);
  void (*rope)(float*, const float*, const float*, int64_t);
  void (*attention)(const AttnItem&);
  void (*add_inplace)(float*, const float*, int64_t);
  DenseRowsFn dense_rows;     // bf16 linears: VDPBF16PS where the CPU has it, else the ISA's shift/FMA kernel
  DenseSplitFn dense_split;   // the shift/FMA kernels' even/odd split of the input (nullptr: they read bf16)
};

IsaFns isa_fns(int64_t isa, bool vnni);

// One linear: quantized in its tiled CPU layout (engine/ops/prepared.py), or a bf16 model's own weight.
struct Lin {
  int kind = 0;              // 0 absent, 4 int4, 8 int8, 16 bf16 (fused_bf16.h)
  const void* w = nullptr;   // int4: uint32 [NT][Kp/8][64]; int8: int8 [NT][Kp/4][64][4]; bf16: bf16 [N][K] (NT = N / 64 up)
  const void* s = nullptr;   // int4: fp16 [NT][G][2][64];  int8: fp32 [NT*64]
  const float* bias = nullptr;
  const int32_t* perm = nullptr;  // int4 only: its codes multiply x[perm[k]] (an act-order checkpoint's order)
  int64_t N = 0, K = 0, Kp = 0, G = 0, gs = 0, NT = 0;
};

// Whether a linear reads its input prepared (Act): int4 always, int8 when activations are int8.
inline bool reads_act(const Lin& l, bool act_int8) { return l.kind == 4 || (l.kind == 8 && act_int8); }

struct LayerW {
  const float* ln1;
  const float* ln2;                  // the MLP's input norm (Gemma: pre_feedforward_layernorm)
  const float* post_attn = nullptr;  // Gemma's sandwich: norms of the attention and MLP outputs
  const float* post_mlp = nullptr;
  const float* q_norm = nullptr;     // RMSNorm over head_dim of q and k heads, before RoPE (Qwen3, Gemma 3)
  const float* k_norm = nullptr;
  int64_t window = 0;                // sliding window (0 = full): a query at p sees keys p - window < k <= p
  int64_t rope = 0;                  // which of the plan's rotary settings this layer uses
  // q/k/v fused into qkv (k, v absent), or three; gate/up fused into gu (up absent), or two
  Lin qkv, k, v, o, gu, up, down;
  bool sep_qkv() const { return k.kind != 0; }
  bool sep_gu() const { return up.kind != 0; }
};

// Prepared activations of up to FUSED_MAX_ROWS rows of one input (row stride Kp).
struct Act {
  int64_t Kp = 0, nb = 0;
  std::vector<float> xp, sx, fsum;
  std::vector<int8_t> xq;
  std::vector<int32_t> bsum;
  void init(int64_t kp) {
    Kp = kp;
    nb = kp / 32;
    xp.assign((size_t)(FUSED_MAX_ROWS * kp), 0.f);
    xq.assign((size_t)(FUSED_MAX_ROWS * kp), 0);
    sx.assign((size_t)(FUSED_MAX_ROWS * nb), 0.f);
    fsum.assign((size_t)(FUSED_MAX_ROWS * nb), 0.f);
    bsum.assign((size_t)(FUSED_MAX_ROWS * nb), 0);
  }
};

// Profile categories (wall time per thread; "barrier wait" is the time a thread waits for the others).
enum Prof { P_NORM1, P_QKV, P_KVW, P_ATT, P_O, P_NORM2, P_GU, P_DOWN, P_HEAD, P_WAIT, P_SETUP, NPROF };
extern const char* const PROF_NAMES[NPROF];

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Thread {
  std::vector<float> xn;       // normed rows
  std::vector<float> xg;       // rows gathered in a linear's input order (act-order), before their preparation
  Act act;                     // their prepared activations (hidden-wide consumers)
  BAct bact;                   // and as bf16 consumers read them (a bf16 model)
  std::vector<float> xsum;     // per-group sums for the current consumer
  std::vector<float> q, out, scores;
  std::vector<const float*> ktiles, vtiles;   // an attention item's key/value tiles (AttnItem::kt, vt)
  std::vector<const int8_t*> k8tiles, v8tiles;        // an int8 cache: the tiles' values (AttnItem::kt8, vt8)
  std::vector<const uint16_t*> kstiles, vstiles;      // and their fp16 scales (AttnItem::ks, vs)
  std::vector<const uint16_t*> k16tiles, v16tiles;    // a bf16 cache: the tiles' values (AttnItem::kt16, vt16)
  std::vector<int8_t> q8;                     // an int8 cache: the item's queries quantized as keys are
  std::vector<float> qs, kvrow;               // their scales per 32 values; one row's K before it is stored
};


struct FusedPlan {
  int64_t L = 0, hidden = 0, H = 0, KV = 0, D = 0, I = 0, V = 0, G = 0, gs = 0;
  float eps = 1e-6f, scale = 1.f, softcap = 0.f;
  int act = 0;                          // 0 silu, 1 gelu (tanh approximation)
  // distinct rotary settings: inverse frequencies [nrope][D/2] (the first dim/2 used), rotated
  // width (partial rotary), and the factor cos and sin are multiplied by (yarn, longrope)
  int64_t nrope = 0;
  std::vector<float> inv_freq;
  std::vector<int64_t> rope_dim;
  std::vector<float> rope_scale;
  std::vector<LayerW> layers;
  const float* norm_w = nullptr;
  Lin head;
  std::vector<torch::Tensor> keep;     // keeps the weights alive
  // shared workspaces
  std::vector<float> x, qkv, attn, gu, h, tmp, cosb, sinb;   // cosb/sinb: [nrope][FUSED_MAX_ROWS][D/2]
  Act act_o, act_d;
  bool bf16 = false;                    // any bf16 linear: the inputs below (and each thread's bact) are sized
  BAct bact_o, bact_d;
  std::vector<Thread> th;
  std::unique_ptr<std::atomic<int64_t>[]> ctr;
  int64_t nctr = 0;
  std::mutex mu;
  // optional per-thread phase timers (bench/profile_decode.py): seconds per category
  bool profiling = false;
  std::vector<double> prof;   // [threads][NPROF]
  int64_t prof_steps = 0, prof_threads = 0;
};


using LinSpec = std::tuple<int64_t, torch::Tensor, torch::Tensor, c10::optional<torch::Tensor>, int64_t,
                           int64_t, int64_t>;

void ensure_threads(FusedPlan& P, int64_t nt);
std::shared_ptr<FusedPlan> make_fused_plan(std::vector<int64_t> dims, double eps, double attn_scale,
                                           double attn_softcap, int64_t act, std::vector<torch::Tensor> inv_freqs,
                                           std::vector<double> rope_scales, std::vector<int64_t> layer_rope,
                                           std::vector<int64_t> windows, std::vector<torch::Tensor> norms,
                                           std::vector<LinSpec> lins, std::vector<torch::Tensor> perms);
torch::Tensor fused_step(FusedPlan& P, torch::Tensor x_in, std::vector<int64_t> segs, torch::Tensor kc,
                         torch::Tensor vc, torch::Tensor table, torch::Tensor ks, torch::Tensor vs,
                         std::vector<int64_t> out_rows, int64_t isa, bool vnni, bool act_int8,
                         int64_t nthreads, std::vector<torch::Tensor> window_pool);

}  // namespace fused
}  // namespace scl
