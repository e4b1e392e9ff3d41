"""Draw one DecisionFlow's trace as a waterfall picture, from the spans an OTLP receiver got.

    python -m tests.support.trace_waterfall --db trading.db --out docs/trace-waterfall.png

``dirk traces export`` sends the journal's spans (the kernel's own, as a live kernel
exports them) over OTLP/HTTP to the suite's receiver (tests/support/otlp_receiver.py),
which prints each span it got; the picture is an HTML waterfall of one trace (a row
per span, indented under its parent, a bar from its start to its end) screenshotted
by the system's chromium through Playwright. It stands in for a Jaeger or Phoenix
screenshot, which needs a server this project does not run. The flow drawn is the one
with the most spans among those a human approved and that then executed (else the one
with the most spans), unless ``--dfid`` names one.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from tests.support import ROOT
from tests.support.otlp import otlp_receiver

Span = dict[str, Any]
"""A span as the receiver prints it (trace_id, span_id, parent_span_id, name, start, end...)."""

WIDTH = 1200
"""The picture's width in CSS pixels."""


async def received_spans(db: str) -> list[Span]:
    """Every span ``dirk traces export`` sends for the journal ``db``, as the receiver got it."""
    async with otlp_receiver() as receiver:
        env = dict(os.environ)
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_SERVICE_NAME="trading-desk",
        )
        command = [sys.executable, "-m", "kernel", "traces", "export", "--db", db, "--json"]
        wanted: list[int] = []  # how many spans the export sent, once it says
        all_in = anyio.Event()
        async with anyio.create_task_group() as tg:

            async def read_on() -> None:
                # The receiver prints as it receives: read on, or its pipe fills and it stalls.
                while True:
                    await receiver.next()
                    if wanted and len(receiver.items) >= wanted[0]:
                        all_in.set()

            tg.start_soon(read_on)
            done = await anyio.run_process(command, env=env, cwd=ROOT, check=False)
            if done.returncode != 0:
                raise SystemExit(done.stderr.decode(errors="replace"))
            wanted.append(json.loads(done.stdout)["spans"])
            if len(receiver.items) >= wanted[0]:
                all_in.set()
            with anyio.fail_after(60):
                await all_in.wait()
            tg.cancel_scope.cancel()
        return receiver.spans()


def flow_spans(spans: Sequence[Span], dfid: str | None) -> list[Span]:
    """The spans of ``dfid``'s trace (or of the flow chosen as the module says)."""
    traces: dict[str, list[Span]] = {}
    for span in spans:
        traces.setdefault(span["trace_id"], []).append(span)
    if dfid is not None:
        wanted = [t for t in traces.values() if any(_dfid(s) == dfid for s in t)]
        if not wanted:
            raise SystemExit(f"no flow {dfid} with spans in the journal")
        return wanted[0]

    def rank(trace: list[Span]) -> tuple[bool, bool, int]:
        # A flow a human approved and that then executed shows every stage once.
        names = {s["name"].split()[0] for s in trace}
        return ({"escalation", "execute_tool"} <= names, "child" not in names, len(trace))

    return max(traces.values(), key=rank)


def _dfid(span: Span) -> str:
    return str(span["attributes"].get("dir.dfid", ""))


def page(spans: list[Span]) -> str:
    """The waterfall as one HTML page."""
    ordered = sorted(spans, key=lambda s: (s["start"], s["name"]))
    by_id = {s["span_id"]: s for s in ordered}

    def depth(span: Span) -> int:
        level, parent = 0, span["parent_span_id"]
        while parent in by_id:
            level, parent = level + 1, by_id[parent]["parent_span_id"]
        return level

    start = min(s["start"] for s in ordered)
    total = max(max(s["end"] for s in ordered) - start, 1)
    root = next((s for s in ordered if depth(s) == 0), ordered[0])
    rows = []
    for span in ordered:
        left = 100 * (span["start"] - start) / total
        width = max(100 * (span["end"] - span["start"]) / total, 0.3)
        error = span["status_code"] == 2  # STATUS_CODE_ERROR
        colour = "#d9534f" if error else "#4a7fd0" if depth(span) else "#2e5a9c"
        attributes = span["attributes"]
        note = attributes.get("dir.reason_code") or attributes.get("dir.status") or ""
        rows.append(
            f'<div class="row"><div class="name" style="padding-left:{12 * depth(span)}px">'
            f"{html.escape(span['name'])}</div>"
            f'<div class="lane"><div class="bar" style="left:{left:.3f}%;width:{width:.3f}%;'
            f'background:{colour}"></div><span class="dur" style="left:{min(left, 80):.3f}%">'
            f"{_duration(span['end'] - span['start'])}"
            f"{' · ' + html.escape(str(note)) if note else ''}</span></div></div>"
        )
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
<h1>{html.escape(root["name"])}</h1>
<div class="sub">trace {root["trace_id"]} · service {html.escape(str(root["service_name"]))} ·
{len(ordered)} spans · {_duration(total)} · as an OTLP receiver got them from
dirk traces export, drawn as a waterfall</div>
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


def screenshot(document: str, out: Path, chromium: str) -> None:
    """Render ``document`` in ``chromium`` and save it as a PNG at ``out``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium)
        try:
            view = browser.new_page(viewport={"width": WIDTH, "height": 80})
            view.set_content(document)
            view.screenshot(path=str(out), full_page=True)
        finally:
            browser.close()


def draw(db: str, out: Path, chromium: str, dfid: str | None = None) -> list[Span]:
    """Draw the waterfall of one flow of ``db`` into ``out``; return its spans."""
    spans = flow_spans(anyio.run(received_spans, db), dfid)
    screenshot(page(spans), out, chromium)
    return spans


def main(argv: Sequence[str] | None = None) -> int:
    """Draw the waterfall; return the exit status."""
    import shutil

    parser = argparse.ArgumentParser(prog="python -m tests.support.trace_waterfall")
    parser.add_argument("--db", required=True, help="the journal (e.g. the trading example's)")
    parser.add_argument("--out", required=True, type=Path, help="the PNG to write")
    parser.add_argument("--dfid", help="the flow to draw (default: see the module's doc)")
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium on PATH (apt-get install chromium)")
    spans = draw(args.db, args.out, chromium, args.dfid)
    print(f"{args.out}: {len(spans)} spans", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
