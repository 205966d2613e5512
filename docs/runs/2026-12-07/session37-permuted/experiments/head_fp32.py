import sys, time
sys.path.insert(0, "/work/main")
from engine.infer.loader import load, load_tokenizer
from engine.measure import quality
from engine.measure.eval_text import eval_docs
from engine.quant.convert import QuantSpec
P = "/root/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0"
docs = eval_docs(load_tokenizer(P), 2048)
ref = quality.load_reference(quality.ensure_reference(P, P, docs), docs)
for spec in [QuantSpec("int4", 32, quantize_head=False)]:
    t = time.time()
    lm = load(P, spec, "cpu")
    r = quality.results(quality.score_model(lm, docs, ref), docs)
    print(spec, {k: r[k] for k in ("kld_mean", "kld_median", "kld_p99", "top1_agreement")}, lm.weight_bytes, round(time.time() - t), flush=True)
    del lm
