"""The accuracy records of lab stores, without their per-problem outcomes: label, solved, problems, new_tokens,
generation_s, gen_tok_s, the completions' fingerprint, and the store they came from.

    .venv/bin/python export_accuracy.py <store folder> [<store folder> ...] > accuracy-records.json
"""
import json
import os
import sys

out = []
for folder in sys.argv[1:]:
    os.environ["SCL_DATA_DIR"] = folder
    from engine.measure.store import Store

    for r in Store().list_runs(1000, kind="accuracy"):
        a = r.metrics["accuracy"]
        out.append({"store": folder, "label": r.label, "created_at": r.created_at,
                    **{k: a.get(k) for k in ("solved", "problems", "new_tokens", "generation_s", "gen_tok_s",
                                             "completions_fingerprint")}})
print(json.dumps(out, indent=1))
