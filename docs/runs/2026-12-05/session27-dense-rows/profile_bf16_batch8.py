"""Where a batch-8 bf16 decode step of the 0.5B goes, by op and input shape (torch profiler, 5 steps).

    SCL_KERNEL_DENSE_M=4 .venv/bin/python docs/runs/2026-12-05/session27-dense-rows/profile_bf16_batch8.py
(M = 8 past the limit: torch's F.linear, as on this machine before the AMX kernel; unset: the AMX kernel)
"""
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from engine.infer.loader import load, make_spec  # noqa: E402
from engine.infer.model import Rows  # noqa: E402

m = load("default-draft", make_spec("bf16"), "cpu").model
B = 8
gen = torch.Generator().manual_seed(0)
lens = [200 + 7 * i for i in range(B)]
cache = m.new_cache(B, max(lens) + 40)
with torch.inference_mode():
    for slot, n in enumerate(lens):
        m.forward_rows(torch.randint(100, 20000, (n,), generator=gen), Rows.of([(slot, 0, n)], "cpu"), cache,
                       logits_at=torch.tensor([n - 1]))

    def step(r):
        rows = Rows.of([(slot, n + r, 1) for slot, n in enumerate(lens)], "cpu")
        m.forward_rows(torch.randint(100, 20000, (B,), generator=gen), rows, cache)

    for r in range(3):
        step(r)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for r in range(3, 8):
            step(r)
print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=12,
                                                         max_name_column_width=30, max_shapes_column_width=60))
