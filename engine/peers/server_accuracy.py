"""HumanEval pass@1 of a server the lab starts (llama-server's Q4_K_M of a catalog model), as a work item."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServerAccuracyItem:
    """A work item (engine.measure.runner.run_many): the server started for this item (its slots = the batch),
    scored on the same problems, stops and sandbox as our setups (engine.measure.accuracy.evaluate_endpoint),
    stopped by PID after it. Skipped with the reason where the server cannot start here."""
    spec: object  # engine.peers.servers.ServerSpec
    options: dict  # evaluate_endpoint's keywords: subset, ids, max_new_tokens, usd_per_hour, limits

    @property
    def label(self) -> str:
        return f"{self.spec.system} {self.spec.setup.precision}"

    def measure(self, pool=None, store=None, progress=None):
        from engine.infer.catalog import canonical_name
        from engine.measure import accuracy
        from engine.measure.runner import Skipped
        from engine.peers import servers

        why = servers.unavailable_reason(self.spec)
        if why:
            return Skipped(self.label, f"unavailable: {why}")
        st = self.spec.setup
        with servers.start(self.spec, progress=progress) as rs:
            return accuracy.evaluate_endpoint(rs.url, self.label, canonical_name(st.model), st.precision,
                                              self.spec.served_name, server=rs.facts(), concurrency=self.spec.slots,
                                              store=store, progress=progress, **self.options)
