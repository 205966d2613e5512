"""Suffix decoding: drafts from a suffix tree of the request's own tokens and of earlier requests' outputs.

Training-free, as Arctic Inference's SuffixDecoding (which vLLM ships): every suffix of the token sequences
seen, up to `depth` tokens, sits in a trie whose nodes count how often their path occurred. To draft, the
longest tail of the sequence that the trie holds (m tokens) is found, then the most frequent continuation is
followed while its estimated probability (the product of child count / parent count along the path) stays
at or above `min_prob`, for at most min(gamma, spec_factor * m) tokens: a long match earns a long draft, a
short one a short draft. Two trees are asked, and the draft with the larger expected acceptance (the sum of
its path probabilities) wins:
- the request's own tree: its prompt and everything it generated so far;
- one global tree over the outputs of the last `keep` finished requests (the oldest is taken out as a new one
  comes in).
Drafts are tokens only (no probabilities), so verification is the same as for an n-gram lookup: lossless.
"""
from __future__ import annotations

from collections import deque

# Python nodes (about 100 bytes each), at most keep x output length x depth in the global tree: kept smaller than
# Arctic's C++ tree's defaults (depth 24) so a server's trees stay in the tens of MB.
DEPTH = 16  # longest suffix kept
SPEC_FACTOR = 1.0  # draft at most spec_factor x the match length (Arctic's max_spec_factor)
MIN_PROB = 0.1  # stop the draft once the path's estimated probability falls below this (min_token_prob)
KEEP = 64  # earlier outputs the global tree holds


class Node:
    __slots__ = ("count", "kids")

    def __init__(self):
        self.count = 0
        self.kids: dict[int, Node] = {}


class SuffixTree:
    """Suffixes of the sequences added, to `depth` tokens, counted."""

    def __init__(self, depth: int = DEPTH):
        self.root, self.depth = Node(), depth

    def feed(self, active: list[Node], tokens: list[int], sign: int = 1) -> list[Node]:
        """Count the suffixes that end at each of `tokens`, continuing from `active` (the nodes of the suffixes
        ending at the token before, longest first); returns the new active nodes. sign -1 takes counts out."""
        for t in tokens:
            nxt = []
            for node in active + [self.root]:
                kid = node.kids.get(t)
                if kid is None:
                    if sign < 0:
                        continue
                    kid = node.kids[t] = Node()
                kid.count += sign
                if kid.count <= 0:  # no occurrence left: its subtree has none either
                    del node.kids[t]
                    continue
                nxt.append(kid)
            active = nxt[-(self.depth - 1):]  # a suffix of depth tokens is not extended further
        return active

    def add(self, tokens: list[int], sign: int = 1) -> None:
        self.feed([], tokens, sign)

    def match(self, tail: list[int]) -> tuple[Node | None, int]:
        """The node of the longest suffix of `tail` that the tree has seen continued, and its length."""
        for m in range(min(len(tail), self.depth - 1), 0, -1):
            node = self.root
            for t in tail[-m:]:
                node = node.kids.get(t)
                if node is None:
                    break
            else:
                if node.kids:
                    return node, m
        return None, 0

    def draft(self, tail: list[int], limit: int, spec_factor: float = SPEC_FACTOR,
              min_prob: float = MIN_PROB) -> tuple[list[int], float]:
        """(draft tokens, expected accepted tokens) continuing `tail`. A step's probability is its count over
        its siblings' (the continuations seen), so the request's own latest occurrence, not yet continued,
        does not count against it."""
        node, m = self.match(tail)
        out, score, p = [], 0.0, 1.0
        n = min(limit, int(spec_factor * m))
        while node is not None and node.kids and len(out) < n:
            t, kid = max(node.kids.items(), key=lambda kv: kv[1].count)
            p *= kid.count / sum(k.count for k in node.kids.values())
            if p < min_prob:
                break
            out.append(t)
            score += p
            node = kid
        return out, score


class SuffixProposer:
    """Per slot, a suffix tree of the sequence's tokens (fed as they are committed); one global tree of the
    outputs of the last `keep` finished requests."""

    kind = "suffix"
    has_probs = False  # token drafts: q = 1 on the proposed token, as the n-gram lookup

    def __init__(self, slots: int, depth: int = DEPTH, keep: int = KEEP):
        self.depth, self.keep = depth, keep
        self.trees = [SuffixTree(depth) for _ in range(slots)]
        self.active: list[list[Node]] = [[] for _ in range(slots)]
        self.fed = [0] * slots  # tokens of the slot's sequence in its tree
        self.seqs: list = [None] * slots  # the sequence in each slot (its output joins the global tree at free)
        self.global_tree = SuffixTree(depth)
        self.finished: deque[list[int]] = deque()

    def propose(self, seqs, gs):
        drafts = []
        for s, g in zip(seqs, gs):
            slot = s.slot
            self.active[slot] = self.trees[slot].feed(self.active[slot], s.tokens[self.fed[slot]:])
            self.fed[slot], self.seqs[slot] = len(s.tokens), s
            if g <= 0:
                drafts.append([])
                continue
            tail = s.tokens[-(self.depth - 1):]
            own, other = self.trees[slot].draft(tail, g), self.global_tree.draft(tail, g)
            drafts.append(max(own, other, key=lambda d: d[1])[0])
        return drafts, None

    def prefill(self, chunks) -> None:
        pass  # the prompt is fed at the sequence's first draft

    def rollback(self, seq) -> None:
        pass  # only committed tokens are fed

    def free(self, slot: int) -> None:
        seq = self.seqs[slot]
        out = seq.tokens[seq.n_prompt:] if seq is not None else []
        if out:
            self.global_tree.add(out)
            self.finished.append(out)
            if len(self.finished) > self.keep:
                self.global_tree.add(self.finished.popleft(), sign=-1)
        self.trees[slot], self.active[slot], self.fed[slot], self.seqs[slot] = SuffixTree(self.depth), [], 0, None

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        pass  # dst's tree is fed from its own tokens

    def kv_bytes(self) -> int:
        return 0
