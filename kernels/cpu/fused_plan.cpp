// Serving Cost Lab -- the fused forward pass's plan: built once per model from its prepared
// weights (make_fused_plan), its workspaces, the phase-timer readout, and the Python binding.
// The step itself is fused_cpu.cpp.
#include "fused_plan.h"

namespace scl {
namespace fused {

IsaFns isa_fns(int64_t isa, bool vnni) {
  if (isa == 2) {
    const bool dp = has_avx512_bf16();
    const Q8Tiles q8 = q8_tiles(isa, vnni);
    return {avx512::int8_tiles, avx512::int4_tiles, q8.int4, q8.int8, avx512::prep_xp, avx512::prep_q8, avx512::rmsnorm,
            avx512::silu_mul, avx512::gelu_tanh_mul, avx512::rope, avx512::attention, avx512::add_inplace, dp ? avx512::dense_rows_dp : avx512::dense_rows,
            dp ? nullptr : static_cast<DenseSplitFn>(avx512::dense_prep_x)};
  }
  if (isa == 1)
    return {avx2::int8_tiles, avx2::int4_tiles, avx2::int4q8_tiles, avx2::int8q8_tiles, avx2::prep_xp, avx2::prep_q8,
            avx2::rmsnorm, avx2::silu_mul, avx2::gelu_tanh_mul, avx2::rope, avx2::attention, avx2::add_inplace,
            avx2::dense_rows, static_cast<DenseSplitFn>(avx2::dense_prep_x)};
  return {scalar::int8_tiles, scalar::int4_tiles, scalar::int4q8_tiles, scalar::int8q8_tiles, scalar::prep_xp,
          scalar::prep_q8, scalar::rmsnorm, scalar::silu_mul, scalar::gelu_tanh_mul, scalar::rope, scalar::attention,
          scalar::add_inplace, scalar::dense_rows, nullptr};
}

const char* const PROF_NAMES[NPROF] = {
    "norm + act prep (qkv input)", "qkv tiles", "K/V write (long segments)",
    "attention (rope, cache write, softmax, o-input prep)", "o tiles + residual",
    "norm + act prep (gate/up input)", "gate/up tiles + silu*up + down-input prep", "down tiles + residual",
    "final norm + head", "barrier wait", "setup (outside the parallel region)"};

namespace {

Lin make_lin(int64_t kind, const torch::Tensor& w, const torch::Tensor& s,
             const c10::optional<torch::Tensor>& bias, int64_t N, int64_t K, int64_t gs,
             std::vector<torch::Tensor>& keep) {
  Lin l;
  if (kind == 0) return l;
  TORCH_CHECK(kind == 4 || kind == 8 || kind == 16, "linear kind must be 4, 8 or 16");
  l.kind = (int)kind;
  l.N = N;
  l.K = K;
  if (kind == 16) {   // a bf16 model's own weight, read in place (fused_bf16.h)
    TORCH_CHECK(w.scalar_type() == torch::kBFloat16 && w.dim() == 2 && w.is_contiguous() && w.size(0) == N &&
                    w.size(1) == K && K % 32 == 0,
                "a bf16 linear's weight must be contiguous bf16 [N, K], K a multiple of 32");
    l.Kp = K;
    l.NT = (N + TILE - 1) / TILE;
    l.w = w.data_ptr();
    keep.push_back(w);
  } else {
    TORCH_CHECK(w.is_contiguous() && s.is_contiguous() && w.dim() == (kind == 8 ? 4 : 3) && w.size(2) == TILE,
                "weights must be in the tiled CPU layout");
    l.NT = w.size(0);
    TORCH_CHECK(N > (l.NT - 1) * TILE && N <= l.NT * TILE, "N inconsistent with tiles");
    if (kind == 4) {
      TORCH_CHECK(w.scalar_type() == torch::kInt32, "int4 w must be int32");
      l.gs = gs;
      l.Kp = w.size(1) * 8;
      l.G = l.Kp / gs;
      TORCH_CHECK(l.Kp % gs == 0 && K <= l.Kp && K > l.Kp - gs, "int4 K / group size inconsistent");
      TORCH_CHECK(s.numel() == l.NT * l.G * 2 * TILE, "int4 sm has the wrong size");
      l.w = w.data_ptr<int32_t>();
      l.s = s.data_ptr();
    } else {
      l.Kp = w.size(1) * 4;
      TORCH_CHECK(w.scalar_type() == torch::kInt8 && w.size(3) == 4 && l.Kp % 32 == 0 && K <= l.Kp &&
                      K > l.Kp - 32, "int8 w must be int8 [NT, Kq/4, 64, 4], Kq = K rounded up to 32");
      TORCH_CHECK(s.scalar_type() == torch::kFloat32 && s.numel() == l.NT * TILE, "int8 scale size");
      l.w = w.data_ptr<int8_t>();
      l.s = s.data_ptr<float>();
    }
    keep.push_back(w);
    keep.push_back(s);
  }
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == torch::kFloat32 && bias->is_contiguous() && bias->numel() == N,
                "bias must be contiguous fp32 [N]");
    l.bias = bias->data_ptr<float>();
    keep.push_back(*bias);
  }
  return l;
}

}  // namespace

void ensure_threads(FusedPlan& P, int64_t nt) {
  if ((int64_t)P.th.size() >= nt) return;
  const int64_t nq = (int64_t)ATT_ROWS * P.G;
  const int64_t gmax = P.gs > 0 ? (std::max(P.I, std::max(P.hidden, P.H * P.D)) + P.gs - 1) / P.gs + 1 : 1;
  // the hidden-wide consumers' prepared rows: int4 pads to whole groups (one group size for all int4)
  const int64_t kph = P.gs > 0 ? (P.hidden + P.gs - 1) / P.gs * P.gs : P.hidden;
  const size_t old = P.th.size();
  P.th.resize((size_t)nt);
  for (size_t i = old; i < P.th.size(); ++i) {
    Thread& t = P.th[i];
    t.xn.assign((size_t)(FUSED_MAX_ROWS * P.hidden), 0.f);
    t.xg.assign((size_t)std::max(FUSED_MAX_ROWS * P.hidden, std::max(P.H * P.D, P.I)), 0.f);
    t.act.init(std::max<int64_t>(32, (kph + 31) / 32 * 32));
    t.xsum.assign((size_t)(FUSED_MAX_ROWS * gmax), 0.f);
    t.q.assign((size_t)(nq * P.D), 0.f);
    t.out.assign((size_t)(nq * P.D), 0.f);
    if (P.bf16) t.bact.init(FUSED_MAX_ROWS, P.hidden);
  }
}


// norms: 6 per layer (input, MLP input, attention output, MLP output, q heads, k heads; an empty
// tensor where the model has none), then the final norm. Gemma's (1 + w) arrives folded.
std::shared_ptr<FusedPlan> make_fused_plan(std::vector<int64_t> dims, double eps, double attn_scale,
                                           double attn_softcap, int64_t act, std::vector<torch::Tensor> inv_freqs,
                                           std::vector<double> rope_scales, std::vector<int64_t> layer_rope,
                                           std::vector<int64_t> windows, std::vector<torch::Tensor> norms,
                                           std::vector<LinSpec> lins, std::vector<torch::Tensor> perms) {
  TORCH_CHECK(dims.size() == 7, "dims = [layers, hidden, heads, kv_heads, head_dim, intermediate, vocab]");
  auto P = std::make_shared<FusedPlan>();
  P->L = dims[0];
  P->hidden = dims[1];
  P->H = dims[2];
  P->KV = dims[3];
  P->D = dims[4];
  P->I = dims[5];
  P->V = dims[6];
  TORCH_CHECK(P->H % P->KV == 0, "heads must be a multiple of kv heads");
  P->G = P->H / P->KV;
  TORCH_CHECK(P->D == 64 || P->D == 96 || P->D == 128 || P->D == 256, "head_dim must be 64, 96, 128 or 256");
  TORCH_CHECK((P->G * P->D) % 32 == 0 && P->I % TILE == 0 && P->hidden % 32 == 0,
              "shape not supported by the fused step");
  TORCH_CHECK(P->G * ATT_ROWS <= FUSED_MAX_Q, "too many q heads per kv head");
  P->eps = (float)eps;
  P->scale = (float)attn_scale;
  TORCH_CHECK(attn_scale > 0 && attn_softcap >= 0, "attention scale must be positive, the soft-cap >= 0");
  P->softcap = (float)attn_softcap;
  TORCH_CHECK(act == 0 || act == 1, "activation: 0 silu, 1 gelu_tanh");
  P->act = (int)act;
  P->nrope = (int64_t)inv_freqs.size();
  TORCH_CHECK(P->nrope >= 1 && (int64_t)rope_scales.size() == P->nrope, "one scale per rotary setting");
  P->inv_freq.assign((size_t)(P->nrope * P->D / 2), 0.f);
  for (int64_t i = 0; i < P->nrope; ++i) {
    const auto& f = inv_freqs[(size_t)i];
    const int64_t n = f.numel();
    TORCH_CHECK(f.scalar_type() == torch::kFloat32 && f.is_contiguous() && n >= 1 && n <= P->D / 2,
                "inv_freq: fp32 [rotated dim / 2], at most head_dim / 2");
    std::memcpy(P->inv_freq.data() + i * P->D / 2, f.data_ptr<float>(), sizeof(float) * (size_t)n);
    P->rope_dim.push_back(2 * n);
    P->rope_scale.push_back((float)rope_scales[(size_t)i]);
  }
  TORCH_CHECK((int64_t)layer_rope.size() == P->L && (int64_t)windows.size() == P->L,
              "one rotary index and one window per layer");
  TORCH_CHECK((int64_t)norms.size() == 6 * P->L + 1, "norms: 6 per layer (empty where absent) + the final one");
  for (size_t i = 0; i < norms.size(); ++i) {
    const auto& n = norms[i];
    if (n.numel() == 0) {
      TORCH_CHECK(i % 6 >= 2 && i + 1 < norms.size(), "the input, MLP-input and final norms are required");
      continue;
    }
    const int64_t want = (i % 6 >= 4 && i + 1 < norms.size()) ? P->D : P->hidden;
    TORCH_CHECK(n.scalar_type() == torch::kFloat32 && n.is_contiguous() && n.numel() == want,
                "norm weights must be fp32 [hidden] ([head_dim] for q/k norms)");
    P->keep.push_back(n);
  }
  auto opt = [&](size_t i) { return norms[i].numel() ? norms[i].data_ptr<float>() : nullptr; };
  TORCH_CHECK((int64_t)lins.size() == 7 * P->L + 1,
              "linears: qkv (or q), k, v, o, gate_up (or gate), up, down per layer (k, v, up absent when "
              "fused), then the head");
  const int64_t Nqkv = (P->H + 2 * P->KV) * P->D;
  TORCH_CHECK(perms.empty() || perms.size() == lins.size(), "perms: none, or one per linear (empty for none)");
  auto mk = [&](const LinSpec& s) {
    Lin l = make_lin(std::get<0>(s), std::get<1>(s), std::get<2>(s), std::get<3>(s), std::get<4>(s),
                     std::get<5>(s), std::get<6>(s), P->keep);
    const size_t i = (size_t)(&s - lins.data());
    if (!perms.empty() && perms[i].numel()) {
      const torch::Tensor& p = perms[i];
      TORCH_CHECK(l.kind == 4, "an input order (act-order) is for int4 linears only");
      TORCH_CHECK(p.scalar_type() == torch::kInt32 && p.is_contiguous() && p.numel() == l.K,
                  "an input order must be contiguous int32 [K]");
      TORCH_CHECK(p.min().item<int32_t>() >= 0 && p.max().item<int32_t>() < l.K, "input order out of range");
      l.perm = p.data_ptr<int32_t>();
      P->keep.push_back(p);
    }
    return l;
  };
  // the linears reading one prepared input gather it in one order (or none)
  auto same_order = [&](size_t a, size_t b) {
    const bool pa = !perms.empty() && perms[a].numel(), pb = !perms.empty() && perms[b].numel();
    return pa == pb && (!pa || torch::equal(perms[a], perms[b]));
  };
  P->layers.resize((size_t)P->L);
  for (int64_t l = 0; l < P->L; ++l) {
    LayerW& lw = P->layers[(size_t)l];
    const size_t n0 = (size_t)(6 * l);
    lw.ln1 = norms[n0].data_ptr<float>();
    lw.ln2 = norms[n0 + 1].data_ptr<float>();
    lw.post_attn = opt(n0 + 2);
    lw.post_mlp = opt(n0 + 3);
    lw.q_norm = opt(n0 + 4);
    lw.k_norm = opt(n0 + 5);
    TORCH_CHECK(!lw.q_norm == !lw.k_norm, "q and k norms come together");
    lw.window = windows[(size_t)l];
    lw.rope = layer_rope[(size_t)l];
    TORCH_CHECK(lw.window >= 0 && lw.rope >= 0 && lw.rope < P->nrope, "window >= 0, rotary index in range");
    const LinSpec* ls = lins.data() + 7 * l;
    lw.qkv = mk(ls[0]);
    lw.k = mk(ls[1]);
    lw.v = mk(ls[2]);
    lw.o = mk(ls[3]);
    lw.gu = mk(ls[4]);
    lw.up = mk(ls[5]);
    lw.down = mk(ls[6]);
    const size_t i0 = (size_t)(7 * l);
    TORCH_CHECK(!lw.sep_qkv() || (same_order(i0, i0 + 1) && same_order(i0, i0 + 2)),
                "q, k and v must read their input in one order");
    TORCH_CHECK(!lw.sep_gu() || same_order(i0 + 4, i0 + 5), "gate and up must read their input in one order");
    const int64_t KVD = P->KV * P->D;
    const bool qkv_ok = lw.sep_qkv()
        ? (lw.qkv.kind && lw.qkv.N == P->H * P->D && lw.k.N == KVD && lw.v.kind && lw.v.N == KVD &&
           lw.qkv.K == P->hidden && lw.k.K == P->hidden && lw.v.K == P->hidden)
        : (lw.qkv.kind && lw.qkv.N == Nqkv && lw.qkv.K == P->hidden);
    TORCH_CHECK(qkv_ok, "q/k/v shapes");
    TORCH_CHECK(lw.o.kind && lw.o.N == P->hidden && lw.o.K == P->H * P->D, "o shape");
    const bool gu_ok = lw.sep_gu()
        ? (lw.gu.kind && lw.gu.N == P->I && lw.up.N == P->I && lw.gu.K == P->hidden && lw.up.K == P->hidden)
        : (lw.gu.kind && lw.gu.N == 2 * P->I && lw.gu.K == P->hidden);
    TORCH_CHECK(gu_ok, "gate/up shapes");
    TORCH_CHECK(lw.down.kind && lw.down.N == P->hidden && lw.down.K == P->I, "down shape");
  }
  P->norm_w = norms.back().data_ptr<float>();
  P->head = mk(lins.back());
  TORCH_CHECK(!P->head.kind || (P->head.N == P->V && P->head.K == P->hidden), "head shape");
  // one group size across the int4 linears (each activation buffer has one row stride)
  for (const auto& lw : P->layers)
    for (const Lin* l : std::initializer_list<const Lin*>{&lw.qkv, &lw.k, &lw.v, &lw.o, &lw.gu, &lw.up, &lw.down,
                                                          &P->head})
      if (l->kind == 4) {
        TORCH_CHECK(P->gs == 0 || P->gs == l->gs, "int4 linears must share one group size");
        P->gs = l->gs;
      }
  // Each linear has its own format (int4 or int8, a mixed-precision model layer by layer): every phase
  // prepares its input for the kinds of its consumers.
  const int64_t M = FUSED_MAX_ROWS;
  P->x.assign((size_t)(M * P->hidden), 0.f);
  P->qkv.assign((size_t)(M * Nqkv), 0.f);
  P->attn.assign((size_t)(M * P->H * P->D), 0.f);
  P->gu.assign((size_t)(M * 2 * P->I), 0.f);
  P->h.assign((size_t)(M * P->I), 0.f);
  P->tmp.assign((size_t)(M * P->hidden), 0.f);
  P->cosb.assign((size_t)(P->nrope * M * P->D / 2), 0.f);
  P->sinb.assign((size_t)(P->nrope * M * P->D / 2), 0.f);
  // padded tails of the shared inputs stay zero (prep writes only [0, K))
  auto padded = [&](int64_t k) { return P->gs > 0 ? (k + P->gs - 1) / P->gs * P->gs : (k + 31) / 32 * 32; };
  P->act_o.init(padded(P->H * P->D));
  P->act_d.init(padded(P->I));
  for (const auto& lw : P->layers)
    for (const Lin* l : std::initializer_list<const Lin*>{&lw.qkv, &lw.k, &lw.v, &lw.o, &lw.gu, &lw.up, &lw.down,
                                                          &P->head})
      P->bf16 = P->bf16 || l->kind == 16;
  if (P->bf16) {
    P->bact_o.init(M, P->H * P->D);
    P->bact_d.init(M, P->I);
  }
  P->nctr = 14 * P->L + 4;   // per layer at most 12 phases (q, k, v, K/V write, attention, o's gather, o, ...)
  P->ctr.reset(new std::atomic<int64_t>[(size_t)P->nctr]);
  ensure_threads(*P, std::max(1, omp_get_max_threads()));
  return P;
}

}  // namespace fused

void register_fused(pybind11::module& m) {
  using namespace fused;
  namespace py = pybind11;
  py::class_<FusedPlan, std::shared_ptr<FusedPlan>>(m, "FusedPlan")
      .def_property_readonly("layers", [](const FusedPlan& p) { return p.L; })
      .def_property_readonly("has_head", [](const FusedPlan& p) { return p.head.kind != 0; })
      .def_property_readonly("vocab", [](const FusedPlan& p) { return p.V; })
      .def("workspace_bytes", [](const FusedPlan& p) {
        size_t b = 4 * (p.x.size() + p.qkv.size() + p.attn.size() + p.gu.size() + p.h.size() + p.tmp.size());
        for (const Act* a : {&p.act_o, &p.act_d})
          b += 4 * (a->xp.size() + a->sx.size() + a->fsum.size() + a->bsum.size()) + a->xq.size();
        for (const BAct* a : {&p.bact_o, &p.bact_d}) b += 2 * a->xb.size() + 4 * a->xs.size();
        for (const auto& t : p.th) b += 2 * t.bact.xb.size() + 4 * t.bact.xs.size();
        for (const auto& t : p.th)
          b += 4 * (t.xn.size() + t.xg.size() + t.xsum.size() + t.q.size() + t.out.size() + t.scores.size() +
                    t.act.xp.size() + t.act.sx.size() + t.act.fsum.size() + t.act.bsum.size()) + t.act.xq.size();
        return (int64_t)b;
      });
  m.def("fused_profile", [](FusedPlan& p, bool on, bool reset) {
    std::lock_guard<std::mutex> lock(p.mu);
    py::dict d;
    py::list per_thread;
    for (int64_t t = 0; t < p.prof_threads; ++t) {
      py::dict th;
      for (int c = 0; c < NPROF; ++c) th[PROF_NAMES[c]] = p.prof[(size_t)(t * NPROF + c)];
      per_thread.append(th);
    }
    d["threads"] = per_thread;
    d["steps"] = p.prof_steps;
    if (reset) {
      std::fill(p.prof.begin(), p.prof.end(), 0.0);
      p.prof_steps = 0;
    }
    p.profiling = on;
    return d;
  }, "read the phase timers (seconds per thread and category), then set profiling on/off (and reset)",
        py::arg("plan"), py::arg("on"), py::arg("reset") = true);
  m.def("make_fused_plan", &make_fused_plan, "the fused step's model plan and workspaces (once per model)",
        py::arg("dims"), py::arg("eps"), py::arg("attn_scale"), py::arg("attn_softcap"), py::arg("act"),
        py::arg("inv_freqs"), py::arg("rope_scales"), py::arg("layer_rope"), py::arg("windows"), py::arg("norms"),
        py::arg("linears"), py::arg("perms") = std::vector<torch::Tensor>());
  m.def("fused_step", &fused_step, "one fused forward pass of 1..64 rows", py::arg("plan"), py::arg("x"),
        py::arg("segments"), py::arg("k_cache"), py::arg("v_cache"), py::arg("block_table"), py::arg("k_scale"), py::arg("v_scale"), py::arg("out_rows"), py::arg("isa"),
        py::arg("vnni"), py::arg("act_int8"), py::arg("threads"), py::arg("window_pool") = std::vector<torch::Tensor>(),
        py::call_guard<py::gil_scoped_release>());
  m.def("fused_max_rows", []() { return (int64_t)FUSED_MAX_ROWS; });
}

}  // namespace scl
