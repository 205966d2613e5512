"""Peer systems (transformers, bitsandbytes, llama.cpp, and our engine the same way), each measured in a fresh process.

peer.py is one peer measurement (its config, whether it can run here, spawning it, its record);
matrix.py says which peers to measure; workers.py is the subprocess side; report.py compares peers.
"""
from engine.peers.matrix import available_systems, dashboard_peer_configs, default_peer_configs
from engine.peers.peer import (DRAFTS, HF_PRECISIONS, LLAMA_PRECISIONS, OURS, SYSTEMS, PeerConfig, measure,
                               token_agreement, unavailable_reason)
from engine.peers.report import peer_figure, peer_rows, reference, targets

__all__ = ["DRAFTS", "HF_PRECISIONS", "LLAMA_PRECISIONS", "OURS", "SYSTEMS", "PeerConfig", "available_systems",
           "dashboard_peer_configs", "default_peer_configs", "unavailable_reason", "peer_figure", "peer_rows",
           "reference", "targets", "measure", "token_agreement"]
