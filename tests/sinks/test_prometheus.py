"""Prometheus exporter, scraped by a real Prometheus server (Debian's ``prometheus``) started
here on 127.0.0.1; the values are read back through its HTTP query API."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import goodtrace as gt
from helpers.ranks import free_port
from helpers.sinks import CaptureSink, train
from helpers.sinks_expected import expected_summary

pytest.importorskip("prometheus_client")
PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="the prometheus binary is missing (Debian package 'prometheus', see .ci/system-deps)"
)


@pytest.fixture
def prometheus_server(tmp_path: Path) -> Iterator[Any]:
    """A factory: ``start(target_port)`` runs Prometheus scraping 127.0.0.1:target_port every 0.5 s."""
    processes: list[subprocess.Popen[bytes]] = []
    log = (tmp_path / "prometheus.log").open("wb")

    def start(target_port: int) -> str:
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 500ms, evaluation_interval: 500ms}\n"
            "scrape_configs:\n"
            "  - job_name: goodtrace\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{target_port}']}}]\n"
        )
        processes.append(subprocess.Popen(
            [str(PROMETHEUS), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=log,
        ))
        return f"http://127.0.0.1:{port}"

    yield start
    for process in processes:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    log.close()


def query(server: str, expression: str) -> list[dict[str, Any]]:
    url = f"{server}/api/v1/query?{urllib.parse.urlencode({'query': expression})}"
    with urllib.request.urlopen(url, timeout=5) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def _wait_for(predicate: Any, what: str, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _value(server: str, expression: str) -> float | None:
    result = query(server, expression)
    return float(result[0]["value"][1]) if result else None


def _last(server: str, selector: str) -> float | None:
    """The latest sample Prometheus holds of ``selector``. Not the instant query: a scrape that
    fails (the exporter answers slower than the 0.5 s scrape timeout, on a loaded machine) marks
    every series of the target stale, and an instant query then finds none of them."""
    return _value(server, f"last_over_time({selector}[5m])")


def _scraped_step(server: str) -> float | None:
    try:
        return _value(server, "goodtrace_step")
    except OSError:  # the server is still starting
        return None


@pytest.mark.processes
def test_prometheus_scrapes_the_latest_live_line(prometheus_server: Any, tmp_path: Path) -> None:
    from goodtrace.sinks.prometheus import PrometheusSink

    capture, sink = CaptureSink(), PrometheusSink(0)  # port 0: a free one, then in sink.bound_port
    gt.init(tmp_path / "run", sinks=[capture, sink])
    try:
        for step in range(1, 12):  # the first line (step 10) is launched when step 11 ends (the lag)
            with gt.step(step):
                time.sleep(0.002)
                gt.metric("loss", 1.0 / step, "mean")
            if step == 5:
                with gt.span("checkpoint"):
                    time.sleep(0.01)
        port = _wait_for(lambda: sink.bound_port, "the exporter to listen")
        (line,) = _wait_for(lambda: capture.lines, "the live line of step 10")
        server = prometheus_server(port)
        _wait_for(lambda: _scraped_step(server) == 10, "Prometheus to scrape step 10")
        (series,) = query(server, "goodtrace_step")
        assert series["metric"]["instance"] == f"127.0.0.1:{port}" and series["metric"]["job"] == "goodtrace"
        expected = {
            "goodtrace_step_seconds": line.step_time_s,
            "goodtrace_train_seconds": line.train_s,
            'goodtrace_goodput_ratio{scope="attempt"}': line.goodput,
            'goodtrace_goodput_ratio{scope="job"}': line.goodput,  # no earlier attempt: the job is this attempt
            'goodtrace_attempt_seconds{bucket="elapsed"}': line.elapsed_s,
            'goodtrace_attempt_seconds{bucket="productive"}': line.productive_s,
            'goodtrace_attempt_seconds{bucket="checkpoint_save"}': line.overhead_total_s["checkpoint_save"],
            'goodtrace_metric{name="loss",stat="value"}': sum(1 / s for s in range(1, 11)) / 10,  # steps 1-10
            'goodtrace_metric{name="loss",stat="max"}': 1.0,
            'goodtrace_rank_step_seconds{rank="0"}': line.step_time_s,
            'goodtrace_rank_lateness_seconds{rank="0"}': 0.0,
            "goodtrace_ranks": 1.0,
        }
        for expression, value in expected.items():
            assert value is not None
            assert _last(server, expression) == pytest.approx(value, rel=1e-9, abs=1e-12), expression
        assert line.overhead_total_s["checkpoint_save"] >= 0.01
        # unknown figures are absent, not 0: no FLOPs (no MFU), no summary before the end
        for absent in ("goodtrace_mfu_ratio", "goodtrace_tflops_per_second", "goodtrace_summary_goodput_ratio"):
            assert query(server, absent) == [], absent

        for step in range(12, 22):  # the log interval of step 20 has no checkpoint
            with gt.step(step):
                time.sleep(0.002)
        _wait_for(lambda: _scraped_step(server) == 20, "Prometheus to scrape step 20")
        assert _last(server, 'goodtrace_overhead_seconds{category="checkpoint_save"}') == 0.0
    finally:
        gt.finish()
    # the endpoint was scraped during the run: it serves the summary until Prometheus read it
    expected_goodput = expected_summary(tmp_path / "run", capture.lines[-1])[0]["goodtrace/summary/goodput"]
    # the endpoint closes right after: the sample stays in Prometheus, marked stale at the next scrape
    goodput = _wait_for(lambda: _last(server, "goodtrace_summary_goodput_ratio"),
                        "the summary to be scraped")
    assert goodput == pytest.approx(expected_goodput, rel=1e-9)
    _wait_for(lambda: _refused(port), "the endpoint to close after the summary was scraped")


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return True
    return False


def test_an_endpoint_nobody_scraped_closes_at_finish(tmp_path: Path) -> None:
    from goodtrace.sinks.prometheus import PrometheusSink

    sink = PrometheusSink(0)
    train(tmp_path / "run", [sink])
    assert sink.bound_port is not None and _refused(sink.bound_port)


@pytest.mark.processes
def test_a_busy_port_is_replaced_by_a_free_one_and_named(prometheus_server: Any, tmp_path: Path) -> None:
    from goodtrace.sinks.prometheus import PrometheusSink

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        taken = busy.getsockname()[1]
        sink = PrometheusSink(taken)
        with pytest.warns(gt.GoodtraceWarning, match=f"port {taken} is busy") as caught:
            gt.init(tmp_path / "run", sinks=[sink])
        try:
            assert sink.bound_port is not None and sink.bound_port != taken
            assert f":{sink.bound_port}/metrics" in str(caught[0].message)
            for step in range(1, 12):
                with gt.step(step):
                    time.sleep(0.002)
            server = prometheus_server(sink.bound_port)
            _wait_for(lambda: _scraped_step(server) == 10, "Prometheus to scrape the replacement port")
        finally:
            gt.finish()


def test_the_address_comes_from_the_spec_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from goodtrace.sinks.prometheus import PrometheusSink

    assert PrometheusSink.from_spec("[::1]:9000").address == "::1"
    assert PrometheusSink.from_spec("0.0.0.0:9000").address == "0.0.0.0"
    monkeypatch.setenv("GOODTRACE_PROMETHEUS_ADDRESS", "0.0.0.0")
    assert PrometheusSink.from_spec("9000").address == "0.0.0.0"
    assert PrometheusSink.from_spec(None).address == "0.0.0.0"
