// Serving Cost Lab -- the fused CPU forward pass, called once per model step for up to 64 token
// rows (decode batches, speculative verification, prefill chunks; engine/ops/fused.py splits
// larger steps into calls of 64 rows, so every step of a model takes this path).
//
// make_fused_plan() takes the model once (pointers into its prepared int4/int8 weights, or a bf16 model's own
// bf16 weights (fused_bf16.h), norms, RoPE frequencies) and preallocates the workspaces; fused_step() then runs all layers, the
// final norm and the head in ONE OpenMP parallel region, with a barrier between the phases of
// a layer:
//   A  RMSNorm -> activation prep (each thread its own copy: cheaper than a barrier)
//      -> qkv tiles (+ bias)                                                       | barrier
//  (B0 only when a sequence has more than 16 rows: K/V of every row written first | barrier)
//   B  per (sequence, block of <= 16 rows, kv head): q/k norms (Qwen3, Gemma 3), RoPE (the
//      layer's own setting, partial or scaled), K/V written at each row's position, attention
//      over that sequence's positions up to the row's own (from the sliding window's start on
//      a windowed layer; soft-capped scores for Gemma 2), prep of its columns of the o input | barrier
//   C  o tiles, residual added per tile                                            | barrier
//      (Gemma's sandwich norms: o tiles | barrier | x += norm(o) per row           | barrier)
//   D  RMSNorm -> prep -> gate/up tile pairs (tile t of gate and of up together), silu (or
//      gelu-tanh) * up for those 64 columns, prep of those columns of the down input | barrier
//   E  down tiles, residual added per tile, as C                                   | barrier
// then the final RMSNorm of the rows whose logits are wanted and the head's tiles.
// Work inside a phase is handed out dynamically (an atomic counter per phase), so a thread the
// shared machine preempts does not hold the other back.  Every row's arithmetic is the same
// whatever the other rows are (tiles, per-row activation prep and per-query attention are
// row-independent), so a row's logits do not depend on which sequences share the step, nor
// on how a step is split into calls.  No allocation in the step but the returned logits (the
// attention score buffer grows with the longest context seen).
#include "fused_plan.h"

namespace scl {
namespace fused {
namespace {

// Prepare row m of a from xrow (K wide) for an int4 consumer, over the whole row.
void prep_row(const IsaFns& F, bool q8, const float* xrow, int64_t K, int64_t m, Act& a) {
  if (q8)
    F.prep_q8(xrow, K, 0, a.Kp, a.xq.data() + m * a.Kp, a.sx.data() + m * a.nb, a.bsum.data() + m * a.nb,
              a.fsum.data() + m * a.nb);
  else
    F.prep_xp(xrow, K, 0, a.Kp, a.xp.data() + m * a.Kp, a.fsum.data() + m * a.nb);
}

// Prepare rows [0, M) of x (row stride K).
void prep_rows(const IsaFns& F, bool q8, const float* x, int64_t M, int64_t K, Act& a) {
  for (int64_t m = 0; m < M; ++m) prep_row(F, q8, x + m * K, K, m, a);
}

// Row m of x (K wide) gathered in the order `perm` into xg, prepared as row m of a.
void gather_prep_row(const IsaFns& F, bool q8, const float* xrow, const int32_t* perm, int64_t K, int64_t m,
                     float* xg, Act& a) {
  for (int64_t k = 0; k < K; ++k) xg[k] = xrow[perm[k]];
  prep_row(F, q8, xg, K, m, a);
}

// Prepare columns [k0, k1) (multiples of 32, k1 <= K) of row m of x.
void prep_cols(const IsaFns& F, bool q8, const float* xrow, int64_t K, int64_t k0, int64_t k1, int64_t m,
               Act& a) {
  if (q8)
    F.prep_q8(xrow, K, k0, k1, a.xq.data() + m * a.Kp, a.sx.data() + m * a.nb, a.bsum.data() + m * a.nb,
              a.fsum.data() + m * a.nb);
  else
    F.prep_xp(xrow, K, k0, k1, a.xp.data() + m * a.Kp, a.fsum.data() + m * a.nb);
}

// What one projection phase needs: its weight, its input, where its tiles go.
struct LinCall {
  const Lin* lin;
  int64_t M;
  const float* x;        // fp32 input rows [M][K] (int8 weights with fp32 activations read it)
  const Act* act;        // prepared input (int4 weights; int8 ones with int8 activations)
  float* y;              // [M][N]
  const BAct* bact;      // the input as bf16 weights read it
};

// Tiles [tb, te) of one projection (xsum: this thread's group sums of the input rows).
inline void run_tiles(const IsaFns& F, bool q8, const LinCall& c, const float* xsum, int64_t tb, int64_t te) {
  const Lin& l = *c.lin;
  if (l.kind == 16) {
    bf16_tiles(F.dense_rows, l.w, l.bias, l.N, l.K, *c.bact, c.M, c.y, tb, te);
  } else if (l.kind == 8 && q8) {
    Int8Q8Params p{(const int8_t*)l.w, (const float*)l.s, l.bias, c.act->xq.data(), c.act->sx.data(),
                   c.act->bsum.data(), c.y, c.M, l.N, l.Kp, c.act->Kp};
    F.int8q8_tiles(p, tb, te);
  } else if (l.kind == 8) {
    Int8Params p{(const int8_t*)l.w, (const float*)l.s, l.bias, c.x, c.y, c.M, l.N, l.K, l.Kp};
    F.int8_tiles(p, tb, te);
  } else if (q8) {
    Int4Q8Params p{(const uint32_t*)l.w, (const uint16_t*)l.s, l.bias, c.act->xq.data(), c.act->sx.data(),
                   c.act->bsum.data(), xsum, c.y, c.M, l.N, l.K, l.Kp, l.G, l.gs};
    F.int4q8_tiles(p, tb, te);
  } else {
    Int4Params p{(const uint32_t*)l.w, (const uint16_t*)l.s, l.bias, c.act->xp.data(), xsum, c.y,
                 c.M, l.N, l.K, l.Kp, l.G, l.gs};
    F.int4_tiles(p, tb, te);
  }
}

inline void group_sums(const LinCall& c, float* xsum) {
  const Lin& l = *c.lin;
  if (l.kind != 4) return;
  for (int64_t m = 0; m < c.M; ++m) xsum_from_fsum(c.act->fsum.data() + m * c.act->nb, l.G, l.gs, xsum + m * l.G);
}

// Where the q, k and v rows of a step live in the qkv workspace: one fused [M][H+2KV heads] output,
// or (separate projections) three blocks [M][HD], [M][KVD], [M][KVD].
struct QKV {
  const float *q, *k, *v;
  int64_t ldq, ldk, ldv;
};

QKV qkv_views(const FusedPlan& P, const LayerW& lw, int64_t M) {
  const int64_t Nqkv = (P.H + 2 * P.KV) * P.D, HD = P.H * P.D, KVD = P.KV * P.D;
  const float* b = P.qkv.data();
  if (lw.sep_qkv()) return {b, b + M * HD, b + M * HD + M * KVD, HD, KVD, KVD};
  return {b, b + HD, b + HD + KVD, Nqkv, Nqkv, Nqkv};
}

// One q or k head of row r as attention reads it: copied, normed over head_dim (q/k norms), rotated
// (the first rope_dim channels: partial rotary) with the layer's rotary setting.
inline void head_in(const FusedPlan& P, const LayerW& lw, const IsaFns& F, const float* norm_w, const float* src,
                    int64_t r, float* dst) {
  std::memcpy(dst, src, sizeof(float) * (size_t)P.D);
  if (norm_w) F.rmsnorm(dst, norm_w, P.eps, P.D, dst);
  const int64_t off = (lw.rope * FUSED_MAX_ROWS + r) * (P.D / 2);
  F.rope(dst, P.cosb.data() + off, P.sinb.data() + off, P.rope_dim[(size_t)lw.rope]);
}

// One tensor pair of the cache: a slot cache [layers, slots, KV, cap, D] (table null), or a paged one [layers,
// blocks, KV, bs, D] whose slot s holds block table[s * tw + pos / bs]; fp32 values, or an int8 cache's values
// and fp16 scales (per KV_K_GROUP values of K, per V vector; paged.py), or a bf16 cache's value bits. A paged
// cache on CPU is stored head-major ([layers, KV, blocks, bs, D] behind that view: paged.py), so one head's
// consecutive blocks are one run of memory; `st` holds the strides of dims 0-2 in rows of D values (a position's
// row is contiguous, and so are a block's positions; the scales are laid out as the values, D -> groups).
struct KVPool {
  int64_t n1 = 0;                  // slots or blocks
  int64_t st[3] = {0, 0, 0};       // rows between layers, slots or blocks, kv heads
  const int32_t* table = nullptr;
  int64_t tw = 0;                  // table row width (blocks per slot)
  float* kf = nullptr;
  float* vf = nullptr;
  int8_t* k8 = nullptr;
  int8_t* v8 = nullptr;
  c10::Half* ksc = nullptr;
  c10::Half* vsc = nullptr;
  uint16_t* k16 = nullptr;
  uint16_t* v16 = nullptr;
  std::vector<int64_t> table_sizes;
};

// Where the cache keeps position pos of (layer l, slot, kv head kh). A paged cache may keep the windowed layers
// of a model with full layers beside them in a second pool (paged.py), whose blocks behind the window go back:
// layer l is layer lidx[l] of pool lpool[l].
struct KVLayout {
  int64_t L, KV, D, n3;            // n3: capacity or block size
  bool q8 = false, b16 = false;
  KVPool pool[2];
  std::vector<int64_t> lpool, lidx;
  bool staged() const { return q8 || b16; }   // a row's K is built in a scratch row, then stored converted
  const KVPool& of(int64_t l) const { return pool[lpool[(size_t)l]]; }
  int64_t off(int64_t l, int64_t slot, int64_t kh, int64_t pos) const {
    const KVPool& p = of(l);
    const int64_t li = lidx[(size_t)l];
    if (!p.table) return (li * p.st[0] + slot * p.st[1] + kh * p.st[2] + pos) * D;
    const int64_t b = p.table[slot * p.tw + pos / n3];
    return (li * p.st[0] + b * p.st[1] + kh * p.st[2] + pos % n3) * D;
  }
};

constexpr int64_t KV_K_GROUP = 32;   // engine.common.formulas.INT8_K_GROUP

// x -> int8 values and fp16 scales of `groups` groups, as paged.quantize_int8: the scale amax / 127 rounded
// to fp16 first, the values rounded half to even with that scale and clamped to +-127.
inline void quantize_int8(const float* x, int64_t D, int64_t groups, int8_t* q, c10::Half* s) {
  const int64_t g = D / groups;
  for (int64_t j = 0; j < groups; ++j) {
    float amax = 0.f;
    for (int64_t i = j * g; i < (j + 1) * g; ++i) amax = std::max(amax, std::fabs(x[i]));
    const c10::Half sh = c10::Half(amax / 127.f);
    const float sf = (float)sh;
    s[j] = sh;
    for (int64_t i = j * g; i < (j + 1) * g; ++i) {
      const float v = sf > 0.f ? std::nearbyint(x[i] / sf) : 0.f;
      q[i] = (int8_t)std::max(-127.f, std::min(127.f, v));
    }
  }
}

// One position's K and V of (layer l, slot, kv head kh) into the cache (quantized in an int8 one, rounded in a
// bf16 one).
inline void store_kv(const KVLayout& lay, int64_t l, int64_t slot, int64_t kh, int64_t pos, const float* k,
                     const float* v) {
  const int64_t off = lay.off(l, slot, kh, pos);
  const KVPool& p = lay.of(l);
  if (lay.b16) {   // rounded to bf16 as torch's .to(bfloat16) rounds
    for (int64_t i = 0; i < lay.D; ++i) p.k16[off + i] = float_to_bf16(k[i]), p.v16[off + i] = float_to_bf16(v[i]);
    return;
  }
  if (!lay.q8) {
    if (p.kf + off != k) std::memcpy(p.kf + off, k, sizeof(float) * (size_t)lay.D);
    std::memcpy(p.vf + off, v, sizeof(float) * (size_t)lay.D);
    return;
  }
  const int64_t kg = lay.D / KV_K_GROUP;
  quantize_int8(k, lay.D, kg, p.k8 + off, p.ksc + off / lay.D * kg);
  quantize_int8(v, lay.D, 1, p.v8 + off, p.vsc + off / lay.D);
}

// Row r's K (normed, RoPE applied) and V of layer l into the cache at its slot and position, all kv heads.
void write_kv(const FusedPlan& P, const QKV& x, const IsaFns& F, int64_t l, int64_t r, int64_t pos, int64_t slot,
              const KVLayout& lay, float* krow) {
  const LayerW& lw = P.layers[(size_t)l];
  for (int64_t kh = 0; kh < P.KV; ++kh) {
    float* kdst = lay.staged() ? krow : lay.of(l).kf + lay.off(l, slot, kh, pos);
    head_in(P, lw, F, lw.k_norm, x.k + r * x.ldk + kh * P.D, r, kdst);
    store_kv(lay, l, slot, kh, pos, kdst, x.v + r * x.ldv + kh * P.D);
  }
}

// Key/value tiles [first / KEY_TILE, p_end) of (layer l, slot, kv head kh) for the attention kernel: pointers
// into the cache (a float or bf16 one, or an int8 one's values and fp16 scales); tiles before `first` are never read
// (before the window; their blocks may have gone back).
inline void gather_tiles(const KVLayout& lay, int64_t l, int64_t slot, int64_t kh, int64_t first, int64_t p_end,
                         Thread& me) {
  const int64_t t0 = first / KEY_TILE, kg = lay.D / KV_K_GROUP;
  const KVPool& p = lay.of(l);
  for (int64_t t = 0; t * KEY_TILE < p_end; ++t) {
    const size_t i = (size_t)t;
    if (t < t0) {
      me.ktiles[i] = me.vtiles[i] = nullptr;
      if (lay.q8) me.k8tiles[i] = me.v8tiles[i] = nullptr, me.kstiles[i] = me.vstiles[i] = nullptr;
      if (lay.b16) me.k16tiles[i] = me.v16tiles[i] = nullptr;
      continue;
    }
    const int64_t off = lay.off(l, slot, kh, t * KEY_TILE), row = off / lay.D;
    if (lay.b16) {
      me.k16tiles[i] = p.k16 + off;
      me.v16tiles[i] = p.v16 + off;
      continue;
    }
    if (!lay.q8) {
      me.ktiles[i] = p.kf + off;
      me.vtiles[i] = p.vf + off;
      continue;
    }
    me.k8tiles[i] = p.k8 + off;
    me.v8tiles[i] = p.v8 + off;
    me.kstiles[i] = reinterpret_cast<const uint16_t*>(p.ksc + row * kg);
    me.vstiles[i] = reinterpret_cast<const uint16_t*>(p.vsc + row);
  }
}

// An int8 cache: the item's nq queries quantized as the keys are (quantize_int8, per 32 values), so the
// attention kernel takes q.k as integer dot products; their scales as floats.
inline void quantize_queries(const float* q, int64_t nq, int64_t D, Thread& me) {
  const int64_t kg = D / KV_K_GROUP;
  c10::Half hs[256 / KV_K_GROUP];
  for (int64_t i = 0; i < nq; ++i) {
    quantize_int8(q + i * D, D, kg, me.q8.data() + i * D, hs);
    for (int64_t g = 0; g < kg; ++g) me.qs[(size_t)(i * kg + g)] = (float)hs[g];
  }
}

inline int64_t chunk_of(int64_t units, int64_t nt) {
  // about 8 chunks per thread: small enough to rebalance when a thread is preempted, large
  // enough (>= 100 KB of weights for the big projections) to keep the prefetcher streaming
  return std::max<int64_t>(1, units / (8 * nt));
}

// A paged pool stored head-major: the [layers, blocks, KV, bs, D] view of a contiguous [layers, KV, blocks, bs, D].
bool head_major(const torch::Tensor& c) {
  const int64_t D = c.size(4), bs = c.size(3), nb = c.size(1), KV = c.size(2);
  return c.stride(4) == 1 && c.stride(3) == D && c.stride(1) == bs * D && c.stride(2) == nb * bs * D &&
         c.stride(0) == KV * nb * bs * D;
}

// Scales s [..., groups] laid out as their values v [..., D]: the same order of rows (dims 0-3), groups contiguous.
bool laid_as(const torch::Tensor& s, const torch::Tensor& v) {
  if (s.dim() != 5 || s.stride(4) != 1) return false;
  const int64_t g = s.size(4), D = v.size(4);
  for (int d = 0; d < 4; ++d)
    if (s.size(d) != v.size(d) || s.stride(d) * D != v.stride(d) * g) return false;
  return true;
}

// A pool's tensors checked and entered into lay.pool[i]: `layers` of the model's layers, the same dtype and block
// size as pool 0.
void enter_pool(const FusedPlan& P, KVLayout& lay, int i, int64_t layers, torch::Tensor& kc, torch::Tensor& vc,
                torch::Tensor& table, torch::Tensor& ks, torch::Tensor& vs) {
  const bool paged = table.numel() > 0;
  for (auto* c : {&kc, &vc})
    TORCH_CHECK((c->scalar_type() == torch::kFloat32 || c->scalar_type() == torch::kInt8 ||
                 c->scalar_type() == torch::kBFloat16) && c->dim() == 5 && c->size(0) == layers &&
                    c->size(2) == P.KV && c->size(4) == P.D && (c->is_contiguous() || (paged && head_major(*c))),
                "cache must be fp32, bf16 or int8 [layers, slots or blocks, kv_heads, positions, head_dim], "
                "contiguous, or (paged) a view of [layers, kv_heads, blocks, positions, head_dim]");
  TORCH_CHECK(kc.sizes() == vc.sizes() && kc.scalar_type() == vc.scalar_type() && kc.strides() == vc.strides(),
              "k and v caches differ");
  TORCH_CHECK(!lay.q8 || (paged && P.D % KV_K_GROUP == 0 && ks.scalar_type() == torch::kHalf &&
                          vs.scalar_type() == torch::kHalf && ks.numel() == kc.numel() / KV_K_GROUP &&
                          vs.numel() == vc.numel() / P.D && laid_as(ks, kc) && laid_as(vs, vc)),
              "an int8 cache is paged, with fp16 scales per ", KV_K_GROUP, " key values and per value vector, "
              "laid out as its values");
  TORCH_CHECK(!paged || (table.scalar_type() == torch::kInt32 && table.is_contiguous() && table.dim() == 2 &&
                         kc.size(3) % KEY_TILE == 0),
              "a paged cache needs a contiguous int32 block table [slots, blocks] and a block size that is a "
              "multiple of ", KEY_TILE);
  TORCH_CHECK(i == 0 || (paged && kc.scalar_type() == (lay.q8 ? torch::kInt8 : lay.b16 ? torch::kBFloat16
                                                                                     : torch::kFloat32) &&
                         kc.size(3) == lay.n3 && table.sizes() == lay.pool[0].table_sizes),
              "the windowed layers' pool must be paged like the first, in its dtype, block size and table shape");
  KVPool& p = lay.pool[i];
  p.n1 = kc.size(1);
  for (int d = 0; d < 3; ++d) p.st[d] = kc.stride(d) / P.D;
  p.table = paged ? table.data_ptr<int32_t>() : nullptr;
  p.tw = paged ? table.size(1) : 0;
  p.table_sizes = table.sizes().vec();
  if (lay.q8) {
    p.k8 = kc.data_ptr<int8_t>();
    p.v8 = vc.data_ptr<int8_t>();
    p.ksc = ks.data_ptr<c10::Half>();
    p.vsc = vs.data_ptr<c10::Half>();
  } else if (lay.b16) {
    p.k16 = reinterpret_cast<uint16_t*>(kc.data_ptr<at::BFloat16>());
    p.v16 = reinterpret_cast<uint16_t*>(vc.data_ptr<at::BFloat16>());
  } else {
    p.kf = kc.data_ptr<float>();
    p.vf = vc.data_ptr<float>();
  }
}

}  // namespace

// One forward pass. x: [N, hidden] fp32 embeddings; segs: (slot, first row, rows, first position)
// per sequence; kc/vc: [L, slots, KV, capacity, D] fp32 with an empty block_table, or [L, blocks, KV,
// block size, D] with block_table [slots, blocks per slot] int32 (a paged cache); window_pool: empty, or a
// paged cache's second pool (k, v, table, k scales, v scales) that holds the windowed layers of a model with
// full layers beside them, kc/vc then holding the full layers (in layer order each); out_rows: rows whose
// logits are wanted.
// Returns logits [R, V] (or the final-normed hidden rows [R, hidden] when the head is not ours).
torch::Tensor fused_step(FusedPlan& P, torch::Tensor x_in, std::vector<int64_t> segs, torch::Tensor kc,
                         torch::Tensor vc, torch::Tensor table, torch::Tensor ks, torch::Tensor vs,
                         std::vector<int64_t> out_rows, int64_t isa, bool vnni, bool act_int8,
                         int64_t nthreads, std::vector<torch::Tensor> window_pool) {
  std::lock_guard<std::mutex> lock(P.mu);
  const double t_setup = P.profiling ? now_s() : 0.0;
  TORCH_CHECK(x_in.scalar_type() == torch::kFloat32 && x_in.is_contiguous() && x_in.dim() == 2 &&
                  x_in.size(1) == P.hidden, "x must be contiguous fp32 [N, hidden]");
  const int64_t M = x_in.size(0);
  TORCH_CHECK(M >= 1 && M <= FUSED_MAX_ROWS, "fused step takes 1..", FUSED_MAX_ROWS, " rows, got ", M);
  TORCH_CHECK(segs.size() % 4 == 0 && !segs.empty(), "segments: 4 ints each");
  TORCH_CHECK(window_pool.empty() || window_pool.size() == 5, "window_pool: k, v, table, k scales, v scales");
  const int64_t S = (int64_t)segs.size() / 4;
  // attention work items: (segment, block of ATT_ROWS rows); x KV heads
  std::vector<int64_t> items;   // (segment, first row offset, rows)
  bool long_seg = false;
  const bool q8 = kc.scalar_type() == torch::kInt8, b16 = kc.scalar_type() == torch::kBFloat16;
  const bool two = !window_pool.empty();
  KVLayout lay{P.L, P.KV, P.D, kc.size(3)};
  lay.q8 = q8, lay.b16 = b16;
  int64_t per_pool[2] = {0, 0};
  for (const auto& lw : P.layers) {   // layer order within each pool
    const int64_t i = two && lw.window ? 1 : 0;
    lay.lpool.push_back(i);
    lay.lidx.push_back(per_pool[i]++);
  }
  TORCH_CHECK(!two || (per_pool[0] > 0 && per_pool[1] > 0), "a second pool is for a model with windowed and full "
              "layers");
  enter_pool(P, lay, 0, per_pool[0], kc, vc, table, ks, vs);
  if (two) enter_pool(P, lay, 1, per_pool[1], window_pool[0], window_pool[1], window_pool[2], window_pool[3],
                      window_pool[4]);
  const bool paged = lay.pool[0].table != nullptr;
  const int64_t slots = paged ? table.size(0) : kc.size(1);
  const int64_t cap = paged ? table.size(1) * kc.size(3) : kc.size(3);
  int64_t rows_seen = 0, maxlen = 0;
  // per pool, the earliest key any of its layers reads is p0 - reach + 1; 0: position 0 (a full layer)
  int64_t reach[2] = {-1, -1};
  for (int64_t l = 0; l < P.L; ++l) {
    int64_t& r = reach[lay.lpool[(size_t)l]];
    const int64_t w = P.layers[(size_t)l].window;
    r = (r == 0 || !w) ? 0 : std::max(r, w);
  }
  std::vector<int64_t> row_pos((size_t)M, -1), row_slot((size_t)M, -1);
  for (int64_t s = 0; s < S; ++s) {
    const int64_t slot = segs[4 * s], r0 = segs[4 * s + 1], n = segs[4 * s + 2], p0 = segs[4 * s + 3];
    TORCH_CHECK(slot >= 0 && slot < slots, "segment slot out of range");
    TORCH_CHECK(r0 == rows_seen && n >= 1 && p0 >= 0 && p0 + n <= cap, "segments must tile the rows in order "
                "and fit the cache");
    for (int64_t t = 0; t < s; ++t) TORCH_CHECK(segs[4 * t] != slot, "two segments of one slot in a step");
    // every block the segment reads or writes is a block of its pool (blocks behind the window of every layer of a
    // pool may have gone back: engine/infer/blocks.py RELEASED)
    for (int i = 0; paged && i < (two ? 2 : 1); ++i) {
      const KVPool& p = lay.pool[i];
      for (int64_t b = reach[i] > 0 ? std::max<int64_t>(0, p0 - reach[i] + 1) / lay.n3 : 0;
           b <= (p0 + n - 1) / lay.n3; ++b) {
        const int32_t id = p.table[slot * p.tw + b];
        TORCH_CHECK(id >= 0 && id < p.n1, "block table entry ", id, " of slot ", slot, " is not a block",
                    two ? (i ? " (windowed layers' pool)" : " (full layers' pool)") : "");
      }
    }
    for (int64_t i = 0; i < n; ++i) row_pos[(size_t)(r0 + i)] = p0 + i, row_slot[(size_t)(r0 + i)] = slot;
    for (int64_t b = 0; b < n; b += ATT_ROWS) items.insert(items.end(), {s, b, std::min<int64_t>(ATT_ROWS, n - b)});
    long_seg = long_seg || n > ATT_ROWS;
    rows_seen += n;
    maxlen = std::max(maxlen, p0 + n);
  }
  TORCH_CHECK(rows_seen == M, "segments cover ", rows_seen, " rows, x has ", M);
  const int64_t R = (int64_t)out_rows.size();
  TORCH_CHECK(R <= FUSED_MAX_ROWS, "too many output rows");
  for (int64_t r : out_rows) TORCH_CHECK(r >= 0 && r < M, "logits row out of range");
  const bool has_head = P.head.kind != 0;
  auto out = torch::empty({R, has_head ? P.V : P.hidden}, torch::dtype(torch::kFloat32));
  float* outp = out.data_ptr<float>();

  const int64_t nt = std::max<int64_t>(1, nthreads);
  ensure_threads(P, nt);
  const int64_t nq_max = (int64_t)ATT_ROWS * P.G;
  // grows with the context only, and geometrically: a decode step reaches one position further than the last, and
  // an exact reallocation (zero-filled) of nq_max x maxlen floats each step cost 2-3 ms at 32k positions
  for (int64_t t = 0; t < nt; ++t) {
    std::vector<float>& sc = P.th[(size_t)t].scores;
    const size_t need = (size_t)(nq_max * maxlen);
    if (sc.capacity() < need) sc.reserve(std::max(need, sc.capacity() * 3 / 2));
    if (sc.size() < need) sc.resize(need);
  }
  const int64_t ntiles = (maxlen + KEY_TILE - 1) / KEY_TILE;
  for (int64_t t = 0; t < nt; ++t) {
    Thread& th = P.th[(size_t)t];
    th.ktiles.resize((size_t)ntiles);
    th.vtiles.resize((size_t)ntiles);
    if (b16)
      for (auto* v : {&th.k16tiles, &th.v16tiles}) v->resize((size_t)ntiles);
    if (q8) {
      for (auto* v : {&th.k8tiles, &th.v8tiles}) v->resize((size_t)ntiles);
      for (auto* v : {&th.kstiles, &th.vstiles}) v->resize((size_t)ntiles);
      th.q8.resize((size_t)(nq_max * P.D));
      th.qs.resize((size_t)(nq_max * P.D / KV_K_GROUP));
    }
    th.kvrow.resize((size_t)P.D);
  }
  for (int64_t i = 0; i < P.nctr; ++i) P.ctr[i].store(0, std::memory_order_relaxed);
  std::memcpy(P.x.data(), x_in.data_ptr<float>(), sizeof(float) * (size_t)(M * P.hidden));
  const int64_t half = P.D / 2;
  for (int64_t ri = 0; ri < P.nrope; ++ri) {
    const float* inv = P.inv_freq.data() + ri * half;
    const float sc = P.rope_scale[(size_t)ri];
    float* cb = P.cosb.data() + ri * FUSED_MAX_ROWS * half;
    float* sb = P.sinb.data() + ri * FUSED_MAX_ROWS * half;
    for (int64_t r = 0; r < M; ++r) {
      const float pos = (float)row_pos[(size_t)r];
      for (int64_t i = 0; i < P.rope_dim[(size_t)ri] / 2; ++i) {
        const float a = pos * inv[i];   // fp32 product, as RopeSpec.tables computes it
        cb[r * half + i] = std::cos(a) * sc;
        sb[r * half + i] = std::sin(a) * sc;
      }
    }
  }

  const IsaFns F = isa_fns(isa, vnni);
  if (P.bf16 && F.dense_split) {  // the shift/FMA kernels read bf16 inputs split into fp32 halves
    P.bact_o.need_split();
    P.bact_d.need_split();
    for (int64_t t = 0; t < nt; ++t) P.th[(size_t)t].bact.need_split();
  }
  const bool prof = P.profiling;
  if (prof) {
    if (P.prof_threads < nt) {
      P.prof.resize((size_t)(nt * NPROF), 0.0);
      P.prof_threads = nt;
    }
    P.prof[P_SETUP] += now_s() - t_setup;
    ++P.prof_steps;
  }
  const int64_t HD = P.H * P.D;

#pragma omp parallel num_threads((int)nt)
  {
    const int tid = omp_get_thread_num();
    Thread& me = P.th[(size_t)tid];
    int64_t phase = 0;
    int64_t lens[ATT_ROWS], starts[ATT_ROWS];
    double* pt = prof ? P.prof.data() + (size_t)tid * NPROF : nullptr;
    double tmark = prof ? now_s() : 0.0;
    auto mark = [&](int cat) {
      if (pt) {
        const double t = now_s();
        pt[cat] += t - tmark;
        tmark = t;
      }
    };

    // dynamic tiles of one projection; post(tb, te) runs after each chunk
    auto project = [&](const LinCall& c, auto&& post) {
      group_sums(c, me.xsum.data());
      const bool q8 = act_int8 && reads_act(*c.lin, act_int8);
      const int64_t NT = c.lin->NT, ch = chunk_of(NT, nt);
      std::atomic<int64_t>& ctr = P.ctr[phase++];
      for (;;) {
        const int64_t tb = ctr.fetch_add(1, std::memory_order_relaxed) * ch;
        if (tb >= NT) break;
        const int64_t te = std::min(NT, tb + ch);
        run_tiles(F, q8, c, me.xsum.data(), tb, te);
        post(tb, te);
      }
    };
    auto residual = [&](int64_t tb, int64_t te) {
      const int64_t c0 = tb * TILE, c1 = std::min(P.hidden, te * TILE);
      for (int64_t m = 0; m < M; ++m)
        F.add_inplace(P.x.data() + m * P.hidden + c0, P.tmp.data() + m * P.hidden + c0, c1 - c0);
    };
    // x += rmsnorm(tmp) * w, row by row, after the projection into tmp is complete
    auto post_norm_residual = [&](const float* w, int cat) {
      mark(cat);
#pragma omp barrier
      mark(P_WAIT);
      std::atomic<int64_t>& ctr = P.ctr[phase++];
      for (;;) {
        const int64_t m = ctr.fetch_add(1, std::memory_order_relaxed);
        if (m >= M) break;
        float* t = P.tmp.data() + m * P.hidden;
        F.rmsnorm(t, w, P.eps, P.hidden, t);
        F.add_inplace(P.x.data() + m * P.hidden, t, P.hidden);
      }
    };
    // int4 consumers (and int8 ones with int8 activations) read the prepared rows, other int8 ones the normed
    // rows: prepare when any consumer reads them (in the consumers' input order when they have one: then all of
    // them are int4, make_fused_plan checked)
    auto norm_prep = [&](const float* w, bool int4_consumer, int64_t rows, const int64_t* which,
                         const int32_t* perm, bool bf16_consumer) {
      for (int64_t m = 0; m < rows; ++m) {
        const int64_t src = which ? which[m] : m;
        F.rmsnorm(P.x.data() + src * P.hidden, w, P.eps, P.hidden, me.xn.data() + m * P.hidden);
      }
      if (bf16_consumer)
        for (int64_t m = 0; m < rows; ++m)
          prep_bf16_cols(F.dense_split, me.xn.data() + m * P.hidden, 0, P.hidden, m, me.bact);
      if (perm)
        for (int64_t m = 0; m < rows; ++m)
          gather_prep_row(F, act_int8, me.xn.data() + m * P.hidden, perm, P.hidden, m, me.xg.data(), me.act);
      else if (int4_consumer)
        prep_rows(F, act_int8, me.xn.data(), rows, P.hidden, me.act);
    };
    // an input whose consumer gathers it (act-order) is prepared once whole, row by row, behind a barrier
    auto gather_phase = [&](const float* src, int64_t K, const Lin& lin, Act& a, int cat) {
      std::atomic<int64_t>& ctr = P.ctr[phase++];
      for (;;) {
        const int64_t m = ctr.fetch_add(1, std::memory_order_relaxed);
        if (m >= M) break;
        gather_prep_row(F, act_int8, src + m * K, lin.perm, K, m, me.xg.data(), a);
      }
      mark(cat);
#pragma omp barrier
      mark(P_WAIT);
    };

    for (int64_t l = 0; l < P.L; ++l) {
      const LayerW& lw = P.layers[(size_t)l];
      // ---- A: norm, qkv
      norm_prep(lw.ln1, reads_act(lw.qkv, act_int8) || reads_act(lw.k, act_int8) || reads_act(lw.v, act_int8), M,
                nullptr, lw.qkv.perm,
                lw.qkv.kind == 16 || lw.k.kind == 16 || lw.v.kind == 16);
      mark(P_NORM1);
      const QKV qx = qkv_views(P, lw, M);
      project(LinCall{&lw.qkv, M, me.xn.data(), &me.act, const_cast<float*>(qx.q), &me.bact},
              [](int64_t, int64_t) {});
      if (lw.sep_qkv()) {   // the same normed input, into their own blocks (no barrier between them)
        project(LinCall{&lw.k, M, me.xn.data(), &me.act, const_cast<float*>(qx.k), &me.bact},
                [](int64_t, int64_t) {});
        project(LinCall{&lw.v, M, me.xn.data(), &me.act, const_cast<float*>(qx.v), &me.bact},
                [](int64_t, int64_t) {});
      }
      mark(P_QKV);
#pragma omp barrier
      mark(P_WAIT);
      // ---- B: rope, cache write, attention per (sequence, block of <= 16 rows, kv head).  When a
      // sequence has more rows than one block, its later blocks read keys an earlier block
      // writes: then all K/V are written first (B0), behind a barrier.
      if (long_seg) {
        std::atomic<int64_t>& ctr = P.ctr[phase++];
        for (;;) {
          const int64_t r = ctr.fetch_add(1, std::memory_order_relaxed);
          if (r >= M) break;
          write_kv(P, qx, F, l, r, row_pos[(size_t)r], row_slot[(size_t)r], lay, me.kvrow.data());
        }
        mark(P_KVW);
#pragma omp barrier
        mark(P_WAIT);
      }
      {
        std::atomic<int64_t>& ctr = P.ctr[phase++];
        const bool oq8 = act_int8 && reads_act(lw.o, act_int8);
        const int64_t nitems = (int64_t)items.size() / 3;
        for (;;) {
          const int64_t it = ctr.fetch_add(1, std::memory_order_relaxed);
          if (it >= nitems * P.KV) break;
          const int64_t* itm = items.data() + 3 * (it / P.KV);
          const int64_t kh = it % P.KV, s = itm[0];
          const int64_t slot = segs[4 * s], r0 = segs[4 * s + 1] + itm[1], n = itm[2], p0 = segs[4 * s + 3] + itm[1];
          for (int64_t i = 0; i < n; ++i) {
            const int64_t r = r0 + i, pos = p0 + i;
            if (!long_seg) {
              float* kdst = lay.staged() ? me.kvrow.data() : lay.of(l).kf + lay.off(l, slot, kh, pos);
              head_in(P, lw, F, lw.k_norm, qx.k + r * qx.ldk + kh * P.D, r, kdst);
              store_kv(lay, l, slot, kh, pos, kdst, qx.v + r * qx.ldv + kh * P.D);
            }
            for (int64_t g = 0; g < P.G; ++g)
              head_in(P, lw, F, lw.q_norm, qx.q + r * qx.ldq + (kh * P.G + g) * P.D, r,
                      me.q.data() + (i * P.G + g) * P.D);
            lens[i] = pos + 1;
            starts[i] = lw.window ? std::max<int64_t>(0, pos - lw.window + 1) : 0;
          }
          int64_t first = p0 + n;
          for (int64_t i = 0; i < n; ++i) first = std::min(first, starts[i]);
          gather_tiles(lay, l, slot, kh, first, p0 + n, me);
          AttnItem a{me.q.data(), n * P.G, P.G, starts, lens, me.ktiles.data(), me.vtiles.data(), me.scores.data(),
                     me.out.data(), P.D, p0 + n, P.scale, P.softcap};
          if (q8) {
            quantize_queries(me.q.data(), n * P.G, P.D, me);
            a.kt8 = me.k8tiles.data(), a.vt8 = me.v8tiles.data(), a.ks = me.kstiles.data(), a.vs = me.vstiles.data();
            a.q8 = me.q8.data(), a.qs = me.qs.data();
          }
          if (b16) a.kt16 = me.k16tiles.data(), a.vt16 = me.v16tiles.data();
          F.attention(a);
          const int64_t c0 = kh * P.G * P.D, c1 = c0 + P.G * P.D;
          for (int64_t i = 0; i < n; ++i) {
            float* arow = P.attn.data() + (r0 + i) * HD;
            std::memcpy(arow + c0, me.out.data() + i * P.G * P.D, sizeof(float) * (size_t)(P.G * P.D));
            if (reads_act(lw.o, act_int8) && !lw.o.perm) prep_cols(F, oq8, arow, HD, c0, c1, r0 + i, P.act_o);
            if (lw.o.kind == 16) prep_bf16_cols(F.dense_split, arow, c0, c1, r0 + i, P.bact_o);
          }
        }
      }
      mark(P_ATT);
#pragma omp barrier
      mark(P_WAIT);
      if (lw.o.perm) gather_phase(P.attn.data(), HD, lw.o, P.act_o, P_ATT);
      // ---- C: o projection + residual (Gemma: the residual adds the normed projection, once it is whole)
      if (lw.post_attn) {
        project(LinCall{&lw.o, M, P.attn.data(), &P.act_o, P.tmp.data(), &P.bact_o}, [](int64_t, int64_t) {});
        post_norm_residual(lw.post_attn, P_O);
      } else {
        project(LinCall{&lw.o, M, P.attn.data(), &P.act_o, P.tmp.data(), &P.bact_o}, residual);
      }
      mark(P_O);
#pragma omp barrier
      mark(P_WAIT);
      // ---- D: norm, gate/up pairs, silu * up, prep of the down input
      norm_prep(lw.ln2, reads_act(lw.gu, act_int8) || reads_act(lw.up, act_int8), M, nullptr, lw.gu.perm,
                lw.gu.kind == 16 || lw.up.kind == 16);
      mark(P_NORM2);
      {
        // fused: tiles t and t + I/64 of one weight into [M][2I]; separate: tile t of each into [M][I] twice
        const bool sep = lw.sep_gu();
        float* gbuf = P.gu.data();
        float* ubuf = sep ? gbuf + M * P.I : gbuf + P.I;
        const int64_t ld = sep ? P.I : 2 * P.I;
        const LinCall cg{&lw.gu, M, me.xn.data(), &me.act, gbuf, &me.bact};
        const LinCall cu{sep ? &lw.up : &lw.gu, M, me.xn.data(), &me.act, sep ? ubuf : gbuf, &me.bact};
        // one input, one group size: the same sums for both (a mixed pair: from its int4 member)
        group_sums(lw.gu.kind == 4 ? cg : cu, me.xsum.data());
        const bool q8 = act_int8;   // run_tiles reads it for int4 and int8 weights only
        const bool dq8 = act_int8 && reads_act(lw.down, act_int8);
        const int64_t NTh = P.I / TILE, ch = chunk_of(NTh, nt), uoff = sep ? 0 : NTh;
        std::atomic<int64_t>& ctr = P.ctr[phase++];
        for (;;) {
          const int64_t ub = ctr.fetch_add(1, std::memory_order_relaxed) * ch;
          if (ub >= NTh) break;
          const int64_t ue = std::min(NTh, ub + ch);
          run_tiles(F, q8, cg, me.xsum.data(), ub, ue);                 // gate rows
          run_tiles(F, q8, cu, me.xsum.data(), ub + uoff, ue + uoff);   // the matching up rows
          const int64_t c0 = ub * TILE, c1 = ue * TILE;
          for (int64_t m = 0; m < M; ++m) {
            float* hrow = P.h.data() + m * P.I;
            (P.act ? F.gelu_tanh_mul : F.silu_mul)(gbuf + m * ld + c0, ubuf + m * ld + c0, hrow + c0, c1 - c0);
            if (reads_act(lw.down, act_int8) && !lw.down.perm) prep_cols(F, dq8, hrow, P.I, c0, c1, m, P.act_d);
            if (lw.down.kind == 16) prep_bf16_cols(F.dense_split, hrow, c0, c1, m, P.bact_d);
          }
        }
      }
      mark(P_GU);
#pragma omp barrier
      mark(P_WAIT);
      if (lw.down.perm) gather_phase(P.h.data(), P.I, lw.down, P.act_d, P_GU);
      // ---- E: down + residual
      if (lw.post_mlp) {
        project(LinCall{&lw.down, M, P.h.data(), &P.act_d, P.tmp.data(), &P.bact_d}, [](int64_t, int64_t) {});
        post_norm_residual(lw.post_mlp, P_DOWN);
      } else {
        project(LinCall{&lw.down, M, P.h.data(), &P.act_d, P.tmp.data(), &P.bact_d}, residual);
      }
      mark(P_DOWN);
#pragma omp barrier
      mark(P_WAIT);
    }
    // ---- final norm of the wanted rows, head
    if (R > 0) {
      if (has_head) {
        norm_prep(P.norm_w, reads_act(P.head, act_int8), R, out_rows.data(), P.head.perm, P.head.kind == 16);
        project(LinCall{&P.head, R, me.xn.data(), &me.act, outp, &me.bact}, [](int64_t, int64_t) {});
      } else if (tid == 0) {
        for (int64_t m = 0; m < R; ++m)
          F.rmsnorm(P.x.data() + out_rows[(size_t)m] * P.hidden, P.norm_w, P.eps, P.hidden, outp + m * P.hidden);
      }
    }
    mark(P_HEAD);
  }
  return out;
}

}  // namespace fused
}  // namespace scl
