#!/usr/bin/env bash
# The peers benchmark on a GPU box, with random-init weights of real shapes (no hub there).
#
#   make gpu-assets                                  # here, once: copies the tokenizer to bench/.gpu-assets
#   OUT=/some/dir bash bench/gpu_peers.sh            # there; device tool: carry ["bench/.gpu-assets"] (+ ".whl")
#
# Measures, one system per fresh process, same prompt ids (128 random tokens), greedy, 128 new
# tokens, one warm-up and 3 timed repetitions:
#   - transformers bf16 and fp16, and with prompt lookup;
#   - transformers + bitsandbytes int8 and NF4 (bitsandbytes is not in the GPU image: carry its
#     wheel in .whl/, see /work/.library/device/README.md; without it the rows say "not installed");
#   - our engine at bf16, fp16, int8, int4 (CUDA kernels) and fp8, and with an int4 self-draft;
#   - A/B rows (1.5B shape): ours bf16 and int4 again with SCL_CUDA_GRAPH=1, plain decode steps
#     replayed from a CUDA graph (engine/ops/cuda_graph.py: ragged decode-attention and fused
#     RMSNorm+residual kernels), labelled "(cuda graph)"; NO_AB=1 skips them.
# The 8B shape runs the essentials only (transformers bf16 and NF4; ours bf16, int8, int4, fp8).
# Not yet run on a GPU: the estimate is 7-9 minutes in all, most of it loading the 8B (give the
# device call timeout_s 600, and REPS=2 or NO_AB=1 if it runs long).
# Shapes: SHAPES (default: the default target's shape, then an 8B-class shape). llama.cpp is not
# run there: it needs the GGUF's trained weights. Results: $OUT/peers.{md,csv,json} (+html if plotly).
# If torch sees no GPU the script writes that to $OUT/peers.md and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
SHAPES="${SHAPES:-qwen2.5-coder-1.5b,llama-3.1-8b}"
TOKENS="${TOKENS:-128}"
REPS="${REPS:-3}"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export SCL_TOKENIZER_DIR="${SCL_TOKENIZER_DIR:-$PWD/bench/.gpu-assets/tokenizer}"
export SCL_CACHE_DIR="${SCL_CACHE_DIR:-/tmp/scl-cache}"
export SCL_KERNEL_CACHE="${SCL_KERNEL_CACHE:-/tmp/scl_kernel_cache}"
export PYTHONUNBUFFERED=1
(nvidia-smi || true) > "$OUT/nvidia_smi.txt" 2>&1
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "# Peers on GPU: not run, torch sees no CUDA GPU on $(hostname) ($(date -u +%F))" > "$OUT/peers.md"
  cat "$OUT/peers.md"
  exit 0
fi
"$PY" bench/peers.py --device cuda --random-init "$SHAPES" --max-new-tokens "$TOKENS" --reps "$REPS" \
  --timeout 600 --out "$OUT" ${NO_AB:+--no-ab} 2>&1 | tee "$OUT/peers.log"
