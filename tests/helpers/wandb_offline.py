"""Read a W&B offline run back with wandb's own reader of its transaction log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_offline_run(wandb_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(history rows, final summary) of the one offline run under ``wandb_dir``."""
    import wandb
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    wandb.teardown()  # finish() returns before W&B's service has written the log out; this waits for it

    (path,) = wandb_dir.glob("wandb/offline-run-*/run-*.wandb")
    store = datastore.DataStore()
    store.open_for_scan(str(path))
    try:
        return _records(store, wandb_internal_pb2)
    finally:
        store._fp.close()  # the reader has no close()


def _records(store: Any, wandb_internal_pb2: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    history: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({_key(item): json.loads(item.value_json) for item in record.history.item})
        elif kind == "summary":
            summary.update({_key(item): json.loads(item.value_json) for item in record.summary.update})
    return history, summary


def _key(item: Any) -> str:
    return str(item.key or "/".join(item.nested_key))
