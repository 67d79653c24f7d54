"""What the deployment tests need from the machine: Debian packages, a self-signed certificate,
a real nginx in front of one real mlx-serve or several replicas (and a way to kill one), and an
SSE reader that stamps each frame's arrival."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import h2.events
import httpx
import orjson
import pytest

from tests.support.server_proc import ROOT, ServerProcess, free_port

SITE = ROOT / "deploy" / "nginx" / "mlx-serve.conf"
REPLICAS_SITE = ROOT / "deploy" / "nginx" / "mlx-serve-replicas.conf"
NGINX_PATHS = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx")


def ensure_tool(name: str, packages: tuple[str, ...], paths: tuple[str, ...] = ()) -> str:
    """The tool's path, installing a Debian package (as root) when missing; fails loudly, never skips."""
    found = _find(name, paths)
    if found:
        return found
    log = []
    if shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        update = subprocess.run(
            ["apt-get", "update", "-qq"], capture_output=True, text=True, env=env, check=False
        )
        log.append(update.stdout + update.stderr)
        for package in packages:
            r = subprocess.run(
                ["apt-get", "install", "-y", "-qq", package],
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
            log.append(r.stdout + r.stderr)
            found = _find(name, paths)
            if found:
                return found
    pytest.fail(
        f"{name} is missing and could not be installed (apt-get install {' or '.join(packages)}; "
        f"needs root and apt-get):\n" + "\n".join(log)[-3000:],
        pytrace=False,
    )


def _find(name: str, paths: tuple[str, ...]) -> str | None:
    return shutil.which(name) or next((p for p in paths if os.access(p, os.X_OK)), None)


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1 (ECDSA P-256, valid two days) and its key."""
    openssl = ensure_tool("openssl", ("openssl",))
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def trusting(cert: Path) -> ssl.SSLContext:
    """A client TLS context that trusts `cert` (for httpx's `verify=`)."""
    return ssl.create_default_context(cafile=str(cert))


@dataclass(frozen=True, slots=True)
class SiteShape:
    """What a test changes in a shipped site: its example replica addresses (each listed once in
    every one of its `upstreams` blocks) and its access_log directive, if it has one."""

    servers: tuple[str, ...]
    upstreams: int = 1
    access_log: str | None = None


SHAPES = {
    SITE: SiteShape(("127.0.0.1:8080",)),
    REPLICAS_SITE: SiteShape(
        ("10.0.0.11:8080", "10.0.0.12:8080"),
        upstreams=2,
        access_log="access_log /var/log/nginx/mlx-serve-replicas.access.log ",
    ),
}


def _replace(text: str, old: str, new: str, site: Path, times: int = 1) -> str:
    assert text.count(old) == times, f"{site.relative_to(ROOT)} no longer has {old!r} {times}x"
    return text.replace(old, new)


def site_for_test(
    upstream_ports: int | Sequence[int],
    https_port: int,
    http_port: int,
    cert: Path,
    key: Path,
    site: Path = SITE,
    access_log: Path | None = None,
) -> str:
    """The shipped site with only its addresses, certificate and log path changed (IPv6 listeners
    dropped): the n-th example replica becomes 127.0.0.1:upstream_ports[n]."""
    shape = SHAPES[site]
    ports = [upstream_ports] if isinstance(upstream_ports, int) else list(upstream_ports)
    assert len(ports) == len(shape.servers), f"{site.name} lists {len(shape.servers)} replicas"
    text = site.read_text()
    for example, port in zip(shape.servers, ports):
        text = _replace(text, f"server {example}", f"server 127.0.0.1:{port}", site, shape.upstreams)
    if shape.access_log is not None:
        assert access_log is not None, f"{site.name} writes an access log: say where"
        text = _replace(text, shape.access_log, f"access_log {access_log} ", site)
    for old, new in (
        ("listen 80;", f"listen 127.0.0.1:{http_port};"),
        ("listen [::]:80;", ""),
        ("listen 443 ssl http2;", f"listen 127.0.0.1:{https_port} ssl http2;"),
        ("listen [::]:443 ssl http2;", ""),
        ("/etc/ssl/certs/llm.example.com.pem", str(cert)),
        ("/etc/ssl/private/llm.example.com.key", str(key)),
    ):
        text = _replace(text, old, new, site)
    return text


@dataclass
class Nginx:
    """A real nginx (foreground, one worker) serving a shipped site (mlx-serve.conf by default) in
    front of `upstream_port`: one port, or one per replica for mlx-serve-replicas.conf."""

    upstream_port: int | Sequence[int]
    folder: Path
    edit: Callable[[str], str] = lambda site: site  # a control test's misconfiguration
    site: Path = SITE
    https_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Nginx:
        binary = ensure_tool("nginx", ("nginx-light", "nginx"), NGINX_PATHS)
        self.cert, key = self_signed_cert(self.folder)
        site = self.folder / "site.conf"
        site.write_text(
            self.edit(
                site_for_test(
                    self.upstream_port,
                    self.https_port,
                    self.http_port,
                    self.cert,
                    key,
                    self.site,
                    self.upstream_log_path,
                )
            )
        )
        conf = self.folder / "nginx.conf"
        conf.write_text(self._main_conf(site))
        test = subprocess.run(
            [binary, "-t", "-p", str(self.folder), "-c", str(conf)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert test.returncode == 0, test.stderr
        self.proc = subprocess.Popen(
            [binary, "-p", str(self.folder), "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=(self.folder / "stderr.log").open("wb"),
        )
        self._wait_listening()
        return self

    def _main_conf(self, site: Path) -> str:
        d = self.folder
        user = "user root;\n" if os.geteuid() == 0 else ""  # workers must read the pytest tmp folder
        temps = "".join(
            f"{kind}_temp_path {d}/{kind}_temp;\n"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        return (
            f"{user}daemon off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log info;\n"
            f"events {{ worker_connections 256; }}\n"
            f"http {{\n{temps}access_log {d}/access.log;\ninclude {site};\n}}\n"
        )

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, self.log()
            try:
                httpx.get(
                    f"https://127.0.0.1:{self.https_port}/health", verify=trusting(self.cert), timeout=2
                )
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError(f"nginx did not come up:\n{self.log()}")

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.https_port}"

    @property
    def upstream_log_path(self) -> Path:
        """The site's own access log (mlx-serve-replicas.conf's: the replicas each request tried)."""
        return self.folder / "upstreams.log"

    def upstream_log(self) -> list[str]:
        path = self.upstream_log_path
        return path.read_text(errors="replace").splitlines() if path.exists() else []

    def log(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-4000:]
            for p in (self.folder / "error.log", self.folder / "stderr.log")
            if p.exists()
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful stop of this nginx (our own child)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def kill_replica(server: ServerProcess) -> None:
    """SIGKILL a whole replica, as a crash or a power cut would: the server process and its engine
    child (pid from /stats) at once, so it neither drains nor answers anything more. (Its processes
    share pytest's process group, so they are killed by pid, never by group.)"""
    engine_pid = int(str(server.stats()["engine_pid"]))
    os.kill(server.proc.pid, signal.SIGKILL)
    if engine_pid != server.proc.pid:
        try:
            os.kill(engine_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it went with its parent already
    server.proc.wait(10)


@dataclass(frozen=True, slots=True)
class Arrival:
    """One read from the socket: when it came and how many content frames it carried."""

    at_s: float
    content_frames: int


def content_frames(chunk: bytes) -> int:
    """SSE frames carrying generated text (OpenAI chat deltas)."""
    return chunk.count(b'"content":"') - chunk.count(b'"content":""')


def wait_for_stats(url: str, predicate: object, timeout_s: float = 30.0) -> dict[str, int]:
    """Poll mlx-serve's /stats until `predicate(stats)` holds."""
    deadline = time.monotonic() + timeout_s
    stats: dict[str, int] = {}
    while time.monotonic() < deadline:
        stats = httpx.get(url + "/stats", timeout=5).json()
        if predicate(stats):  # type: ignore[operator]
            return stats
        time.sleep(0.1)
    raise AssertionError(f"/stats never satisfied the condition: {stats}")


def tokens_settle(url: str, quiet_s: float = 1.0, tries: int = 20) -> int:
    """generated_tokens once it has stopped moving for `quiet_s` (generation really stopped)."""
    last = -1
    for _ in range(tries):
        now = int(httpx.get(url + "/stats", timeout=5).json()["generated_tokens"])
        if now == last:
            return now
        last = now
        time.sleep(quiet_s)
    raise AssertionError(f"generated_tokens still moving after {tries * quiet_s:.0f}s: {last}")


class H2Client:
    """One HTTP/2 connection driven by hand with the h2 library: h2c with prior knowledge, or TLS
    with ALPN h2. (httpx does not send RST_STREAM when a response is closed early; this does.)"""

    def __init__(self, port: int, tls: ssl.SSLContext | None = None) -> None:
        self.authority = f"127.0.0.1:{port}"
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        if tls is not None:
            tls.set_alpn_protocols(["h2"])
            sock = tls.wrap_socket(sock, server_hostname="localhost")
            assert sock.selected_alpn_protocol() == "h2"
        self.sock = sock
        self.scheme = "https" if tls is not None else "http"
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())

    def post(self, stream_id: int, path: str, body: dict[str, object]) -> None:
        self.conn.send_headers(
            stream_id,
            [
                (":method", "POST"),
                (":path", path),
                (":scheme", self.scheme),
                (":authority", self.authority),
                ("content-type", "application/json"),
            ],
        )
        self.conn.send_data(stream_id, orjson.dumps(body), end_stream=True)
        self.sock.sendall(self.conn.data_to_send())

    def read(self) -> list[h2.events.Event]:
        data = self.sock.recv(65536)
        assert data, "the server closed the connection"
        events = self.conn.receive_data(data)
        for ev in events:
            if isinstance(ev, h2.events.DataReceived):
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        self.sock.sendall(self.conn.data_to_send())
        return events

    def read_content_frames(self, stream_id: int, at_least: int) -> None:
        seen = 0
        while seen < at_least:
            seen += sum(
                content_frames(ev.data)
                for ev in self.read()
                if isinstance(ev, h2.events.DataReceived) and ev.stream_id == stream_id
            )

    def reset(self, stream_id: int) -> None:
        self.conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        self.sock.sendall(self.conn.data_to_send())

    def response(self, stream_id: int) -> tuple[int, bytes]:
        """Read until the stream ends: its status and body."""
        status, body = 0, b""
        while True:
            for ev in self.read():
                if getattr(ev, "stream_id", None) != stream_id:
                    continue
                if isinstance(ev, h2.events.ResponseReceived):
                    status = int(dict(ev.headers)[b":status"])
                elif isinstance(ev, h2.events.DataReceived):
                    body += ev.data
                elif isinstance(ev, h2.events.StreamEnded):
                    return status, body

    def close(self) -> None:
        self.sock.close()
