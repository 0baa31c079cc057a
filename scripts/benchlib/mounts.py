"""Machine helpers: dropping the page cache, tensorfs mounts, the loopback S3 server."""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from .common import REPO, VENV_PY
from .dataset import parquet_files


class Caches:
    """Drops the page cache (root only); remembers whether that worked."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.works: bool | None = None

    def drop(self) -> bool:
        if not self.enabled:
            return False
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            self.works = True
        except OSError:
            self.works = False
        return self.works


def _unescape(s: str) -> str:
    import re

    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def is_mounted(path: Path) -> bool:
    want = os.path.join(os.path.realpath(path.parent), path.name)
    with open("/proc/self/mounts") as f:
        return any(len(p) >= 2 and _unescape(p[1]) == want for p in (line.split() for line in f))


def daemon_pids(mnt: Path) -> list[int]:
    want = {str(mnt), os.path.join(os.path.realpath(mnt.parent), mnt.name)}
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0")]
        except OSError:
            continue
        if any(a.rstrip("/") in want for a in argv):
            pids.append(int(entry))
    return pids


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def mount_env() -> dict:
    """The environment for tensorfs daemons: without AWS_* (credentials and endpoint come from
    the mount options; e.g. AWS_CA_BUNDLE would change the S3 client) and proxies."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AWS_") and k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


class Mount:
    """A tensorfs mount, daemonised; unmount() waits for the daemon to exit."""

    def __init__(self, binary: Path, source: str, mnt: Path, options: list[str]):
        self.mnt, self.pids = mnt, []
        mnt.mkdir(parents=True, exist_ok=True)
        err = mnt.parent / f"{mnt.name}.mount-stderr"
        with open(err, "w") as fe:
            rc = subprocess.run(
                [str(binary), "mount", source, str(mnt), "-o", ",".join(options)],
                stdin=subprocess.DEVNULL,
                stdout=fe,
                stderr=fe,
                timeout=300,
                env=mount_env(),
            ).returncode
        if rc != 0 or not is_mounted(mnt):
            raise RuntimeError(f"tensorfs mount {source} failed (exit {rc}): {err.read_text().strip()[-500:]}")
        self.pids = daemon_pids(mnt)

    def stats(self) -> dict:
        with open(self.mnt / ".tensorfs" / "stats.json", "rb") as f:
            return json.loads(f.read())

    def dataset(self) -> dict:
        with open(self.mnt / "dataset.json", "rb") as f:
            return json.loads(f.read())

    def settled(self, counter: str, quiet: float = 1.0, limit: float = 300) -> int:
        """The counter once it has not moved for QUIET seconds (or after LIMIT seconds)."""
        last, since, deadline = None, time.monotonic(), time.monotonic() + limit
        while time.monotonic() < deadline:
            now = self.stats().get(counter, 0)
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                break
            time.sleep(0.01)
        return last

    def unmount(self) -> None:
        gc.collect()
        for cmd in (["umount", str(self.mnt)], ["fusermount3", "-u", str(self.mnt)], ["umount", "-l", str(self.mnt)]):
            if not is_mounted(self.mnt):
                break
            try:
                subprocess.run(cmd, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired):
                pass
            for _ in range(40):
                if not is_mounted(self.mnt):
                    break
                time.sleep(0.05)
        deadline = time.monotonic() + 30
        while any(alive(p) for p in self.pids) and time.monotonic() < deadline:
            time.sleep(0.05)


def close_all(mounts: list, s3) -> None:
    """Unmounts every mount of MOUNTS (one that fails to unmount left as it is) and stops the S3
    server S3, if any: the end of a bench run, whatever failed before it."""
    for m in mounts:
        try:
            m.unmount()
        except Exception:
            pass
    if s3 is not None:
        s3.stop()


def faultproxy():
    """tests/faultproxy.py as a module, loaded from its path (tests/ is not on sys.path)."""
    import importlib.util
    import sys

    if "faultproxy" not in sys.modules:
        spec = importlib.util.spec_from_file_location("faultproxy", REPO / "tests" / "faultproxy.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["faultproxy"] = module
    return sys.modules["faultproxy"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "/", timeout=2) as r:
                r.read()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} does not answer")
            time.sleep(0.2)


def pyarrow_s3_fs(url: str):
    """PyArrow's S3 filesystem on the loopback S3 server at URL (`S3Server.url`), with its
    credentials: what `S3Server.pyarrow_fs` gives, for a process that has only the URL."""
    import pyarrow.fs as pafs

    return pafs.S3FileSystem(access_key="test", secret_key="test", region="us-east-1",
                             endpoint_override=url, scheme="http")


class S3Server:
    """moto's S3 server on loopback (scripts/s3-server when present), holding the dataset: DATA's
    Parquet files under PREFIX, or an empty bucket where DATA is None."""

    BUCKET, PREFIX = "bench", "ds"

    def __init__(self, data: Path | None, scratch: Path):
        self.proc = None
        self.pid = None
        self.url = None
        self.proxy = None  # tests/faultproxy.py's handle, in front of a server made by `behind`
        script = REPO / "scripts" / "s3-server"
        logf = scratch / "s3-server.log"
        if script.exists():
            upload = [] if data is None else ["--upload", f"{data}={self.BUCKET}/{self.PREFIX}"]
            r = subprocess.run(
                [str(VENV_PY), str(script), "--background", "--quiet", "--log", str(logf),
                 "--bucket", self.BUCKET, *upload],
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600,
            )
            lines = r.stdout.split()
            if r.returncode != 0 or len(lines) < 2:
                raise RuntimeError(f"scripts/s3-server failed: {(r.stderr or r.stdout).strip()[-300:]}")
            self.url, self.pid = lines[0], int(lines[1])
            self.how = "scripts/s3-server (moto)"
        else:
            port = free_port()
            self.proc = subprocess.Popen(
                [str(VENV_PY), "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdin=subprocess.DEVNULL, stdout=open(logf, "ab"), stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.url = f"http://127.0.0.1:{port}"
            wait_http(self.url, 60)
            self.how = "python -m moto.server"
            s3 = self.client()
            s3.create_bucket(Bucket=self.BUCKET)
            for p in parquet_files(data) if data is not None else []:
                s3.upload_file(str(p), self.BUCKET, f"{self.PREFIX}/{p.name}")

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.url, aws_access_key_id="test", aws_secret_access_key="test",
            region_name="us-east-1", config=Config(s3={"addressing_style": "path"}),
        )

    def remove_prefix(self, client, prefix: str) -> None:
        """The objects under PREFIX/ removed (best effort), so that later rows find the server
        as before."""
        try:
            for o in client.list_objects_v2(Bucket=self.BUCKET, Prefix=f"{prefix}/").get("Contents", []):
                client.delete_object(Bucket=self.BUCKET, Key=o["Key"])
        except Exception:
            pass

    def pyarrow_fs(self):
        """PyArrow's S3 filesystem on this server."""
        return pyarrow_s3_fs(self.url)

    def parquet_keys(self, fs) -> list[str]:
        """The dataset's objects as FS (`pyarrow_fs`) names them, listed now, in key order."""
        import pyarrow.fs as pafs

        return sorted(i.path for i in fs.get_file_info(pafs.FileSelector(f"{self.BUCKET}/{self.PREFIX}"))
                      if i.path.endswith(".parquet"))

    @property
    def source(self) -> str:
        return f"s3://{self.BUCKET}/{self.PREFIX}/"

    def mount_options(self) -> list[str]:
        return [f"aws_endpoint={self.url}", "aws_allow_http=true", "aws_access_key_id=test",
                "aws_secret_access_key=test", "aws_region=us-east-1"]

    def behind(self, bandwidth: float = 0, latency: float = 0) -> "S3Server":
        """This server behind tests/faultproxy.py, whose `proxy` handle counts what its clients
        fetched (`stats()`, `reset_stats()`); with `bandwidth` or `latency`, as a remote object
        store looks from a host: every request held `latency` seconds (a round trip to the store)
        and every response body capped at `bandwidth` bytes a second (what one connection gets).
        The same objects; `stop` ends the proxy only."""
        import copy

        front = copy.copy(self)
        front.pid = front.proc = None
        front.proxy = faultproxy().start(self.url, lifetime=0, stderr=subprocess.DEVNULL)
        front.url = front.proxy.url
        try:
            front.proxy.set(bandwidth=bandwidth, latency=latency)
        except Exception:
            front.stop()
            raise
        shaped = f"{bandwidth / 1e6:.0f} MB/s a connection, {latency * 1e3:.0f} ms" if bandwidth or latency else "counting"
        front.how = f"{self.how} behind tests/faultproxy.py ({shaped})"
        return front

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        elif self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except OSError:
                pass
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        elif self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except OSError:
                pass
            deadline = time.monotonic() + 20
            while alive(self.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
