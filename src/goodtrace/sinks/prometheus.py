"""Prometheus: an exporter (``prometheus_client``, ``pip install 'goodtrace[prometheus]'``).

One HTTP endpoint per host by default (local rank 0), bound to 127.0.0.1 unless told
otherwise, serving the latest live line as gauges: step time and its overhead split, goodput
(``scope="attempt"`` / ``"job"``), the attempt's time so far per bucket, throughput, the
cross-rank metric aggregates, and per rank of this host its step time and its lateness at the
window's last sync point. At ``finish()`` the run's summary (goodput, every bucket) is set
before the endpoint closes. A private registry: the program's own metrics are untouched.
"""

from __future__ import annotations

from typing import Any

from goodtrace.record.live.line import LiveLine
from goodtrace.record.live.sinks import FIRST_ON_HOST, SinkError, SinkRun
from goodtrace.sinks._base import ScalarSink, analyse_run

DEFAULT_PORT = 9464


class PrometheusSink(ScalarSink):
    """Serve goodtrace's live numbers for Prometheus to scrape at ``http://ADDRESS:PORT/metrics``."""

    name = "prometheus"

    def __init__(self, port: int = DEFAULT_PORT, *, address: str = "127.0.0.1", all_ranks: bool = False,
                 summary: bool = True) -> None:
        super().__init__(ranks="all" if all_ranks else FIRST_ON_HOST, summary=summary)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise SinkError(f"prometheus: port must be an int between 0 and 65535, got {port!r}")
        self.port = port
        self.address = address
        self.bound_port: int | None = None  # the port actually served (port=0 picks a free one)
        self._server: Any = None
        self._gauges: dict[str, Any] = {}

    @classmethod
    def from_spec(cls, argument: str | None) -> PrometheusSink:
        """``prometheus``, ``prometheus:PORT`` or ``prometheus:ADDRESS:PORT``."""
        if not argument:
            return cls()
        address, _, port = argument.rpartition(":")
        try:
            number = int(port)
        except ValueError:
            raise SinkError(f"prometheus: expected PORT or ADDRESS:PORT, got {argument!r}") from None
        return cls(number, address=address or "127.0.0.1")

    def start(self, run: SinkRun) -> None:
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        registry = CollectorRegistry(auto_describe=True)

        def gauge(name: str, text: str, labels: tuple[str, ...] = ()) -> None:
            self._gauges[name] = Gauge(name, text, labels, registry=registry)

        gauge("goodtrace_step", "the step of the latest live line")
        gauge("goodtrace_step_seconds", "step time (sync point to sync point), mean over the log window")
        gauge("goodtrace_train_seconds", "productive part of the step time")
        gauge("goodtrace_overhead_seconds", "overhead per step in the log window, by category", ("category",))
        gauge("goodtrace_goodput_ratio", "goodput so far: this attempt, or the whole job", ("scope",))
        gauge("goodtrace_attempt_seconds", "this attempt's time so far: elapsed, productive, each overhead",
              ("bucket",))
        gauge("goodtrace_tokens_per_second", "tokens per second over the log window (all ranks)")
        gauge("goodtrace_tflops_per_second", "model TFLOP/s over the log window (all ranks)")
        gauge("goodtrace_mfu_ratio", "model FLOPs utilisation over the log window")
        gauge("goodtrace_metric", "metrics recorded with gt.metric, across ranks", ("name", "stat"))
        gauge("goodtrace_ranks", "ranks whose values the latest live line reduced")
        gauge("goodtrace_slowest_rank", "the rank latest at the log window's last sync point")
        gauge("goodtrace_rank_step_seconds", "each rank's step time over the log window", ("rank",))
        gauge("goodtrace_rank_lateness_seconds", "how late each rank reached the window's last sync point",
              ("rank",))
        gauge("goodtrace_summary_goodput_ratio", "the finished run's goodput (goodtrace report)")
        gauge("goodtrace_summary_bucket_seconds", "the finished run's time per bucket (goodtrace report)",
              ("bucket",))
        port = self.port + (run.local_rank if self.ranks == "all" and self.port else 0)
        self._server, _ = start_http_server(port, addr=self.address, registry=registry)
        self.bound_port = int(self._server.server_port)

    def write(self, line: LiveLine) -> None:
        line = self.with_job_goodput(line)
        g = self._gauges
        g["goodtrace_step"].set(line.step)
        _set(g["goodtrace_step_seconds"], line.step_time_s)
        _set(g["goodtrace_train_seconds"], line.train_s)
        for category, seconds in line.overhead_s.items():
            g["goodtrace_overhead_seconds"].labels(category=category).set(seconds)
        _set(g["goodtrace_goodput_ratio"].labels(scope="attempt"), line.goodput)
        _set(g["goodtrace_goodput_ratio"].labels(scope="job"), line.job_goodput)
        attempt = g["goodtrace_attempt_seconds"]
        _set(attempt.labels(bucket="elapsed"), line.elapsed_s)
        _set(attempt.labels(bucket="productive"), line.productive_s)
        for category, seconds in line.overhead_total_s.items():
            attempt.labels(bucket=category).set(seconds)
        _set(g["goodtrace_tokens_per_second"], line.tokens_per_s)
        _set(g["goodtrace_tflops_per_second"], line.tflops_per_s)
        _set(g["goodtrace_mfu_ratio"], line.mfu)
        for name, summary in line.metrics.items():
            for stat in ("value", "mean", "min", "max"):
                g["goodtrace_metric"].labels(name=name, stat=stat).set(getattr(summary, stat))
        g["goodtrace_ranks"].set(line.ranks)
        _set(g["goodtrace_slowest_rank"], line.slowest_rank)
        for rank in line.host_ranks:
            if rank < len(line.rank_step_s):
                g["goodtrace_rank_step_seconds"].labels(rank=str(rank)).set(line.rank_step_s[rank])
            if rank < len(line.rank_lateness_s):
                g["goodtrace_rank_lateness_seconds"].labels(rank=str(rank)).set(line.rank_lateness_s[rank])

    def close(self, finished: bool) -> None:
        try:
            if finished and self.write_summary and self.run is not None and self.run.rank == 0:
                p = analyse_run(self.run.run_dir).partition
                self._gauges["goodtrace_summary_goodput_ratio"].set(p.goodput)
                for bucket, ns in p.buckets_ns.items():
                    self._gauges["goodtrace_summary_bucket_seconds"].labels(bucket=bucket).set(ns / 1e9)
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _set(gauge: Any, value: float | None) -> None:
    if value is not None:
        gauge.set(value)
