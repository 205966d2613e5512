"""A load test from several machines: Ray actors as load clients, each sending its share to the same endpoint.

One client process (or machine) caps the load it can send: its CPU parses every streamed chunk.
With `--ray ADDRESS --clients N`, N actors (spread over the nodes) each run the lab's own client
(engine/load/client.py) on a share of the load point; the driver concatenates their raw samples
(engine.load.merge: raw samples, never percentiles) and turns them into the one `load` record of
that point exactly as for one client (engine/load/run.py). How a point is shared:

- concurrent:N: N streams dealt over the clients (k = min(clients, N)); request j goes to the
  owner of stream j mod N;
- throughput: request j to client j mod k; each sends its share at once;
- constant:R: request j to client j mod k at rate R/k, client i starting i/R later, so the merged
  send times are j/R, as one client would send them;
- poisson:R: each client Poisson at R/k with its own seed: the merged arrivals are Poisson at R
  (a superposition of Poisson processes), though not the one sequence a single client would draw;
- synchronous: one request at a time is one client's job (client 0).

Clients start together at a wall-clock instant the driver picks (START_DELAY_S ahead); each shifts
its samples' times by how late it actually started, so every sample is on one time axis. Across
machines that axis is as good as their clocks' agreement (NTP: about a millisecond).
"""
from __future__ import annotations

import time
from dataclasses import replace

from engine.cluster.connect import connect
from engine.common.errors import UserError
from engine.load import client, merge
from engine.load.profiles import Profile

START_DELAY_S = 1.0
START_TIMEOUT_S = 120.0  # actors the cluster cannot place (too few free cores) would otherwise wait for ever
MAX_CLIENTS = 256


def split(profile: Profile, reqs: list, n: int) -> list[tuple[int, Profile, list, float]]:
    """(client index, its profile, its requests, its start offset in seconds) for every client with work."""
    if profile.kind == "synchronous" or n == 1:
        return [(0, profile, list(reqs), 0.0)]
    if profile.kind == "concurrent":
        k = min(n, profile.streams)
        streams = [profile.streams // k + (1 if i < profile.streams % k else 0) for i in range(k)]
        owner = [i for i in range(k) for _ in range(streams[i])]
        shares = [[r for j, r in enumerate(reqs) if owner[j % profile.streams] == i] for i in range(k)]
        return [(i, replace(profile, streams=streams[i]), shares[i], 0.0) for i in range(k) if shares[i]]
    k = min(n, len(reqs))
    shares = [reqs[i::k] for i in range(k)]
    if profile.kind == "throughput":
        return [(i, profile, shares[i], 0.0) for i in range(k)]
    if profile.kind == "constant":
        return [(i, replace(profile, rate=profile.rate / k), shares[i], i / profile.rate) for i in range(k)]
    if profile.kind == "poisson":
        return [(i, replace(profile, rate=profile.rate / k, seed=profile.seed * MAX_CLIENTS + i), shares[i], 0.0)
                for i in range(k)]
    raise UserError(f"a {profile.kind} profile is several load points", "run it through engine.load.run_sweep_profile")


class LoadClient:
    """A Ray actor: the lab's load client on one node."""

    def __init__(self, index: int):
        self.index = index

    def node(self) -> dict:
        from engine.cluster.tasks import node_facts

        return {"client": self.index, **node_facts()}

    def run(self, ep, reqs, profile, limits, sampling, start_at: float, offset_s: float = 0.0) -> list[dict]:
        """Wait for the common start (plus this client's offset), send this share, and return its raw
        samples on the common time axis (seconds since `start_at`)."""
        time.sleep(max(0.0, start_at + offset_s - time.time()))
        shift = time.time() - start_at  # the offset, and however late this client woke
        samples = client.run_point(ep, reqs, profile, limits, sampling)
        for s in samples:
            s["t_send_s"] += shift
            s["t_end_s"] += shift
            s["client"] = self.index
        return samples


class RaySender:
    """Sends a load point through N actors; called by engine.load.run.run_point in place of client.run_point."""

    def __init__(self, address: str, clients: int):
        if not isinstance(clients, int) or not 1 <= clients <= MAX_CLIENTS:
            raise UserError(f"{clients} load clients is out of range", f"use --clients 1 to {MAX_CLIENTS}")
        self.ray = connect(address)
        actor = self.ray.remote(LoadClient).options(num_cpus=1, scheduling_strategy="SPREAD")
        self.actors = [actor.remote(i) for i in range(clients)]
        try:
            self.nodes = self._get([a.node.remote() for a in self.actors], "starting the load clients",
                                   START_TIMEOUT_S)
        except UserError:
            self.close()
            raise
        self.facts: dict = {"count": clients, "nodes": self.nodes}

    def _get(self, refs, what: str, timeout_s: float):
        try:
            return self.ray.get(refs, timeout=timeout_s)
        except self.ray.exceptions.RayError as e:
            raise UserError(f"a load client failed while {what} ({type(e).__name__}: "
                            f"{(str(e).strip().splitlines() or [''])[0][:200]})",
                            "check the Ray cluster's nodes (ray status) and run the load test again") from None

    def __call__(self, ep, reqs, profile: Profile, limits, sampling) -> list[dict]:
        shares = split(profile, reqs, len(self.actors))
        start_at = time.time() + START_DELAY_S
        refs = []
        for i, p, share, offset in shares:
            lim = replace(limits, requests=len(share), warmup=0, max_seconds=max(1.0, limits.max_seconds - offset))
            refs.append(self.actors[i].run.remote(ep, share, p, lim, sampling, start_at, offset))
        # A client's loop stops by itself (limits); the margin covers its start and the samples' way back.
        results = self._get(refs, f"sending {profile.label}",
                            START_DELAY_S + limits.max_seconds + limits.request_timeout_s + 60)
        self.facts = {"count": len(self.actors), "nodes": self.nodes,
                      "shares": [{"client": i, "profile": p.label, "requests": len(s)} for i, p, s, _ in shares]}
        return sorted(merge(*results), key=lambda s: s["t_send_s"])

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        self.actors = []


def load_sender(address: str, clients: int = 1) -> RaySender:
    """The `send` that engine.load.run takes: `clients` Ray actors on the cluster at `address`."""
    return RaySender(address, clients)
