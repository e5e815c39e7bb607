"""Prometheus: an exporter (``prometheus_client``, ``pip install 'goodtrace[prometheus]'``).

One HTTP endpoint per host by default (local rank 0), bound to 127.0.0.1 unless told otherwise
(``address=``, ``prometheus:ADDRESS:PORT``, or ``GOODTRACE_PROMETHEUS_ADDRESS``), serving the
latest live line as gauges: step time and its overhead split, goodput (``scope="attempt"`` /
``"job"``), the attempt's time so far per bucket, throughput, the cross-rank metric
aggregates, and per rank of this host its step time and its lateness at the log interval's last
sync point. Each line replaces the previous one's values: a figure the line does not know
(no FLOPs: no MFU) is absent, not 0; an overhead category of an earlier log interval with no time in
this one reads 0. A busy port is replaced by the next free one (named in a warning and in
``bound_port``). At ``finish()`` the summary (the job's goodput so far and this attempt's time
per bucket, from the figures the job holds: no reading of the run) is set and, when the
endpoint has been scraped during the run, it stays up until the next scrape has read the
summary (at most ``linger_s``; the program's exit waits for it). A private registry: the
program's own metrics are untouched.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from typing import Any

from goodtrace.record.errors import warn
from goodtrace.record.live.line import LiveLine
from goodtrace.record.live.sink_hub import FIRST_ON_HOST, SinkError, SinkRun
from goodtrace.record.threads import Thread
from goodtrace.sinks._base import ScalarSink, held_summary

DEFAULT_PORT = 9464
DEFAULT_ADDRESS = "127.0.0.1"
ADDRESS_ENV = "GOODTRACE_PROMETHEUS_ADDRESS"
_PORT_TRIES = 16  # a busy port: the next ones, then any free one

Labels = tuple[tuple[str, str], ...]

# name -> (help, label names)
GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "goodtrace_step": ("the step of the latest live line", ()),
    "goodtrace_step_seconds": ("step time (sync point to sync point), mean over the log interval", ()),
    "goodtrace_train_seconds": ("productive part of the step time", ()),
    "goodtrace_overhead_seconds": ("overhead per step in the interval, by category", ("category",)),
    "goodtrace_goodput_ratio": ("goodput so far: this attempt, or the whole job", ("scope",)),
    "goodtrace_attempt_seconds": ("this attempt's time so far: elapsed, productive, each overhead", ("bucket",)),
    "goodtrace_tokens_per_second": ("tokens per second over the log interval (all ranks)", ()),
    "goodtrace_tflops_per_second": ("model TFLOP/s over the log interval (all ranks)", ()),
    "goodtrace_mfu_ratio": ("model FLOPs utilisation over the log interval", ()),
    "goodtrace_metric": ("metrics recorded with gt.metric, across ranks", ("name", "stat")),
    "goodtrace_ranks": ("ranks whose values the latest live line reduced", ()),
    "goodtrace_slowest_rank": ("the rank latest at the log interval's last sync point", ()),
    "goodtrace_rank_step_seconds": ("each rank's step time over the log interval", ("rank",)),
    "goodtrace_rank_lateness_seconds": ("how late each rank reached the log interval's last sync point", ("rank",)),
    "goodtrace_summary_goodput_ratio": ("the job's goodput at finish, from the attempts' own figures", ()),
    "goodtrace_summary_bucket_seconds": (
        "at finish: the job's time and productive time so far (job_total, job_productive), and this "
        "attempt's elapsed, productive and overhead seconds (goodtrace report has every bucket)", ("bucket",)),
}


def line_samples(line: LiveLine, categories: set[str]) -> dict[str, dict[Labels, float]]:
    """The gauges' samples for one live line; ``categories``: overhead categories seen so far
    (updated), which read 0 in a log interval without them."""
    out: dict[str, dict[Labels, float]] = {name: {} for name in GAUGES}

    def put(gauge: str, value: float | None, **labels: str) -> None:
        if value is not None:
            out[gauge][tuple(labels.items())] = float(value)

    put("goodtrace_step", line.step)
    put("goodtrace_step_seconds", line.step_time_s)
    put("goodtrace_train_seconds", line.train_s)
    categories.update(line.overhead_s)
    for category in sorted(categories):
        put("goodtrace_overhead_seconds", line.overhead_s.get(category, 0.0), category=category)
    put("goodtrace_goodput_ratio", line.goodput, scope="attempt")
    put("goodtrace_goodput_ratio", line.job_goodput, scope="job")
    put("goodtrace_attempt_seconds", line.elapsed_s, bucket="elapsed")
    put("goodtrace_attempt_seconds", line.productive_s, bucket="productive")
    for category, seconds in line.overhead_total_s.items():
        put("goodtrace_attempt_seconds", seconds, bucket=category)
    put("goodtrace_tokens_per_second", line.tokens_per_s)
    put("goodtrace_tflops_per_second", line.tflops_per_s)
    put("goodtrace_mfu_ratio", line.mfu)
    for name, summary in line.metrics.items():
        for stat in ("value", "mean", "min", "max"):
            put("goodtrace_metric", getattr(summary, stat), name=name, stat=stat)
    put("goodtrace_ranks", line.ranks)
    put("goodtrace_slowest_rank", line.slowest_rank)
    for rank in line.host_ranks:
        if rank < len(line.rank_step_s):
            put("goodtrace_rank_step_seconds", line.rank_step_s[rank], rank=str(rank))
        if rank < len(line.rank_lateness_s):
            put("goodtrace_rank_lateness_seconds", line.rank_lateness_s[rank], rank=str(rank))
    return out


class _Collector:
    """Builds the gauges from the current samples at each scrape; counts the scrapes, and those
    that read the run's summary."""

    def __init__(self) -> None:
        self.samples: dict[str, dict[Labels, float]] = {}
        self.scrapes = 0
        self.summary_scrapes = 0
        self.scraped = threading.Condition()

    def describe(self) -> list[Any]:
        return []  # registering must not count as a scrape

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        samples = self.samples  # replaced whole by each line: one consistent set per scrape
        for name, (text, label_names) in GAUGES.items():
            family = GaugeMetricFamily(name, text, labels=label_names)
            for labels, value in samples.get(name, {}).items():
                family.add_metric([v for _, v in labels], value)
            yield family
        with self.scraped:
            self.scrapes += 1
            self.summary_scrapes += bool(samples.get("goodtrace_summary_bucket_seconds"))
            self.scraped.notify_all()


class PrometheusSink(ScalarSink):
    """Serve goodtrace's live numbers for Prometheus to scrape at ``http://ADDRESS:PORT/metrics``."""

    name = "prometheus"

    def __init__(self, port: int = DEFAULT_PORT, *, address: str | None = None, all_ranks: bool = False,
                 summary: bool = True, linger_s: float = 60.0) -> None:
        super().__init__(ranks="all" if all_ranks else FIRST_ON_HOST, summary=summary)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise SinkError(f"prometheus: port must be an int between 0 and 65535, got {port!r}")
        if isinstance(linger_s, bool) or not isinstance(linger_s, (int, float)) or not 0 <= linger_s <= 3600:
            raise SinkError(f"prometheus: linger_s must be seconds between 0 and 3600, got {linger_s!r}")
        self.port = port
        self.address = (address or os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS).strip("[]")
        self.linger_s = float(linger_s)
        self.bound_port: int | None = None  # the port actually served (port=0 picks a free one)
        self._server: Any = None
        self._thread: Any = None
        self._collector = _Collector()
        self._categories: set[str] = set()

    @classmethod
    def from_spec(cls, argument: str | None) -> PrometheusSink:
        """``prometheus``, ``prometheus:PORT`` or ``prometheus:ADDRESS:PORT`` (``[::]:PORT``)."""
        if not argument:
            return cls()
        address, _, port = argument.rpartition(":")
        try:
            number = int(port)
        except ValueError:
            raise SinkError(f"prometheus: expected PORT or ADDRESS:PORT, got {argument!r}") from None
        return cls(number, address=address or None)

    def start(self, run: SinkRun) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry(auto_describe=True)
        registry.register(self._collector)
        wanted = self.port + (run.local_rank if self.ranks == "all" and self.port else 0)
        candidates = [wanted + i for i in range(_PORT_TRIES) if wanted + i <= 65535] if wanted else []
        for port in [*candidates, 0]:
            try:
                self._server, self._thread = start_http_server(port, addr=self.address, registry=registry)
                break
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or port == 0:
                    raise SinkError(f"prometheus: cannot serve on {self.address}:{port}: {exc}") from None
        self.bound_port = int(self._server.server_port)
        if wanted and self.bound_port != wanted:
            warn(f"prometheus: port {wanted} is busy; serving http://{_host(self.address)}:{self.bound_port}/metrics")

    def write(self, line: LiveLine) -> None:
        self._collector.samples = line_samples(self.with_job_goodput(line), self._categories)

    def close(self, finished: bool) -> None:
        try:
            self.end_attempt(finished)
            if finished and self.write_summary and self.run is not None and self.run.rank == 0:
                _, numbers, _ = held_summary(self.run, self.last_line)
                samples = dict(self._collector.samples)
                goodput = numbers.get("goodtrace/summary/goodput")
                samples["goodtrace_summary_goodput_ratio"] = {} if goodput is None else {(): goodput}
                prefix = "goodtrace/summary/attempt/"
                buckets = {"job_total": numbers.get("goodtrace/summary/total_s"),
                           "job_productive": numbers.get("goodtrace/summary/productive_s")} | {
                    name[len(prefix):].removesuffix("_s"): value for name, value in numbers.items()
                    if name.startswith(prefix) and name.endswith("_s")}
                samples["goodtrace_summary_bucket_seconds"] = {
                    (("bucket", bucket),): value for bucket, value in buckets.items() if value is not None}
                self._collector.samples = samples
                if self._collector.scrapes and self.linger_s > 0:
                    self._linger()
                    return
        except BaseException:
            self.shutdown()
            raise
        self.shutdown()

    def _linger(self) -> None:
        """Keep serving until the next scrape has read the summary, or ``linger_s``: on a thread
        the interpreter waits for at exit (not a daemon), so ``finish()`` is not held up."""
        collector = self._collector

        def wait_then_stop() -> None:
            with collector.scraped:
                collector.scraped.wait_for(lambda: collector.summary_scrapes > 0, self.linger_s)
            self.shutdown()

        Thread(target=wait_then_stop, name="goodtrace-prometheus-linger", daemon=False).start()

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address
