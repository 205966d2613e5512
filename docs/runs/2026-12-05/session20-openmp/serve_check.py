"""Our server at the 0.5B int4 and fp32: single-stream decode tok/s through /v1/completions (64 tokens, 6 requests)."""
import sys, time, httpx
sys.path.insert(0, sys.argv[1])
from engine.peers import servers
from engine.peers.servers import ServerSpec
for prec in sys.argv[2].split(","):
    spec = ServerSpec.of("serving-cost-lab", model="default-draft", precision=prec, slots=1)
    rs = servers.start(spec)
    try:
        body = {"model": rs.facts().get("model") or "default-draft", "prompt": "def quicksort(xs):",
                "max_tokens": 64, "temperature": 0, "ignore_eos": True}
        url = rs.url.rstrip("/") + "/v1/completions"
        for _ in range(2):
            httpx.post(url, json=body, timeout=300)
        rates = []
        for _ in range(6):
            t = time.perf_counter(); r = httpx.post(url, json=body, timeout=300).json()
            rates.append(r["usage"]["completion_tokens"] / (time.perf_counter() - t))
        rates.sort()
        print(f"{prec}: median {rates[3]:.1f} tok/s (request-level, incl. prefill) {[round(x,1) for x in rates]}", flush=True)
    finally:
        rs.stop()
