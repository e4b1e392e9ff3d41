"""Draw one DecisionFlow's trace as a waterfall picture, from the spans the kernel exports.

    python -m examples.trace_waterfall --db trading.db --out docs/trace-waterfall.png

The spans are the kernel's own (kernel.telemetry.export_flows, the same as
``dirk traces export`` sends to an OTLP receiver), taken by the SDK's in-memory
exporter; the picture is an HTML waterfall (one row per span, indented under its
parent, a bar from its start to its end) screenshotted by chromium through Playwright
(``executable_path``: a chromium the machine has). It stands in for a Jaeger or Phoenix
screenshot, which needs a server this project does not run. The flow drawn is the one
with the most spans among those that a human approved and that then executed (else the
one with the most spans), unless ``--dfid`` names one.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kernel.audit import Event, open_journal
from kernel.telemetry import export_flows

WIDTH = 1200
"""The picture's width in CSS pixels."""


async def _events(db: str) -> list[Event]:
    events: list[Event] = []
    async with open_journal(db, readonly=True) as journal:
        async for batch in journal.scan():
            events.extend(batch)
    return events


def flow_spans(events: Sequence[Event], dfid: str | None) -> list[ReadableSpan]:
    """The spans of ``dfid``'s trace (or of the flow chosen as the module says)."""
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    export_flows(events, processor, env={})
    processor.shutdown()
    traces: dict[int, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        if span.context is not None:
            traces.setdefault(span.context.trace_id, []).append(span)
    if dfid is not None:
        wanted = [t for t in traces.values() if any(_dfid(s) == dfid for s in t)]
        if not wanted:
            raise SystemExit(f"no flow {dfid} with spans in the journal")
        return wanted[0]

    def rank(spans: list[ReadableSpan]) -> tuple[bool, bool, int]:
        # A flow a human approved and that then executed shows every stage once.
        names = {s.name.split()[0] for s in spans}
        return ({"escalation", "execute_tool"} <= names, "child" not in names, len(spans))

    return max(traces.values(), key=rank)


def _dfid(span: ReadableSpan) -> str:
    attributes = span.attributes or {}
    return str(attributes.get("dir.dfid", ""))


def page(spans: list[ReadableSpan]) -> str:
    """The waterfall as one HTML page."""
    ordered = sorted(spans, key=lambda s: (s.start_time or 0, s.name))
    by_id = {s.context.span_id: s for s in ordered if s.context is not None}

    def depth(span: ReadableSpan) -> int:
        level, parent = 0, span.parent
        while parent is not None and parent.span_id in by_id:
            level, parent = level + 1, by_id[parent.span_id].parent
        return level

    start = min(s.start_time or 0 for s in ordered)
    end = max(s.end_time or 0 for s in ordered)
    total = max(end - start, 1)
    root = next((s for s in ordered if depth(s) == 0), ordered[0])
    rows = []
    for span in ordered:
        left = 100 * ((span.start_time or 0) - start) / total
        width = max(100 * ((span.end_time or 0) - (span.start_time or 0)) / total, 0.3)
        status = span.status.status_code.name
        colour = {"ERROR": "#d9534f"}.get(status, "#4a7fd0" if depth(span) else "#2e5a9c")
        attributes = span.attributes or {}
        note = attributes.get("dir.reason_code") or attributes.get("dir.status") or ""
        rows.append(
            f'<div class="row"><div class="name" style="padding-left:{12 * depth(span)}px">'
            f"{html.escape(span.name)}</div>"
            f'<div class="lane"><div class="bar" style="left:{left:.3f}%;width:{width:.3f}%;'
            f'background:{colour}"></div><span class="dur" style="left:{min(left, 80):.3f}%">'
            f"{_duration((span.end_time or 0) - (span.start_time or 0))}"
            f"{' · ' + html.escape(str(note)) if note else ''}</span></div></div>"
        )
    trace_id = f"{root.context.trace_id:032x}" if root.context is not None else ""
    return f"""<!doctype html><html><head><meta charset="utf-8"><style>
body {{ font: 13px/1.4 system-ui, sans-serif; margin: 16px; width: {WIDTH - 32}px; color: #222; }}
h1 {{ font-size: 15px; margin: 0 0 4px; }} .sub {{ color: #666; margin-bottom: 10px; }}
.row {{ display: flex; border-top: 1px solid #eee; height: 24px; align-items: center; }}
.name {{ width: 330px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }}
.lane {{ position: relative; flex: 1; height: 24px; }}
.bar {{ position: absolute; top: 6px; height: 12px; border-radius: 2px; }}
.dur {{ position: absolute; top: 4px; margin-left: 6px; color: #555; font-size: 11px;
  white-space: nowrap; transform: translateY(10px); }}
</style></head><body>
<h1>{html.escape(root.name)}</h1>
<div class="sub">trace {trace_id} · {len(ordered)} spans · {_duration(total)} · spans exported
by dirk from its journal (kernel.telemetry), drawn as a waterfall</div>
{"".join(rows)}
</body></html>"""


def _duration(ns: int) -> str:
    if ns >= 60 * 10**9:
        return f"{ns / 60e9:.1f} min"
    if ns >= 10**9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 10**6:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e3:.0f} µs"


def screenshot(document: str, out: Path) -> None:
    """Render ``document`` in chromium and save it as a PNG at ``out``."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium on PATH (apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium)
        try:
            view = browser.new_page(viewport={"width": WIDTH, "height": 80})
            view.set_content(document)
            view.screenshot(path=str(out), full_page=True)
        finally:
            browser.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Draw the waterfall; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m examples.trace_waterfall")
    parser.add_argument("--db", required=True, help="the journal (e.g. the trading example's)")
    parser.add_argument("--out", required=True, type=Path, help="the PNG to write")
    parser.add_argument("--dfid", help="the flow to draw (default: see the module's doc)")
    parser.add_argument("--html", type=Path, help="also write the page itself here")
    args = parser.parse_args(argv)
    spans = flow_spans(asyncio.run(_events(args.db)), args.dfid)
    document = page(spans)
    if args.html is not None:
        args.html.write_text(document, encoding="utf-8")
    screenshot(document, args.out)
    print(f"{args.out}: {len(spans)} spans", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
