"""``cofr ui``: the MLflow UI on this project's run store."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import IO

from cofrgenet.dataclass_options import at_least
from cofrgenet.errors import UserError
from cofrgenet.folder_lock import FolderLock
from cofrgenet.training import run_store
from cofrgenet.training.run_store import RunConfig, artifact_location, tracking_uri

#: The port without --port, as ``mlflow ui``'s; the next free one when it is in use.
DEFAULT_PORT = 5000
#: Ports tried from DEFAULT_PORT up before giving up.
PORT_TRIES = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runs-dir",
        default="runs",
        help="the runs folder: its mlflow.db is served (default: runs)",
    )
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help="another MLflow store (default: MLFLOW_TRACKING_URI when set, else "
        "<runs-dir>/mlflow.db)",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address the server listens on; 0.0.0.0: every interface (default: 127.0.0.1)",
    )
    parser.add_argument(
        "--port",
        type=tcp_port,
        default=None,
        help=f"1-65535, refused when in use (default: {DEFAULT_PORT}, else the next free port)",
    )
    parser.add_argument(
        "--allowed-hosts",
        metavar="A,B,...",
        default="",
        help="names the server answers to besides loopback, private IP addresses and, "
        "when --host is not loopback, this machine's names (MLflow refuses other Host "
        "headers against DNS rebinding), e.g. mlflow.lab.org,gpu-*.cluster; '*': any",
    )


def tcp_port(text: str) -> int:
    """argparse ``type``: a TCP port one may listen on."""
    port = at_least(int, 1)(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"must be at most 65535, got {text}")
    return port


def ui_command(args: argparse.Namespace) -> list[str]:
    run = RunConfig(runs_dir=args.runs_dir, tracking_uri=args.tracking_uri)
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        tracking_uri(run),
        "--host",
        args.host,
        "--port",
        str(args.port),
        # No line per request in the server's log, which lives as long as the UI does.
        "--uvicorn-opts",
        "--no-access-log",
    ]
    artifacts = artifact_location(run)
    if artifacts:
        command += ["--default-artifact-root", artifacts]
    allowed = allowed_hosts(args.host, args.allowed_hosts)
    if allowed:
        command += ["--allowed-hosts", ",".join(allowed)]
    return command


#: Addresses that listen on every interface: the server is reached by this machine's names.
EVERY_INTERFACE = ("0.0.0.0", "::")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine's loopback (reached from this machine alone)."""
    return host == "localhost" or host == "::1" or host.startswith("127.")


def machine_names(host: str) -> list[str]:
    """The names other machines reach a server listening on ``host`` by: the machine's
    host name and full name, and ``host`` itself unless it means every interface."""
    names = [socket.gethostname(), socket.getfqdn()]
    if host not in EVERY_INTERFACE:
        names.append(host)
    # A browser sends the Host header in lower case; MLflow compares it as it is. A
    # machine without a name in its resolver may call itself localhost, or a reverse
    # lookup's *.arpa: no name another machine uses.
    names = [name.lower() for name in names if name]
    return list(dict.fromkeys(n for n in names if not is_loopback(n) and not n.endswith(".arpa")))


def allowed_hosts(host: str, given: str) -> list[str]:
    """The ``--allowed-hosts`` of the MLflow server: its default list (loopback and
    private addresses; ``MLFLOW_SERVER_ALLOWED_HOSTS``'s where set), with this machine's
    names when ``host`` is not loopback and the user's (``given``, comma-separated);
    empty when MLflow's default does (a server on loopback, nothing given). Each name
    without a port with and without one; an IPv6 address in brackets, as a Host header
    holds it."""
    names = [] if is_loopback(host) else machine_names(host)
    names += [name.strip().lower() for name in given.split(",") if name.strip()]
    if not names:
        return []
    from mlflow.server.security_utils import (
        get_allowed_hosts_from_env,
        get_default_allowed_hosts,
    )

    # MLFLOW_SERVER_ALLOWED_HOSTS, which --allowed-hosts replaces, stays in the list.
    patterns = list(get_allowed_hosts_from_env() or get_default_allowed_hosts())
    for name in names:
        if name.startswith("[") and "]:" not in name:  # a bracketed IPv6 address
            name = name.strip("[]")
        if name.count(":") > 1 and not name.startswith("["):  # a bare IPv6 address
            # compared whole without a '*', as an fnmatch pattern with one
            patterns += [f"[{name}]", f"[[]{name}]:*"]
        elif name == "*" or ":" in name:  # any host, or a name with its port
            patterns.append(name)
        else:
            patterns += [name, f"{name}:*"]
    return list(dict.fromkeys(patterns))


#: How long to wait for the MLflow server to answer before giving up.
START_TIMEOUT = 120.0


def port_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be listened on now, at every address ``host`` names
    (``localhost`` may be both ``::1`` and ``127.0.0.1``; an IPv6 one probed as IPv6)."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return False
    unusable = (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)  # no IPv6 here: nobody binds it
    for family, kind, proto, _, address in addresses:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
        except OSError as error:
            if error.errno == errno.EACCES:  # not "in use": no other port free would do
                raise UserError(
                    f"port {port} on {host}: permission denied (ports below 1024 need root "
                    "privileges): give --port 1024 or above"
                ) from None
            if error.errno not in unusable:
                return False
    return True


def claim_port(host: str, port: int, tries: int = PORT_TRIES) -> tuple[int, FolderLock] | None:
    """(``port`` or the next free one above it, the lock that holds it for this process),
    or None if ``tries`` ports are all taken.

    A port is claimed with a lock file as well as a bind probe: a second `cofr ui` started
    while the first's server is still starting (about 20 s, not listening yet) would
    otherwise take the same port, print the first one's URL, and see its server fail.
    The lock file says which process holds it."""
    folder = Path(tempfile.gettempdir())
    for candidate in range(port, min(port + tries, 65536)):  # no port above 65535
        # Per user: another user's lock file would not open for writing.
        lock = FolderLock(folder / f"cofr-ui-{os.getuid()}-{candidate}.lock")
        try:
            if not lock.try_acquire():  # another `cofr ui` holds it
                continue
        except OSError:
            continue
        try:
            free = port_free(host, candidate)
        except UserError:  # a port refused outright: let go of its lock as of any other
            lock.release()
            raise
        if free:
            return candidate, lock
        lock.release()
    return None


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (OSError, ValueError):
        return False


def stop_group(server: subprocess.Popen) -> None:
    """Stop the server and everything it started (uvicorn, job runner, huey workers)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def run(args: argparse.Namespace) -> int:
    # The user's MLFLOW_TRACKING_URI, not what an earlier in-process run set.
    uri = tracking_uri(RunConfig(runs_dir=args.runs_dir, tracking_uri=args.tracking_uri))
    named_by = run_store.tracking_uri_source(args.tracking_uri)
    run_store.check_store_exists(uri, named_by)
    if named_by is not None:  # --tracking-uri or MLFLOW_TRACKING_URI: the server gets it
        given = f"{named_by} {uri}" if named_by.startswith("--") else f"{named_by}={uri}"
        if uri.startswith(("http://", "https://")):
            raise UserError(
                f"{given} is a tracking server, which has its own UI: open it in a browser "
                "(cofr ui serves a store, e.g. sqlite:///runs/mlflow.db)"
            )
        run_store.check_tracking_uri(uri, fix=f"fix {named_by}")
    try:
        socket.getaddrinfo(args.host, args.port)
    except socket.gaierror as error:
        raise UserError(f"--host {args.host}: {error.strerror}") from None
    # A port the user named is that port or none: an SSH tunnel or a bookmark points at
    # it, and the next one may be another user's server.
    asked = args.port
    claimed = claim_port(args.host, asked or DEFAULT_PORT, tries=1 if asked else PORT_TRIES)
    if claimed is None and asked:
        raise UserError(
            f"--port {asked}: in use on {args.host} (another `cofr ui`, or another "
            f"program): give another port, or leave --port out for the first free one "
            f"from {DEFAULT_PORT}"
        )
    if claimed is None:
        last = min(DEFAULT_PORT + PORT_TRIES - 1, 65535)
        raise UserError(f"ports {DEFAULT_PORT}-{last} on {args.host} are all in use: --port")
    port, lock = claimed
    if port != (asked or DEFAULT_PORT):  # the default was taken
        print(f"port {DEFAULT_PORT} is in use (another `cofr ui`?): using {port}")
    args.port = port
    # The server's own output (start-up lines, deprecation warnings of its dependencies)
    # goes to a log file: the terminal keeps the one line that matters.
    log_path = Path(tempfile.gettempdir()) / f"cofr-ui-{os.getuid()}-{port}.log"
    log = _open_log(log_path)
    # Its own process group: on exit the whole group goes, so nothing keeps the port.
    server = subprocess.Popen(
        ui_command(args),
        start_new_session=True,
        stdout=log if log is not None else subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )

    def url(host: str) -> str:
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"  # IPv6: [::1]

    # A server on every interface answers here on loopback; others reach it by name.
    local = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(args.host, args.host)
    base = url(local)
    # A closed terminal or a dropped SSH session (SIGHUP) stops it as SIGTERM does: the
    # server, in its own session, never gets the hangup and kept the port, orphaned.
    # Started under nohup (SIGHUP ignored), it keeps running.
    ends = [signal.SIGTERM]
    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
        ends.append(signal.SIGHUP)
    previous = {s: signal.signal(s, lambda signum, _: sys.exit(128 + signum)) for s in ends}
    serving = False
    try:
        print(f"starting the MLflow UI on {args.host}:{port} ...", flush=True)
        deadline = time.monotonic() + START_TIMEOUT
        while not answers(f"{base}/health"):
            if server.poll() is not None:
                failed = (
                    "the MLflow server stopped before it answered (exit status "
                    f"{server.returncode})"
                )
                if log is not None:
                    failed += f"; the end of its log, {log_path}:\n{_tail(log_path)}"
                print(failed, file=sys.stderr)
                return 1
            if time.monotonic() > deadline:
                where = f"; its log: {log_path}" if log is not None else ""
                print(
                    f"the MLflow server did not answer in {START_TIMEOUT:.0f} s{where}",
                    file=sys.stderr,
                )
                return 1
            time.sleep(0.5)
        # The experiments list (experiment tracking), not MLflow 3's GenAI landing page.
        print(f"MLflow UI: {base}/#/experiments  (Ctrl-C stops it)", flush=True)
        serving = True
        others = [] if is_loopback(args.host) else machine_names(args.host)
        if others:
            print(f"from other machines: {', '.join(f'{url(n)}/' for n in others)}", flush=True)
        if log is not None:
            print(f"server log: {log_path}", flush=True)
        return server.wait()
    except KeyboardInterrupt:
        if not serving:  # stopped before it served: interrupted, as any command (130)
            raise
        return 0  # the way to stop a server that served
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        stop_group(server)
        if log is not None:
            log.close()
        lock.release()  # the port is free again


def _open_log(path: Path) -> IO[str] | None:
    """``path`` opened for writing, anew; not through a link another user left in the
    shared temporary folder. None when it cannot be (the server's output is dropped)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    except OSError:
        return None
    return os.fdopen(fd, "w")


def _tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file, indented."""
    with contextlib.suppress(OSError):
        return "\n".join(
            f"  {line}" for line in path.read_text(errors="replace").splitlines()[-lines:]
        )
    return "  (unreadable)"
