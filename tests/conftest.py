"""Shared test setup: ``helpers`` (record builders, the headless browser) importable from every
layer's test folder. Tests are grouped by the package layer they exercise: ``record/``,
``read/``, ``analysis/``, ``renderers/``, ``integrations/``, ``cli/`` (and ``test_layers.py``)."""

from __future__ import annotations

import functools
import json
import multiprocessing.process
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import browser as browser_helpers
from helpers import storage_servers
from helpers.storage_servers import EmulatedNFS, S3Server, fuse_unavailable, s3_unavailable

_TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A local S3 server (moto) for the tests of one module; skipped where it cannot start."""
    reason = s3_unavailable()
    if reason:
        pytest.skip(reason)
    with S3Server(str(tmp_path_factory.mktemp("s3"))) as server:
        yield server


@pytest.fixture(scope="module")
def nfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedNFS]:
    """The emulated NFS (FUSE, 0.5 ms per operation) for one module; skipped where FUSE is not
    permitted."""
    reason = fuse_unavailable()
    if reason:
        pytest.skip(reason)
    with EmulatedNFS(str(tmp_path_factory.mktemp("nfs")), rtt_ms=0.5) as server:
        yield server


# ---------------------------------------------------------------------------------------------
# Markers: every test is a unit test unless it uses one of the slower real parts below; the
# README's command runs them all, ``-m unit`` only the fast ones (see README, "Running parts of
# the suite"). A test is classified by the fixtures it uses (``FIXTURE_MARKS``), by its module
# (``MODULE_MARKS``: modules whose tests start processes, Chromium, ...), by ``TEST_MARKS``, or
# by its own ``pytest.mark``. What a test really did is watched while it runs (``_Watch``): a test
# classified unit that starts a process, a browser, FUSE or the S3 server fails, and one that
# takes longer than UNIT_BUDGET_S is listed at the end, so an unmarked slow test is visible.

PART_MARKS = ("processes", "browser", "fuse", "s3", "slow", "ray")
UNIT_BUDGET_S = 2.0
FIXTURE_MARKS = {"s3": "s3", "nfs": "fuse", "chromium": "browser"}
# Generated from one full run with GOODTRACE_TEST_PROFILE=FILE (each test's seconds and what it
# used, one JSON line per test), then read over; keys are paths under tests/ (and ::test name).
MODULE_MARKS: dict[str, tuple[str, ...]] = {
    "analysis/test_loop_shapes.py": ("processes",),
    "cli/test_demo.py": ("processes",),
    "cli/test_export_cli.py": ("processes",),
    "cli/test_first_hour.py": ("processes",),
    "cli/test_hostile_runs.py": ("processes",),
    "cli/test_report_cli.py": ("processes",),
    "cli/test_symlink_loop.py": ("processes",),
    "cli/test_watch_cli.py": ("processes",),
    "integrations/test_hangs.py": ("processes",),
    "integrations/test_jax_distributed.py": ("processes",),
    "integrations/test_jax_examples.py": ("processes",),
    "integrations/test_live_slowdown.py": ("processes",),  # gloo ranks in spawned processes
    "integrations/test_no_false_alarms.py": ("processes",),
    "integrations/test_stragglers.py": ("processes",),
    "integrations/test_torch_cuda.py": ("processes",),  # goodtrace report in a real process
    "integrations/test_torch_dataloader.py": ("processes",),
    "integrations/test_torch_rollback.py": ("processes",),
    "integrations/test_torchtitan.py": ("processes",),
    "read/test_open_segments.py": ("processes", "slow"),
    "read/test_ray_engine.py": ("processes",),
    "read/test_rank_compact.py": ("processes", "slow"),
    "read/test_segment_cache.py": ("processes",),
    "read/test_torchtitan_logs.py": ("processes",),
    "record/test_hang.py": ("processes",),  # a hang dumps native frames with py-spy, a process
    "record/test_hostile_arguments.py": ("processes",),
    "record/test_ring_file.py": ("processes",),
    "sinks/test_mlflow.py": ("processes",),  # mlflow runs git
    "record/test_live_goodput.py": ("slow",),
}
TEST_MARKS: dict[str, tuple[str, ...]] = {
    "analysis/test_analysis_golden.py::test_startup_and_compile_from_the_first_step": ("slow",),
    "analysis/test_analysis_known_wrong_answers.py::test_an_idle_tail_after_the_last_step_is_not_productive": ("processes",),
    "analysis/test_analysis_properties.py::test_buckets_are_non_negative_and_sum_to_the_job_time": ("slow",),
    "analysis/test_analysis_properties.py::test_interval_goodput_over_tiling_periods_adds_up_to_the_whole": ("slow",),
    "analysis/test_carve_columns.py::test_the_columns_are_the_pieces": ("slow",),
    "analysis/test_over_time.py::test_periods_are_the_clipped_partition_on_any_run": ("slow",),
    "analysis/test_rollbacks.py::test_a_plain_retry_keeps_its_meaning": ("processes",),
    "analysis/test_rollbacks.py::test_a_rollback_that_skips_batches_counts_each_step_once": ("processes",),
    "analysis/test_rollbacks.py::test_a_rollback_then_a_crash_and_a_restart_counts_nothing_twice": ("processes",),
    "analysis/test_rollbacks.py::test_an_in_process_restart_is_disruption_not_the_next_steps_work": ("processes",),
    "analysis/test_rollbacks.py::test_an_inferred_rollback_makes_the_first_pass_wasted_progress": ("processes",),
    "analysis/test_rollbacks.py::test_the_programs_word_names_the_same_rollback": ("processes",),
    "analysis/test_rollbacks.py::test_two_rollbacks_in_one_attempt": ("processes",),
    "analysis/test_rollbacks.py::test_without_the_programs_word_a_skip_is_not_visible": ("processes",),
    "analysis/test_step_marks.py::test_span_medians_and_totals_equal_the_plain_computation": ("slow",),
    "cli/test_fuzz_cli.py::test_every_command_survives_any_run_directory": ("slow",),
    "cli/test_fuzz_cli.py::test_the_seed_run_reads_clean": ("processes",),
    "cli/test_remote_read.py::test_a_url_without_a_run_says_so": ("processes",),
    "cli/test_remote_read.py::test_compacted_run_on_s3_is_read_from_parquet": ("processes",),
    "cli/test_remote_read.py::test_export_from_s3_equals_the_local_export": ("processes",),
    "cli/test_remote_read.py::test_no_credentials_is_one_error_line": ("processes",),
    "cli/test_remote_read.py::test_records_from_s3_equal_the_local_ones": ("processes",),
    "cli/test_remote_read.py::test_report_and_trace_from_a_network_share": ("fuse", "processes"),
    "cli/test_remote_read.py::test_report_and_trace_from_s3_equal_the_local_ones": ("processes", "s3"),
    "cli/test_remote_read.py::test_unreachable_store_is_one_error_line": ("processes",),
    "cli/test_remote_read.py::test_watch_from_s3_shows_what_it_shows_of_the_local_copy": ("processes", "s3"),
    "cli/test_remote_read.py::test_watch_of_many_ranks_from_s3_and_a_network_share_shows_the_local_frame": (
        "fuse", "processes", "s3"),
    "cli/test_time_range_cli.py::test_an_hour_between_attempts_is_the_worst": ("processes",),
    "cli/test_time_range_cli.py::test_bad_time_ranges_are_one_line_errors": ("processes",),
    "cli/test_time_range_cli.py::test_console_names_the_worst_hours": ("processes",),
    "cli/test_time_range_cli.py::test_export_replays_the_steps_in_the_time_range": ("processes",),
    "cli/test_time_range_cli.py::test_html_report_of_a_time_range": ("processes",),
    "cli/test_time_range_cli.py::test_json_has_goodput_per_utc_hour": ("processes",),
    "cli/test_time_range_cli.py::test_records_counts_the_records_in_the_time_range": ("processes",),
    "cli/test_time_range_cli.py::test_since_until_in_seconds_give_the_window_of_the_golden_run": ("processes",),
    "cli/test_time_range_cli.py::test_since_until_restrict_the_step_views": ("processes",),
    "cli/test_time_range_cli.py::test_trace_keeps_the_steps_in_the_time_range": ("processes",),
    "integrations/test_finish_is_local.py::test_a_crashing_rank_finishes_without_waiting_for_its_peers": ("processes",),
    "integrations/test_jax.py::test_init_installs_the_compile_listeners_and_a_value_lookup_does_not": ("processes",),
    "integrations/test_jax.py::test_persistent_cache_hits_and_misses_annotate_the_compile_spans": ("processes",),
    "integrations/test_jax.py::test_step_times_match_ground_truth_and_host_timer_is_wrong": ("slow",),
    # six recorders, each compiling a fresh function: 3.8 s in a CI run
    "integrations/test_jax.py::test_each_recorder_of_a_process_tags_its_first_compiling_step": ("slow",),
    "integrations/test_torch.py::test_import_goodtrace_does_not_import_the_torch_integration": ("processes",),
    "integrations/test_torch_versions.py::test_clock_sync_addresses_peers_by_global_rank_before_torch_2_6": ("processes",),
    "integrations/test_transformers.py::test_goodtrace_s_figures_reach_the_log_history_and_the_reporting_integrations": ("processes",),
    "integrations/test_transformers.py::test_sinks_given_to_the_callback_get_the_trainer_s_live_lines": ("slow",),
    "integrations/test_transformers.py::test_the_trainer_s_steps_evaluations_and_saves_are_in_the_report": ("slow",),
    "read/test_compact_kill.py::test_a_killed_compaction_leaves_its_files_in_the_run_and_the_next_one_removes_them": ("processes",),
    "read/test_detail_columns.py::test_a_report_with_kept_detail_reads_only_the_other_files_and_is_the_cold_one": ("slow",),
    "read/test_engine.py::test_a_small_run_is_read_in_process_unless_workers_are_asked": ("processes",),
    "read/test_engine.py::test_bad_worker_counts_are_clear_errors": ("processes",),
    "read/test_engine.py::test_no_task_reads_more_than_the_cap": ("processes",),
    "read/test_engine.py::test_three_workers_on_uneven_tasks_give_the_same": ("processes",),
    "read/test_engine.py::test_two_workers_give_the_one_process_report": ("processes",),
    "read/test_load.py::test_importing_goodtrace_does_not_import_duckdb_or_rich": ("processes",),
    "read/test_load.py::test_the_run_model_in_memory_and_in_a_database_file_give_the_same_report": ("slow",),
    "read/test_mirror.py::test_one_listing_then_only_new_or_changed_files": ("processes", "s3"),
    "read/test_session_columns.py::test_reports_with_kept_columns_are_the_cold_one_and_a_replaced_file_reads_the_run_again": ("processes",),
    "read/test_sessions.py::test_a_run_read_without_its_records_is_the_run_read_with_them": ("processes",),
    "read/test_sessions.py::test_the_readers_tell_their_progress_a_segment_at_a_time": ("processes",),
    "read/test_sessions.py::test_the_segments_counted_on_the_local_pool_are_the_run_counted_here": ("processes",),
    "record/test_clocksync.py::test_injected_offset_is_measured_within_1ms_and_undone_by_the_reader": ("processes",),
    "record/test_clocksync.py::test_one_rank_per_host_measures_and_its_host_shares_the_result": ("processes",),
    "record/test_completion_dating.py::test_checkpoint_before_complete_on_gives_the_records_of_complete_on_first": ("processes",),
    "record/test_completion_dating.py::test_data_stall_lands_on_the_step_that_waited": ("processes",),
    "record/test_completion_dating.py::test_each_execution_of_a_repeated_step_number_is_timed_on_its_own": ("processes",),
    "record/test_completion_dating.py::test_idle_tail_after_the_last_step_stays_outside_it": ("processes",),
    "record/test_completion_dating.py::test_interpreter_exit_while_the_device_hangs_does_not_wait": ("processes",),
    "record/test_completion_dating.py::test_sigterm_while_the_device_hangs_exits_promptly_with_its_finish_record": ("processes",),
    "record/test_completion_dating.py::test_uncaught_exception_ends_the_session_naming_it": ("processes",),
    "record/test_hang.py::test_a_clean_run_with_checkpoints_and_evals_ten_times_the_step_records_no_hang": ("slow",),
    "record/test_live.py::test_ranks_with_different_metric_names_all_count": ("processes",),
    "record/test_live.py::test_two_gloo_ranks_reduce_by_hand_values_and_never_wait": ("processes",),
    "record/test_native_writer.py::test_a_busy_loop_with_a_system_call_per_step_starves_nothing": ("processes",),
    "record/test_persistence.py::test_hung_storage_never_blocks_the_loop_and_counts_drops": ("slow",),
    "record/test_persistence.py::test_sigkill_mid_run_keeps_every_flushed_record": ("processes",),
    "record/test_persistence.py::test_sigterm_during_finish_waits_for_that_finish": ("processes",),
    "record/test_persistence.py::test_sigterm_records_preemption_and_flushes": ("processes",),
    "record/test_persistence.py::test_storage_that_recovers_gets_the_drop_count": ("slow",),
    "record/test_recording_api.py::test_import_loads_the_standard_library_only": ("processes",),
    "record/test_recording_api.py::test_process_start_comes_from_the_os_and_precedes_init": ("processes",),
    "record/test_recording_api.py::test_records_command_lists_sessions": ("processes",),
    "record/test_speedups.py::test_c_and_python_spans_write_the_same_records": ("processes",),
    "record/test_speedups.py::test_spans_survive_a_gc_callback_that_rebinds_the_hot_path_state": ("processes",),
    "record/test_storage_backends.py::test_a_frozen_fuse_server_stalls_neither_the_loop_nor_finish": ("fuse", "processes"),
    "record/test_storage_backends.py::test_sigkill_on_local_disk": ("processes",),
    "record/test_storage_backends.py::test_sigkill_on_s3": ("processes", "s3"),
    "record/test_storage_backends.py::test_sigkill_on_the_emulated_nfs": ("fuse", "processes"),
    "record/test_writer_faults.py::test_a_deleted_run_directory_is_back_within_two_intervals": ("processes",),
    "record/test_writer_faults.py::test_a_deleted_run_directory_is_recreated_and_the_loss_counted": ("processes",),
    "record/test_writer_faults.py::test_a_disk_full_from_the_start_writes_one_header_per_segment": ("processes",),
    "record/test_writer_faults.py::test_a_full_disk_never_leaves_a_partial_line_and_counts_what_it_lost": ("processes",),
    "record/test_writer_faults.py::test_a_process_killed_in_its_first_second_leaves_its_session": ("processes",),
    "record/test_writer_faults.py::test_buffer_bound_holds_on_every_append_and_every_drop_is_counted": ("processes",),
    "record/test_writer_faults.py::test_sigkill_loses_at_most_one_interval_plus_one_chunk": ("processes",),
    "renderers/test_html.py::test_report_command_writes_the_page": ("processes",),
    "renderers/test_html.py::test_the_gantt_of_a_few_steps_reads_only_the_files_around_them": ("processes",),
    "renderers/test_html.py::test_report_opens_offline_draws_and_hovers": ("browser", "processes"),
    "renderers/test_html_over_time.py::test_chart_draws_and_its_tooltip_names_the_buckets": ("browser", "processes"),
    "renderers/test_perfetto.py::test_cli_not_a_run": ("processes",),
    "renderers/test_perfetto.py::test_cli_user_errors": ("processes",),
    "renderers/test_perfetto.py::test_cli_writes_a_slice": ("processes",),
    "renderers/test_perfetto.py::test_perfetto_ui_loads_a_run_from_the_real_recorder": ("browser", "processes"),
    "renderers/test_perfetto.py::test_perfetto_ui_loads_gzip_and_hostile_names": ("browser", "processes"),
    "renderers/test_perfetto.py::test_perfetto_ui_loads_the_trace": ("browser", "processes"),
    "renderers/test_rollback_views.py::test_the_console_lists_the_rollback_under_the_attempts": ("processes",),
    "renderers/test_rollback_views.py::test_the_html_page_notes_the_rollback": ("browser", "processes"),
    "sinks/test_prometheus.py::test_a_busy_port_is_replaced_by_a_free_one_and_named": ("processes",),
    "sinks/test_prometheus.py::test_prometheus_scrapes_the_latest_live_line": ("processes",),
    "sinks/test_tensorboard.py::test_a_killed_ranks_event_file_has_every_line_sent_a_flush_interval_before": ("processes",),
    "sinks/test_wandb.py::test_a_run_the_program_already_opened_gets_the_numbers_and_stays_open": ("processes",),
    "test_layers.py::test_each_layer_alone_loads_no_higher_layer_and_no_heavy_module": ("processes",),
}


def _module_key(item: pytest.Item) -> str:
    return Path(str(item.fspath)).resolve().relative_to(_TESTS).as_posix()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marks = set(MODULE_MARKS.get(_module_key(item), ()))
        marks |= {mark for name, mark in FIXTURE_MARKS.items() if name in getattr(item, "fixturenames", ())}
        marks.update(TEST_MARKS.get(f"{_module_key(item)}::{item.name.split('[', 1)[0]}", ()))
        for mark in marks:
            item.add_marker(mark)
        if not any(item.get_closest_marker(name) for name in PART_MARKS):
            item.add_marker("unit")


class _Watch:
    """What the running test really used: processes started from its thread, FUSE, S3, Chromium."""

    def __init__(self) -> None:
        self.used: set[str] = set()
        self.detail: list[str] = []
        self.thread: int | None = None

    def saw(self, what: str, detail: str) -> None:
        if threading.get_ident() == self.thread:
            self.used.add(what)
            self.detail.append(detail)


_WATCH = _Watch()
_SLOW_UNITS: list[tuple[str, float]] = []


def _wrap(owner: Any, name: str, what: str, describe: Callable[..., str]) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def watched(*args: Any, **kwargs: Any) -> Any:
        _WATCH.saw(what, describe(*args, **kwargs))
        return original(*args, **kwargs)

    setattr(owner, name, watched)


def pytest_configure(config: pytest.Config) -> None:
    _wrap(subprocess.Popen, "__init__", "processes", lambda self, args, *a, **k: f"process {str(args)[:80]}")
    _wrap(multiprocessing.process.BaseProcess, "start", "processes", lambda self: f"process {self.name}")
    _wrap(storage_servers.EmulatedNFS, "__enter__", "fuse", lambda self: "the emulated NFS (FUSE)")
    _wrap(storage_servers.S3Server, "__enter__", "s3", lambda self: "the S3 server")
    _wrap(browser_helpers, "require_browser", "browser", lambda: "Chromium")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _WATCH.used, _WATCH.detail, _WATCH.thread = set(), [], threading.get_ident()
    started = time.perf_counter()
    yield
    seconds = time.perf_counter() - started
    _WATCH.thread = None
    if item.get_closest_marker("unit") and seconds > UNIT_BUDGET_S:
        _SLOW_UNITS.append((item.nodeid, seconds))
    profile = os.environ.get("GOODTRACE_TEST_PROFILE")
    if profile:
        with open(profile, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"test": item.nodeid, "s": round(seconds, 3), "used": sorted(_WATCH.used),
                                     "marks": sorted(m.name for m in item.iter_markers())}) + "\n")


@pytest.fixture(autouse=True)
def _unit_tests_stay_unit(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test classified unit that starts a process, FUSE, S3 or Chromium is named in the
    summary (mark it), so that `-m unit` stays fast."""
    yield
    if request.node.get_closest_marker("unit") and _WATCH.used:
        _MISMARKED.append(f"{request.node.nodeid} is classified unit but used {'; '.join(sorted(set(_WATCH.detail)))}: "
                          f"mark it ({', '.join(sorted(_WATCH.used))}) in tests/conftest.py or the module")


_MISMARKED: list[str] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _MISMARKED:
        terminalreporter.section("tests classified unit that start processes, FUSE, S3 or Chromium")
        for line in _MISMARKED:
            terminalreporter.write_line(line)
    if _SLOW_UNITS:
        terminalreporter.section("unit tests over the unit budget")
        terminalreporter.write_line(
            f"these tests are classified unit but took over {UNIT_BUDGET_S} s: mark them slow "
            "(tests/conftest.py TEST_MARKS) or make them faster")
        for nodeid, seconds in sorted(_SLOW_UNITS, key=lambda x: -x[1]):
            terminalreporter.write_line(f"  {seconds:6.2f} s  {nodeid}")
