import sys, time
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/bench")
import argparse
from under_load import vllm_client
from engine.peers import servers
from engine.infer import catalog
tok = catalog.resolve("default")
arms = [("none", "none", "fixed"), ("adaptive", "model", "adaptive")]
import contextlib
with contextlib.ExitStack() as st:
    run = []
    for name, draft, pol in arms:
        spec = servers.ServerSpec.of(servers.OURS, model="default", precision="int4", draft=draft, draft_model="default-draft",
                                     draft_precision="int4", gamma=4, spec_policy=pol, slots=16, max_model_len=1024,
                                     startup_timeout_s=900).validate()
        rs = st.enter_context(servers.start(spec))
        vllm_client(rs.url, spec.served_name, tok, argparse.Namespace(input_len=128, output_len=64, prompts=1, concurrency=1), 1)
        run.append((name, spec, rs))
    c = int(sys.argv[1])
    for rep in range(3):
        for name, spec, rs in (run if rep % 2 == 0 else run[::-1]):
            v = vllm_client(rs.url, spec.served_name, tok, argparse.Namespace(input_len=128, output_len=64, prompts=max(8, 2*c), concurrency=c), 100 + rep)
            print(rep, name, round(v["output_throughput"], 1), round(v["median_tpot_ms"], 1), round(v["median_ttft_ms"], 1), flush=True)
