"""Storage servers for the storage benchmark and tests, really started on this machine.

* :class:`EmulatedNFS`: a network filesystem emulated in user space. One FUSE server process
  (Debian ``fuse3`` + the ``mfusepy`` binding), shared by every client process, stores into a
  local directory and adds one round trip to every operation the kernel forwards (lookup and
  getattr, create and open, write, flush, fsync, release, readdir, mkdir, unlink, rename,
  statfs) while holding one of ``slots`` server slots, so N clients contend for the server as
  they do for an NFS server's threads. Attribute and entry caching are off (every stat and path
  lookup is a round trip, as on NFS with ``actimeo=0``). A control socket answers ``stats``
  (operation counts), ``reset``, ``freeze`` (every later operation waits until ``thaw``) and
  ``thaw``.
* :class:`S3Server`: an S3-compatible object store, moto in server mode on 127.0.0.1, in its
  own process, counting the requests it serves by method (``requests``) and by operation
  (``operations``: LIST, GET of an object, HEAD, PUT, ...) and the bytes in and out
  (``GET /_stats``, ``POST /_reset``).

Both are context managers that start the server, wait until it answers, and on exit stop it
and leave no mount or process behind. ``fuse_unavailable()`` / ``s3_unavailable()`` say why
one cannot run here (None when it can). Run as a script, this file is the server itself:
``storage_servers.py nfs SERVE_DIR MOUNTPOINT --rtt-ms R --slots K --control SOCKET`` or
``storage_servers.py s3 PORTFILE [--latency-ms L]``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

_HERE = os.path.abspath(__file__)


# ------------------------------------------------------------------------------ clients


def fuse_unavailable() -> str | None:
    """Why an emulated NFS cannot be mounted here, or None when it can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (no FUSE in this kernel or container)"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is missing: install Debian's fuse3 (.ci/system-deps does)"
    try:
        import mfusepy  # noqa: F401
    except Exception as exc:  # ImportError, or OSError when libfuse3 is missing
        return f"the mfusepy binding cannot load ({exc}): install the test extra and Debian's fuse3"
    return _probe_mount()


_probe_result: list[str | None] = []


def _probe_mount() -> str | None:
    """Mount once for real (cached): a container may have /dev/fuse but forbid mounting."""
    if _probe_result:
        return _probe_result[0]
    reason: str | None = None
    try:
        with tempfile.TemporaryDirectory() as tmp, EmulatedNFS(tmp, rtt_ms=0.0, start_timeout_s=20):
            pass
    except Exception as exc:
        reason = f"mounting a FUSE filesystem is not permitted here: {exc}"
    _probe_result.append(reason)
    return reason


class EmulatedNFS:
    """Mount an emulated network filesystem under ``workdir``; ``.mountpoint`` is its root."""

    def __init__(self, workdir: str, *, rtt_ms: float = 0.5, slots: int = 8, start_timeout_s: float = 30) -> None:
        self.workdir = workdir
        self.rtt_ms = rtt_ms
        self.slots = slots
        self.start_timeout_s = start_timeout_s
        self.serve_dir = os.path.join(workdir, "served")
        self.mountpoint = os.path.join(workdir, "mnt")
        self.control = os.path.join(workdir, "control.sock")
        self.process: subprocess.Popen[bytes] | None = None
        self._log = os.path.join(workdir, "server.log")

    def __enter__(self) -> EmulatedNFS:
        os.makedirs(self.serve_dir, exist_ok=True)
        os.makedirs(self.mountpoint, exist_ok=True)
        with open(self._log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, _HERE, "nfs", self.serve_dir, self.mountpoint, "--rtt-ms", str(self.rtt_ms),
                 "--slots", str(self.slots), "--control", self.control],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + self.start_timeout_s
        while not (os.path.ismount(self.mountpoint) and os.path.exists(self.control)):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self._stop()
                with open(self._log, "rb") as log:
                    raise RuntimeError(f"the FUSE server did not mount: {log.read().decode(errors='replace')[-500:]}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def command(self, text: str) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(10)
            conn.connect(self.control)
            conn.sendall(text.encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                part = conn.recv(65536)
                if not part:
                    break
                data += part
        return dict(json.loads(data))

    def stats(self) -> dict[str, Any]:
        return self.command("stats")

    def freeze(self) -> None:
        self.command("freeze")

    def thaw(self) -> None:
        self.command("thaw")

    def _stop(self) -> None:
        if os.path.exists(self.control):
            with contextlib.suppress(OSError, ValueError):
                self.thaw()  # a frozen server cannot answer the unmount
        if os.path.ismount(self.mountpoint):
            done = subprocess.run(["fusermount3", "-u", self.mountpoint], capture_output=True, check=False)
            if done.returncode != 0:  # busy: detach it now, it goes when its last user does
                subprocess.run(["fusermount3", "-u", "-z", self.mountpoint], capture_output=True, check=False)
        if self.process is not None:
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
            self.process = None


def s3_unavailable() -> str | None:
    """Why the S3-compatible server cannot run here, or None when it can."""
    for module in ("moto", "s3fs", "werkzeug"):
        try:
            __import__(module)
        except Exception as exc:
            return f"{module} is not installed ({exc}): install the test extra"
    return None


def s3_server(tmp_path_factory: Any, name: str) -> Iterator[S3Server]:
    """The body of a fixture that yields a local S3 server in a new folder ``name`` of
    ``tmp_path_factory``, or skips the tests with the reason it cannot start."""
    import pytest

    reason = s3_unavailable()
    if reason:
        pytest.skip(reason)
    with S3Server(str(tmp_path_factory.mktemp(name))) as server:
        yield server


class S3Server:
    """moto in server mode on 127.0.0.1 with one bucket; ``.env`` points s3fs/botocore at it.
    ``latency_ms`` delays every request by that much before it is served (requests are served
    concurrently, as a real store's are), standing for a store's time to first byte."""

    def __init__(self, workdir: str, bucket: str = "goodtrace", start_timeout_s: float = 60,
                 latency_ms: float = 0.0) -> None:
        self.workdir = workdir
        self.bucket = bucket
        self.start_timeout_s = start_timeout_s
        self.latency_ms = latency_ms
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """Environment for a client process (botocore reads the endpoint from AWS_ENDPOINT_URL)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
        }

    def __enter__(self) -> S3Server:
        portfile = os.path.join(self.workdir, "s3.port")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(portfile)
        with open(os.path.join(self.workdir, "s3.log"), "wb") as log:
            self.process = subprocess.Popen([sys.executable, _HERE, "s3", portfile, "--latency-ms", str(self.latency_ms)],
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while not os.path.exists(portfile):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self._stop()
                raise RuntimeError("the S3 server did not start")
            time.sleep(0.05)
        with open(portfile) as handle:
            self.port = int(handle.read())
        request = urllib.request.Request(f"{self.endpoint}/{self.bucket}", method="PUT")
        urllib.request.urlopen(request, timeout=30).read()  # create the bucket
        self.reset()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.endpoint}/_stats", timeout=30) as answer:
            return dict(json.load(answer))

    def reset(self) -> None:
        request = urllib.request.Request(f"{self.endpoint}/_reset", method="POST")
        urllib.request.urlopen(request, timeout=30).read()

    def _stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
            self.process = None


# ------------------------------------------------------------------------------ servers


def _serve_nfs(args: argparse.Namespace) -> None:
    import mfusepy as fuse

    def wrap(func: Any, *a: Any, **k: Any) -> int:
        try:
            func(*a, **k)
        except OSError as exc:
            raise fuse.FuseOSError(exc.errno) from None
        return 0

    class LatencyPassthrough(fuse.Operations):  # type: ignore[misc]
        use_ns = True

        def __init__(self, root: str, rtt_s: float, slots: int) -> None:
            self.root = os.path.realpath(root)
            self.rtt_s = rtt_s
            self.slots = threading.BoundedSemaphore(slots)
            self.thawed = threading.Event()
            self.thawed.set()
            self.counts: collections.Counter[str] = collections.Counter()
            self.bytes_written = 0
            self.mutex = threading.Lock()
            self.started = time.monotonic()

        def _trip(self, op: str) -> None:
            """One round trip, holding a server slot; waits while the server is frozen."""
            self.thawed.wait()
            with self.mutex:
                self.counts[op] += 1
            if self.rtt_s > 0:
                with self.slots:
                    time.sleep(self.rtt_s)

        def _full(self, path: str) -> str:
            return os.path.join(self.root, path.lstrip("/"))

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            self._trip("getattr")
            try:
                st = os.fstat(fh) if fh is not None else os.lstat(self._full(path))
            except OSError as exc:
                raise fuse.FuseOSError(exc.errno) from None
            out = {key: getattr(st, key) for key in ("st_gid", "st_mode", "st_nlink", "st_size", "st_uid")}
            for key in ("st_atime", "st_ctime", "st_mtime"):  # in ns (use_ns), as NFS carries them
                out[key] = getattr(st, key + "_ns")
            return out

        def access(self, path: str, amode: int) -> int:
            self._trip("access")
            if not os.access(self._full(path), amode):
                raise fuse.FuseOSError(errno.EACCES)
            return 0

        def readdir(self, path: str, fh: int) -> Any:
            self._trip("readdir")
            return [".", "..", *os.listdir(self._full(path))]

        def mkdir(self, path: str, mode: int) -> int:
            self._trip("mkdir")
            return wrap(os.mkdir, self._full(path), mode)

        def rmdir(self, path: str) -> int:
            self._trip("rmdir")
            return wrap(os.rmdir, self._full(path))

        def unlink(self, path: str) -> int:
            self._trip("unlink")
            return wrap(os.unlink, self._full(path))

        def rename(self, old: str, new: str) -> int:
            self._trip("rename")
            return wrap(os.rename, self._full(old), self._full(new))

        def chmod(self, path: str, mode: int) -> int:
            self._trip("setattr")
            return wrap(os.chmod, self._full(path), mode)

        def utimens(self, path: str, times: Any = None) -> int:
            self._trip("setattr")
            return wrap(os.utime, self._full(path), ns=times) if times else wrap(os.utime, self._full(path))

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            self._trip("setattr")
            return wrap(os.ftruncate, fh, length) if fh is not None else wrap(os.truncate, self._full(path), length)

        def statfs(self, path: str) -> dict[str, Any]:
            self._trip("statfs")
            st = os.statvfs(self._full(path))
            return {key: getattr(st, key) for key in (
                "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag",
                "f_frsize", "f_namemax")}

        def open(self, path: str, flags: int) -> int:
            self._trip("open")
            try:
                return os.open(self._full(path), flags & ~os.O_APPEND)  # the kernel sends offsets
            except OSError as exc:
                raise fuse.FuseOSError(exc.errno) from None

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            self._trip("create")
            try:
                return os.open(self._full(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            except OSError as exc:
                raise fuse.FuseOSError(exc.errno) from None

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            self._trip("read")
            return os.pread(fh, size, offset)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            self._trip("write")
            with self.mutex:
                self.bytes_written += len(data)
            try:
                return os.pwrite(fh, data, offset)
            except OSError as exc:
                raise fuse.FuseOSError(exc.errno) from None

        def flush(self, path: str, fh: int) -> int:
            self._trip("flush")
            return 0

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            self._trip("fsync")
            return 0

        def release(self, path: str, fh: int) -> int:
            self._trip("release")
            os.close(fh)
            return 0

    ops = LatencyPassthrough(args.serve_dir, args.rtt_ms / 1000, args.slots)

    def control() -> None:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(args.control)
        server.bind(args.control + ".tmp")
        server.listen(16)
        os.rename(args.control + ".tmp", args.control)  # exists only once it answers
        while True:
            conn, _ = server.accept()
            with conn:
                command = conn.recv(256).decode().strip()
                answer: dict[str, Any] = {"ok": True}
                if command == "stats":
                    with ops.mutex:
                        answer = {"ops": dict(ops.counts), "bytes_written": ops.bytes_written,
                                  "seconds": time.monotonic() - ops.started}
                elif command == "reset":
                    with ops.mutex:
                        ops.counts.clear()
                        ops.bytes_written = 0
                        ops.started = time.monotonic()
                elif command == "freeze":
                    ops.thawed.clear()
                elif command == "thaw":
                    ops.thawed.set()
                else:
                    answer = {"error": f"unknown command {command!r}"}
                conn.sendall(json.dumps(answer).encode() + b"\n")

    threading.Thread(target=control, daemon=True).start()
    fuse.FUSE(ops, args.mountpoint, foreground=True, nothreads=False, attr_timeout=0, entry_timeout=0,
              negative_timeout=0, fsname="goodtrace-emulated-nfs")


def _serve_s3(args: argparse.Namespace) -> None:
    from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    backend = DomainDispatcherApplication(create_backend_app)
    latency_s = args.latency_ms / 1000
    lock = threading.Lock()
    counts: collections.Counter[str] = collections.Counter()
    operations: collections.Counter[str] = collections.Counter()
    totals = {"bytes_in": 0, "bytes_out": 0, "started": time.monotonic()}

    def operation(method: str, path: str) -> str:
        """LIST (a bucket-level GET: ListObjects), GET (an object), or the method."""
        if method == "GET":
            return "GET" if "/" in path.strip("/") else "LIST"
        return method

    def counted(body: Any) -> Any:
        try:
            for part in body:
                with lock:
                    totals["bytes_out"] += len(part)
                yield part
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO", "")
        if path in ("/_stats", "/_reset"):
            with lock:
                if path == "/_reset":
                    counts.clear()
                    operations.clear()
                    totals.update(bytes_in=0, bytes_out=0, started=time.monotonic())
                body = json.dumps({"requests": dict(counts), "operations": dict(operations),
                                   "bytes_in": totals["bytes_in"], "bytes_out": totals["bytes_out"],
                                   "seconds": time.monotonic() - totals["started"]}).encode()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        method = environ.get("REQUEST_METHOD", "?")
        if latency_s > 0:
            time.sleep(latency_s)
        with lock:
            counts[method] += 1
            operations[operation(method, path)] += 1
            totals["bytes_in"] += int(environ.get("CONTENT_LENGTH") or 0)
        return counted(backend(environ, start_response))

    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with open(args.portfile + ".tmp", "w") as handle:
        handle.write(str(server.server_address[1]))
    os.replace(args.portfile + ".tmp", args.portfile)
    server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description="storage servers for goodtrace's benchmarks and tests")
    sub = parser.add_subparsers(dest="what", required=True)
    nfs = sub.add_parser("nfs", help="an emulated network filesystem (FUSE) with a round trip per operation")
    nfs.add_argument("serve_dir")
    nfs.add_argument("mountpoint")
    nfs.add_argument("--rtt-ms", type=float, default=0.5)
    nfs.add_argument("--slots", type=int, default=8)
    nfs.add_argument("--control", required=True)
    s3 = sub.add_parser("s3", help="moto's S3 on 127.0.0.1, counting requests")
    s3.add_argument("portfile")
    s3.add_argument("--latency-ms", type=float, default=0.0)
    args = parser.parse_args()
    if args.what == "nfs":
        _serve_nfs(args)
    else:
        _serve_s3(args)


if __name__ == "__main__":
    main()
