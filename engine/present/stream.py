"""The speculative playground's token stream: each token coloured by where it came from (escaped HTML)."""
from __future__ import annotations

import html
from typing import Iterable, Sequence

# origin -> (legend text, background colour). Origins come from generate/speculative traces.
ORIGINS: dict[str, tuple[str, str]] = {
    "target": ("target (no draft, or first token)", "#e9ecef"),
    "accepted": ("accepted draft token", "#b7e4c7"),
    "bonus": ("bonus token (all drafts accepted)", "#a5d8ff"),
    "resample": ("resampled by the target after a rejection", "#ffd8a8"),
}


def token_spans_html(pieces: Iterable[tuple[str, str]]) -> str:
    """(text, origin) pairs as escaped <span>s coloured by origin; unknown origins are grey."""
    out = []
    for text, origin in pieces:
        label, colour = ORIGINS.get(origin, (str(origin), "#dee2e6"))
        out.append(f'<span class="tok tok-{html.escape(str(origin))}" title="{html.escape(label)}" '
                   f'style="background:{colour};border-radius:3px;padding:0 1px">{html.escape(str(text))}</span>')
    return ('<div class="scl-stream" style="white-space:pre-wrap;font-family:monospace;line-height:1.7">'
            + "".join(out) + "</div>")


def legend_html() -> str:
    items = [f'<span style="background:{c};border-radius:3px;padding:1px 6px;margin-right:8px">{html.escape(t)}</span>'
             for t, c in ORIGINS.values()]
    return '<div class="scl-legend" style="font-size:0.85em">' + "".join(items) + "</div>"


def origin_counts(trace: Sequence[str]) -> dict[str, int]:
    out = {k: 0 for k in ORIGINS}
    for o in trace:
        out[o] = out.get(o, 0) + 1
    return out
