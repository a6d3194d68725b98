"""A local Spark Connect server in a process of its own: for the tests, and to try ftlayer on Connect.

::

    with LocalConnectServer(log_path=Path("connect.log")) as server:
        spark = SparkSession.builder.remote(server.url).getOrCreate()   # in a client process

pyspark ships the server (``jars/spark-connect_*.jar``, ``sbin/start-connect-server.sh``); this
runs the same main class through ``bin/spark-submit`` in the foreground, so that it is a child of
this process and stops with it.

Contract:

- :meth:`LocalConnectServer.start` starts
  ``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`` from
  ``$SPARK_HOME`` (else pyspark's own directory) with ``master`` and ``conf``, listening on
  127.0.0.1 at a free port, and returns once the server process itself listens on that port (a
  connection alone could reach another process that bound the drawn port first). A server that
  exits because its port was taken (Spark's ``BindException``: another process bound it between
  the draw and the server's bind, as test workers starting servers side by side do) is started
  again on a newly drawn port, up to ``PORT_DRAWS`` starts (``ftlayer.servers.ports``). It raises
  :class:`~ftlayer.errors.ConnectServerError` with the log's tail if the process exits first for
  another reason, or ``start_timeout_s`` passes.
- The server's Python processes (the FT source's runner and readers, row functions, the
  ``foreachBatch`` worker) run on ``python`` (default: this interpreter) with ``python_path``
  first on ``PYTHONPATH``: they unpickle ftlayer's data source and functions by module name, so
  they must import the same ftlayer as the client.
- It runs in a session of its own (a signal to the caller's process group does not reach it)
  and gets SIGTERM if the process that started it dies (Linux). :meth:`stop` sends SIGTERM to its
  process group (the JVM and its Python workers), waits up to ``stop_timeout_s``, then SIGKILLs it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from ftlayer.errors import ConnectServerError
from ftlayer.servers.child_processes import popen_with_parent
from ftlayer.servers.ports import PORT_DRAWS, free_port, listens_on, start_redrawing

__all__ = ["SERVER_CLASS", "LocalConnectServer", "spark_home"]

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def spark_home() -> Path:
    """``$SPARK_HOME``, else the directory of the installed pyspark (it ships bin/ and jars/)."""
    env = os.environ.get("SPARK_HOME")
    if env:
        return Path(env)
    import pyspark

    return Path(pyspark.__file__).parent


# what the server logs (and exits on) when its gRPC port is bound by another process (Spark 4's
# Utils.startServiceOnPort, then SparkConnectServer: "Error starting Spark Connect server")
_BIND_FAILED = "java.net.BindException: Failed to bind to address"


class _PortTakenError(ConnectServerError):
    """The drawn port was bound by another process before the server bound it (drawn again)."""


class LocalConnectServer:
    """One Spark Connect server process on 127.0.0.1 (see the module contract)."""

    def __init__(self, *, master: str = "local[2,4]", conf: Mapping[str, str] | None = None,
                 python_path: Sequence[str | Path] = (), python: str | None = None,
                 log_path: Path | None = None, cwd: Path | None = None,
                 start_timeout_s: float = 180.0, stop_timeout_s: float = 30.0) -> None:
        self.master = master
        self.conf = dict(conf or {})
        self.python_path = [str(p) for p in python_path]
        self.python = python or sys.executable
        self.log_path = log_path
        self.cwd = cwd
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Path | None = None

    @property
    def url(self) -> str:
        """The client URL, ``sc://127.0.0.1:<port>``."""
        return f"sc://127.0.0.1:{self.port}"

    def command_line(self) -> list[str]:
        conf = {"spark.ui.enabled": "false", **self.conf,
                "spark.connect.grpc.binding.address": "127.0.0.1", "spark.connect.grpc.binding.port": str(self.port)}
        args = [str(spark_home() / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--name", "ftlayer connect",
                "--master", self.master]
        for key, value in conf.items():
            args += ["--conf", f"{key}={value}"]
        return args

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYSPARK_PYTHON"] = self.python
        env["PYSPARK_DRIVER_PYTHON"] = self.python
        env["SPARK_CONNECT_MODE"] = "0"  # the server itself is classic Spark (as in start-connect-server.sh)
        env.pop("SPARK_REMOTE", None)
        env.pop("SPARK_CONNECT_MODE_ENABLED", None)
        paths = [*self.python_path, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(paths)
        return env

    def start(self) -> LocalConnectServer:
        """Start the server and wait until it listens (see the module contract)."""
        if self._proc is not None:
            return self
        self.port = free_port()
        start_redrawing(self._start_once, self._redraw, lambda exc: isinstance(exc, _PortTakenError),
                        draws=PORT_DRAWS)
        return self

    def _redraw(self) -> None:
        self.port = free_port()

    def _start_once(self) -> None:
        self._log = self.log_path or Path(f"/tmp/ftlayer-connect-{os.getpid()}-{self.port}.log")
        self._log.parent.mkdir(parents=True, exist_ok=True)
        logged_before = self._log.stat().st_size if self._log.exists() else 0
        with open(self._log, "ab") as out:
            self._proc = popen_with_parent(self.command_line(), stdin=subprocess.DEVNULL, stdout=out,
                                           stderr=subprocess.STDOUT, env=self._env(), cwd=self.cwd,
                                           start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while not self._listening():
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                tail = self.log_tail()
                if _BIND_FAILED in self._log.read_bytes()[logged_before:].decode(errors="replace"):
                    msg = f"port {self.port} was taken before the Spark Connect server bound it:\n{tail}"
                    raise _PortTakenError(msg)
                msg = f"the Spark Connect server exited with code {code} before it listened:\n{tail}"
                raise ConnectServerError(msg)
            if time.monotonic() > deadline:
                self.stop()
                msg = (f"the Spark Connect server did not listen on port {self.port} within "
                       f"{self.start_timeout_s:g} s:\n{self.log_tail()}")
                raise ConnectServerError(msg)
            time.sleep(0.25)

    def _listening(self) -> bool:
        """The server process itself listens on ``port`` (not another process that took it)."""
        if self._proc is None:
            return False
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", self.port)) != 0:
                return False
        # spark-submit execs spark-class, which execs the JVM: the process started is the listener
        return listens_on(self._proc.pid, self.port)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's log."""
        if self._log is None or not self._log.exists():
            return "(no log)"
        return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """SIGTERM the server's process group, then SIGKILL after ``stop_timeout_s``; idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, self.stop_timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)  # its own session: the group is the JVM and its workers
            except ProcessLookupError:
                break
            try:
                proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> LocalConnectServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
