"""Private server instances for restart tests: each on its own loopback port and data
directory, so stopping one never disturbs the shared servers other tests use.

``kill()`` is a crash (SIGKILL, or PostgreSQL's immediate shutdown); ``start()`` brings the
same process back on the same port and data, which must then hold every acknowledged
message.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_port(port: int, what: str, timeout: float = 60.0, *, is_open: bool = True) -> None:
    deadline = time.monotonic() + timeout
    while port_open(port) != is_open:
        if time.monotonic() > deadline:
            state = "accept" if is_open else "stop accepting"
            raise AssertionError(f"{what} did not {state} connections on port {port}")
        time.sleep(0.05)


def owned_dir(user: str) -> Path:
    """A fresh directory the given OS user owns (pytest's tmp dirs are root-only)."""
    path = Path(tempfile.mkdtemp(prefix="jf-srv-", dir="/tmp"))
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


class Server(ABC):
    """A server process this test owns (its own process group)."""

    name = "server"
    port: int
    workdir: Path

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    @abstractmethod
    def command(self) -> list[str]:
        """The server's command line."""

    def env(self) -> dict[str, str] | None:
        return None

    def start(self) -> None:
        log = open(self.workdir / f"{self.name}.log", "ab")  # noqa: SIM115 (closed with proc)
        self.proc = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=self.env(),
        )
        log.close()
        self.wait_ready()

    def wait_ready(self) -> None:
        wait_port(self.port, self.name)

    def kill(self) -> None:
        """Crash it: SIGKILL to the whole process group."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc = None
        wait_port(self.port, self.name, is_open=False)

    def stop(self) -> None:
        """A clean shutdown: SIGTERM to the process group (SIGKILL if it hangs)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
            return
        self.proc = None
        wait_port(self.port, self.name, is_open=False)

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


class RedisServer(Server):
    """redis-server logging every write, fsynced before it answers."""

    name = "redis"

    def __init__(self) -> None:
        super().__init__()
        self.port = free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix="jf-redis-"))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        return [
            "redis-server",
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.workdir),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
        ]  # fmt: skip


class NatsServer(Server):
    """nats-server with JetStream and its own store directory."""

    name = "nats"

    def __init__(self) -> None:
        super().__init__()
        self.port = free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix="jf-nats-"))

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            "nats-server", "-a", "127.0.0.1", "-p", str(self.port), "-js",
            "-sd", str(self.workdir / "store"),
        ]  # fmt: skip


class RabbitServer(Server):
    """A second RabbitMQ node (own name, ports, mnesia dir), run as the rabbitmq user."""

    name = "rabbitmq"

    def __init__(self) -> None:
        super().__init__()
        self.port = free_port()
        self.dist_port = free_port()
        self.node = f"jf{uuid.uuid4().hex[:8]}@localhost"
        self.workdir = owned_dir("rabbitmq")
        (self.workdir / "rabbitmq.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{self.port}\nloopback_users = none\n"
        )
        (self.workdir / "env.conf").write_text("")
        entry = pwd.getpwnam("rabbitmq")
        for child in self.workdir.iterdir():
            os.chown(child, entry.pw_uid, entry.pw_gid)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def command(self) -> list[str]:
        d = self.workdir
        settings = {
            "RABBITMQ_CONF_ENV_FILE": d / "env.conf",
            "RABBITMQ_CONFIG_FILE": d / "rabbitmq.conf",
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": self.port,
            "RABBITMQ_DIST_PORT": self.dist_port,
            "RABBITMQ_MNESIA_BASE": d / "mnesia",
            "RABBITMQ_LOG_BASE": d / "log",
            "RABBITMQ_ENABLED_PLUGINS_FILE": d / "plugins",
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }
        return [
            "runuser", "-u", "rabbitmq", "--", "env",
            *(f"{k}={v}" for k, v in settings.items()),
            "/usr/lib/rabbitmq/bin/rabbitmq-server",
        ]  # fmt: skip

    def wait_ready(self) -> None:
        wait_port(self.port, self.name, timeout=120)


#: the emulator's own start script (the Debian package google-cloud-cli-pubsub-emulator)
PUBSUB_EMULATOR = "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator"


class PubSubEmulator(Server):
    """A Pub/Sub emulator of our own (one JVM in its own process group). It keeps topics,
    subscriptions and messages in memory only."""

    name = "pubsub"

    def __init__(self) -> None:
        super().__init__()
        self.port = free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix="jf-pubsub-"))

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [PUBSUB_EMULATOR, "--host=127.0.0.1", f"--port={self.port}"]


def _pg_bin(tool: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{tool}"))
    if not found:
        raise AssertionError(f"PostgreSQL's {tool} is not installed")
    return found[-1]


class PostgresServer(Server):
    """A PostgreSQL cluster of our own (initdb), run as the postgres user."""

    name = "postgresql"

    def __init__(self) -> None:
        super().__init__()
        self.port = free_port()
        self.workdir = owned_dir("postgres")
        self.data = self.workdir / "data"
        subprocess.run(
            ["runuser", "-u", "postgres", "--", _pg_bin("initdb"), "-A", "trust",
             "-U", "postgres", "--no-sync", "-D", str(self.data)],
            check=True, capture_output=True,
        )  # fmt: skip

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", _pg_bin("pg_ctl"), "-D", str(self.data), *args],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def command(self) -> list[str]:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.workdir} "
            "-c fsync=on -c synchronous_commit=on"
        )
        return ["-o", options, "-l", str(self.workdir / "pg.log"), "-w", "start"]

    def start(self) -> None:
        self._ctl(*self.command())
        self.wait_ready()

    def stop(self) -> None:
        """A clean restart's first half: fast shutdown (clients disconnected, checkpoint)."""
        if port_open(self.port):
            self._ctl("-m", "fast", "-w", "stop")
        wait_port(self.port, self.name, is_open=False)

    def kill(self) -> None:
        """Immediate shutdown: no checkpoint, crash recovery on the next start."""
        if port_open(self.port):
            self._ctl("-m", "immediate", "-w", "stop")
        wait_port(self.port, self.name, is_open=False)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)
