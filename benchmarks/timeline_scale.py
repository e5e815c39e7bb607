"""Benchmark: ``goodtrace trace`` and the HTML report on a large synthetic run, and how long
headless Chromium takes to draw the report's gantt chart of 20 steps of every rank.

The run is the report benchmark's synthetic run (``benchmarks/report_scale.py``: every rank a
file written through the real writer's encoder, 10 spans per step, rank 3 slower, checkpoints
and evals), by default at that benchmark's full size, 1,024 ranks x 1,000 steps (about 12.9
million records, 1.5 GB of JSON lines). Timed, each in a fresh process with its peak RSS:

  0. the baseline: ``json.loads`` of every line of the run once (the least any reader pays;
     the ratios ``*_over_decode`` divide by it, so they hold on a noisy shared machine);
  1. ``goodtrace trace RUN -o all.json --limit-mb 0`` and ``-o all.json.gz --limit-mb 0`` (every
     rank, every step);
  2. ``goodtrace trace RUN -o slice.json[.gz] --steps A:B`` (20 steps of every rank);
  3. the HTML report as ``goodtrace report RUN --html FILE --gantt-steps A:B`` makes it: load +
     analyse (DuckDB), read the gantt range's spans of every rank (DuckDB), build the page;
  3b. ``goodtrace report RUN --json``, the reference the timelines are held to: since every view
     draws from the same analysis, the HTML report and a 20-step trace slice should take at most
     twice what it takes (ratios ``*_over_report_json``);
  4. Chromium (Debian's, via Playwright): open the file, time until every chart has drawn
     (ECharts 'finished'), the gantt's own time, and the time from a hover to its tooltip.

Both renderers draw the steps from the analysis and read raw spans for the step intervals they show,
one batch of sessions at a time: peak memory is the analysis plus what is kept (the gantt's
spans), whatever the number of steps. ``--ranks``
and ``--steps`` change the size; ``--quick`` runs 128 ranks x 30 steps
(under a minute); ``--json`` makes the last line one JSON object with every figure and ratio.
``--keep DIR`` writes the run and the outputs there and keeps them (re-using a run already
there of the same size).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _timing import run_measured
from report_scale import goodtrace_cmd, write_rank  # the sibling benchmark: same run

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
GANTT_STEPS = 20


def html_job(run_dir: str, out: str, first: int, last: int) -> None:
    """Runs in its own process (for a clean peak RSS): what ``report --html --gantt-steps`` does."""
    from goodtrace.analysis import analyze
    from goodtrace.read.load import load_run
    from goodtrace.renderers.html import html_page, report_data

    t0 = time.perf_counter()
    loaded = load_run(run_dir)
    t1 = time.perf_counter()
    analysis = analyze(loaded)
    t2 = time.perf_counter()
    data = report_data(analysis, loaded, gantt_steps=(first, last))
    t3 = time.perf_counter()
    text = html_page(data)
    with open(out, "w", encoding="utf-8") as handle:
        handle.write(text)
    t4 = time.perf_counter()
    print(json.dumps({"load_s": round(t1 - t0, 2), "analyse_s": round(t2 - t1, 2),
                      "gantt_spans_s": round(t3 - t2, 2), "page_s": round(t4 - t3, 2),
                      "gantt_spans": len(data["gantt"]["items"]) if data["gantt"] else 0}))


def decode_job(run_dir: str) -> None:
    """The baseline, in its own process: ``json.loads`` of every line of every rank file once,
    the least any reader of the run pays (goodtrace's renderers decode the run twice)."""
    loads = json.loads
    lines = 0
    for path in sorted(Path(run_dir).rglob("*.jsonl")):
        with open(path, "rb") as handle:
            for line in handle:
                loads(line)
                lines += 1
    print(json.dumps({"lines": lines}))


def timed(cmd: list[str]) -> tuple[float, float, str, str]:
    """(seconds, peak RSS MiB, stdout, stderr) of a command in a fresh process."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        seconds, peak, code = run_measured(cmd, env=dict(os.environ, GOODTRACE_PROGRESS="0"), stdout=out, stderr=err)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
        if code != 0:
            raise SystemExit(f"{' '.join(cmd)} failed: {stderr}")
        return seconds, peak, stdout, stderr


JS_BAR = """() => {
  const chart = window.goodtraceCharts.gantt;
  const items = chart.getOption().series[0].data;
  let item = null;
  for (const v of items) if (v[0] === 0 && v[7] === 0 && (!item || v[2] - v[1] > item[2] - item[1])) item = v;
  const p = chart.convertToPixel({seriesIndex: 0}, [(item[1] + item[2]) / 2, item[0]]);
  const box = document.getElementById('gantt').getBoundingClientRect();
  return {x: box.left + p[0], y: box.top + p[1], items: items.length};
}"""


def chromium_render(path: Path) -> dict[str, Any]:
    """Open the report offline in headless Chromium; times in seconds."""
    from playwright.sync_api import sync_playwright

    url = path.resolve().as_uri()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            t0 = time.perf_counter()
            page.goto(url, wait_until="load", timeout=300_000)
            loaded = time.perf_counter() - t0
            page.wait_for_function("() => window.goodtraceReady === true", timeout=300_000, polling=50)
            ready = time.perf_counter() - t0
            timings = page.evaluate("() => window.goodtraceTimings")
            page.evaluate("() => document.getElementById('gantt').scrollIntoView({block: 'start'})")
            bar = page.evaluate(JS_BAR)
            t1 = time.perf_counter()
            page.mouse.move(bar["x"] - 2, bar["y"])
            page.mouse.move(bar["x"], bar["y"])
            page.wait_for_function("() => document.getElementById('gantt').textContent.includes('category:')",
                                   timeout=60_000, polling=20)
            hover = time.perf_counter() - t1
            # A zoom (mouse wheel over the gantt) redraws the visible spans.
            page.evaluate("() => { window.zoomed = false; "
                          "window.goodtraceCharts.gantt.on('finished', () => { window.zoomed = true; }); }")
            t2 = time.perf_counter()
            page.mouse.wheel(0, -400)
            page.wait_for_function("() => window.zoomed === true", timeout=120_000, polling=20)
            zoom = time.perf_counter() - t2
        finally:
            browser.close()
    return {"load_event_s": round(loaded, 2), "all_charts_drawn_s": round(ready, 2),
            "gantt_drawn_after_script_start_s": round(timings["gantt"] / 1e3, 2),
            "script_start_s": round(timings["start"] / 1e3, 2),
            "hover_to_tooltip_s": round(hover, 3), "zoom_redraw_s": round(zoom, 3),
            "gantt_items": bar["items"], "page_errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    parser.add_argument("--ranks", type=int, help="ranks (default 1,024; --quick: 128)")
    parser.add_argument("--steps", type=int, help="steps per rank (default 1,000; --quick: 30)")
    parser.add_argument("--keep", metavar="DIR", help="write the run and outputs here and keep them")
    parser.add_argument("--html-job", nargs=4, metavar=("RUN", "OUT", "FIRST", "LAST"), help=argparse.SUPPRESS)
    parser.add_argument("--decode-job", metavar="RUN", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.decode_job:
        decode_job(args.decode_job)
        return
    if args.html_job:
        run_dir, out, first, last = args.html_job
        html_job(run_dir, out, int(first), int(last))
        return
    ranks = args.ranks or (128 if args.quick else 1024)
    steps = args.steps or (30 if args.quick else 1000)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="goodtrace-timeline-"))
    run_dir = root / "run"
    first = max(0, steps // 2 - GANTT_STEPS // 2)
    last = min(steps - 1, first + GANTT_STEPS - 1)
    figures: dict[str, Any] = {"ranks": ranks, "steps": steps, "spans_per_step": 10, "quick": args.quick,
                               "cpus": os.cpu_count(), "gantt_steps": [first, last]}
    try:
        marker = root / "run-size.json"
        t0 = time.perf_counter()
        if args.keep and marker.exists() and json.loads(marker.read_text())[:2] == [ranks, steps]:
            records = json.loads(marker.read_text())[2]
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
            records = sum(write_rank(run_dir, r, ranks, steps, 10, seed=1) for r in range(ranks))
            marker.write_text(json.dumps([ranks, steps, records]))
        figures.update(generate_s=round(time.perf_counter() - t0, 2), records=records,
                       jsonl_bytes=sum(p.stat().st_size for p in run_dir.rglob("*.jsonl")))
        print(f"run: {records:,} records ({figures['jsonl_bytes'] / 1e6:.0f} MB) for {ranks} ranks x "
              f"{steps} steps", flush=True)

        seconds, peak, _, _ = timed([sys.executable, __file__, "--decode-job", str(run_dir)])
        figures["baseline_decode"] = {"s": round(seconds, 2), "peak_mib": round(peak)}
        print(f"baseline: json.loads of every line once: {seconds:.2f} s, peak {peak:.0f} MiB", flush=True)

        seconds, peak, _, _ = timed(goodtrace_cmd("report", str(run_dir), "--json", "--no-steps"))
        figures["report_json"] = {"s": round(seconds, 2), "peak_mib": round(peak)}
        print(f"report --json: {seconds:.2f} s, peak {peak:.0f} MiB", flush=True)

        every_step = ["--limit-mb", "0"]  # else a run past 1,200 MB of trace is written as a slice
        for label, name, extra in (("trace_all", "all.json", every_step), ("trace_all_gz", "all.json.gz", every_step),
                                   ("trace_slice", "slice.json.gz", ["--steps", f"{first}:{last}"]),
                                   ("trace_slice_plain", "slice.json", ["--steps", f"{first}:{last}"])):
            out = root / name
            seconds, peak, _, err = timed(goodtrace_cmd("trace", str(run_dir), "-o", str(out), *extra))
            figures[label] = {"s": round(seconds, 2), "peak_mib": round(peak), "bytes": out.stat().st_size,
                              "perfetto_size_warning": "Perfetto UI opens up to about" in err}
            print(f"{label}: {seconds:.2f} s, peak {peak:.0f} MiB, {out.stat().st_size / 1e6:.1f} MB"
                  + (" (warned: above what the Perfetto UI opens comfortably)"
                     if figures[label]["perfetto_size_warning"] else ""), flush=True)
            if name == "all.json" and not args.keep:
                out.unlink()  # 1.6 GB at full size: only its size is needed from here on

        html = root / "report.html"
        seconds, peak, out_text, _ = timed([sys.executable, __file__, "--html-job", str(run_dir), str(html),
                                            str(first), str(last)])
        figures["html"] = {"s": round(seconds, 2), "peak_mib": round(peak), "bytes": html.stat().st_size,
                           **json.loads(out_text.strip().splitlines()[-1])}
        print(f"html report: {seconds:.2f} s, peak {peak:.0f} MiB, {html.stat().st_size / 1e6:.1f} MB "
              f"({figures['html']})", flush=True)
        if os.path.exists(CHROMIUM):
            figures["chromium"] = chromium_render(html)
            print(f"chromium: {figures['chromium']}", flush=True)
        spans = ranks * steps * 10
        gantt_spans = figures["html"]["gantt_spans"] or 1
        decode_s = figures["baseline_decode"]["s"] or 0.01
        report_s = figures["report_json"]["s"] or 0.01
        figures["ratios"] = {
            "html_over_report_json": round(figures["html"]["s"] / report_s, 2),
            "trace_slice_over_report_json": round(figures["trace_slice"]["s"] / report_s, 2),
            "trace_all_over_report_json": round(figures["trace_all"]["s"] / report_s, 2),
            "trace_all_over_decode": round(figures["trace_all"]["s"] / decode_s, 2),
            "trace_all_gz_over_decode": round(figures["trace_all_gz"]["s"] / decode_s, 2),
            "trace_slice_over_decode": round(figures["trace_slice"]["s"] / decode_s, 2),
            "html_over_decode": round(figures["html"]["s"] / decode_s, 2),
            "trace_all_bytes_per_jsonl_byte": round(figures["trace_all"]["bytes"] / figures["jsonl_bytes"], 2),
            "trace_all_us_per_span": round(figures["trace_all"]["s"] / spans * 1e6, 2),
            "gz_over_plain": round(figures["trace_all_gz"]["bytes"] / figures["trace_all"]["bytes"], 3),
            "html_bytes_per_gantt_span": round(figures["html"]["bytes"] / gantt_spans, 1),
        }
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
