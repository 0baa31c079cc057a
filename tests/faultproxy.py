#!/usr/bin/env python3
"""faultproxy: an HTTP/1.1 reverse proxy that injects faults, for testing remote (S3) sources.

It listens on 127.0.0.1:PORT, forwards every request to one upstream (an S3-compatible server
such as moto's, addressed path-style: /BUCKET/KEY) and, at a controlled rate, answers GETs of
object data with a fault instead. Standard library only.

    python3 tests/faultproxy.py --upstream http://127.0.0.1:5000 [--port 0] [--mode 503 --rate 0.3]

prints its own URL (http://127.0.0.1:PORT) on the first line of stdout once it listens. With
--tls-cert/--tls-key it serves HTTPS (an https:// front for clients that insist on TLS).

Fault modes (only GETs of object data are faulted, listings and HEADs stay healthy; `down`
refuses everything):

    none      forward everything
    500       500 InternalError
    503       503 ServiceUnavailable
    throttle  503 SlowDown
    reset     the connection is reset (RST): either right after the request, or after the
              response headers and part of the body
    timeout   the request is held without an answer for `hold` seconds (default 40, at most
              600), or until the client gives up, then the connection is closed
    truncate  the response headers with the full Content-Length, part of the body, then close
    mix       one of 503, throttle, reset, truncate, drawn at random per fault
    down      server down: every request (listings and HEADs too) is answered by a reset
              connection; rate, match and count do not apply

Control (handled by the proxy, never forwarded):

    POST /__fault__         JSON {"mode": "503", "rate": 0.3, "seed": 1, "hold": 40,
                            "count": 5, "match": "\\.parquet$", "bandwidth": 50e6,
                            "latency": 0.02}: any subset. `bandwidth` caps each response
                            body's bytes per second (as one connection to a store is capped; 0:
                            no cap); `latency` holds every request that long before forwarding
                            it (a remote store's round trip). `count` caps the
                            faults injected from now on (null: no cap), `match` is a regex the
                            object's path must match, `seed` restarts the RNG. Setting it
                            restarts the fault count. Answers the configuration in force.
    GET  /__fault__         the configuration in force
    GET  /__stats__         counters: requests, by_method, object_gets, listings, keys and
                            key_bytes (object GETs and body bytes per path), faults (per mode),
                            access_keys (requests by the access key id their signature names),
                            forwarded, bytes_forwarded (response body bytes sent to clients
                            from upstream, partial bodies included), request_bytes, ...
    POST /__stats__/reset   zero the counters

Upstream connections are one per request (`Connection: close` upstream); client connections
are kept alive. Chunked and Content-Length bodies are handled both ways; `Expect: 100-continue`
is answered by the proxy itself.

From Python (e.g. pytest), `start(upstream)` runs it as a subprocess and returns a `Proxy`
handle with `set(mode, rate, ...)`, `stats()`, `reset_stats()` and `stop()`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request

MODES = ("none", "500", "503", "throttle", "reset", "timeout", "truncate", "mix", "down")
MIX = ("503", "throttle", "reset", "truncate")
MAX_HOLD = 600.0
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
}
# Object sub-resources that are not object data.
NOT_DATA = {"acl", "tagging", "uploadId", "uploads", "attributes", "legal-hold", "retention", "torrent"}
READ_SIZE = 64 << 10
HEAD_LIMIT = 1 << 20


class BadRequest(Exception):
    pass


class Config:
    def __init__(self, mode="none", rate=1.0, seed=0, hold=40.0, count=None, match=None, bandwidth=0.0, latency=0.0):
        self.mode = mode
        self.latency = latency  # seconds added before every forwarded request, as a remote store's round trip
        self.bandwidth = bandwidth  # bytes/s of each response body, as one connection to a store gets; 0: any
        self.rate = rate
        self.seed = seed
        self.hold = hold
        self.count = count
        self.match = match
        self.rng = random.Random(seed)
        self.injected = 0  # faults injected since the configuration was last set

    def update(self, d: dict) -> None:
        unknown = set(d) - {"mode", "rate", "seed", "hold", "count", "match", "bandwidth", "latency"}
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)}")
        mode = str(d.get("mode", self.mode))
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        rate = float(d.get("rate", self.rate))
        if not 0.0 <= rate <= 1.0:
            raise ValueError("rate must be within [0, 1]")
        hold = float(d.get("hold", self.hold))
        if not 0.0 <= hold <= MAX_HOLD:
            raise ValueError(f"hold must be within [0, {MAX_HOLD:g}] seconds")
        count = d.get("count", self.count)
        if count is not None:
            count = int(count)
            if count < 0:
                raise ValueError("count must be >= 0 or null")
        match = d.get("match", self.match)
        if match is not None:
            re.compile(match)
        bandwidth = float(d.get("bandwidth", self.bandwidth))
        if bandwidth < 0:
            raise ValueError("bandwidth must be >= 0 (0: unlimited)")
        self.bandwidth = bandwidth
        latency = float(d.get("latency", self.latency))
        if not 0.0 <= latency <= 10.0:
            raise ValueError("latency must be within [0, 10] seconds")
        self.latency = latency
        self.mode, self.rate, self.hold, self.count, self.match = mode, rate, hold, count, match
        if "seed" in d:
            self.seed = int(d["seed"])
            self.rng = random.Random(self.seed)
        self.injected = 0

    def to_json(self) -> dict:
        return {
            "mode": self.mode,
            "rate": self.rate,
            "seed": self.seed,
            "hold": self.hold,
            "count": self.count,
            "match": self.match,
            "bandwidth": self.bandwidth,
            "latency": self.latency,
            "injected": self.injected,
        }


def new_stats() -> dict:
    return {
        "connections": 0,
        "requests": 0,
        "by_method": {},
        "object_gets": 0,
        "listings": 0,  # GETs of the bucket itself with a prefix or list-type: listing pages
        "keys": {},  # object GETs by path (/BUCKET/KEY)
        "key_bytes": {},  # response body bytes by object path
        "faults": {},
        "forwarded": 0,
        "upstream_errors": 0,
        "bytes_forwarded": 0,
        "request_bytes": 0,
        "statuses": {},
        "access_keys": {},  # requests by the access key id their AWS signature names
    }


class Request:
    def __init__(self, method, target, version, headers):
        self.method = method
        self.target = target
        self.version = version
        self.headers = headers  # [(name, value)] as received
        self.body = b""

    def header(self, name: str, default=None):
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return default

    def tokens(self, name: str) -> set[str]:
        out = set()
        for k, v in self.headers:
            if k.lower() == name.lower():
                out |= {t.strip().lower() for t in v.split(",") if t.strip()}
        return out

    @property
    def path_and_query(self) -> tuple[str, str]:
        t = self.target
        if "://" in t:  # absolute-form
            u = urllib.parse.urlsplit(t)
            return u.path or "/", u.query
        path, _, query = t.partition("?")
        return path, query

    def keep_alive(self) -> bool:
        conn = self.tokens("connection")
        if self.version == "HTTP/1.0":
            return "keep-alive" in conn
        return "close" not in conn


async def read_head(reader: asyncio.StreamReader) -> bytes | None:
    """One message head, without its final CRLFCRLF; None on a clean EOF before any byte."""
    try:
        data = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial.strip():
            return None
        raise BadRequest("connection closed inside a message head") from e
    except asyncio.LimitOverrunError as e:
        raise BadRequest("message head too long") from e
    return data[:-4]


def parse_headers(lines: list[str]) -> list[tuple[str, str]]:
    out = []
    for line in lines:
        if not line:
            continue
        k, sep, v = line.partition(":")
        if not sep:
            raise BadRequest(f"bad header line {line!r}")
        out.append((k.strip(), v.strip()))
    return out


async def read_chunked(reader: asyncio.StreamReader):
    """Yields the data of a chunked body (trailers are read and dropped)."""
    while True:
        line = await reader.readuntil(b"\r\n")
        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass
            return
        data = await reader.readexactly(size)
        await reader.readexactly(2)
        yield data


async def read_body(reader: asyncio.StreamReader, headers, *, until_eof=False):
    """Yields a message body framed by HEADERS (chunked, Content-Length, or EOF)."""
    te = {t.strip().lower() for k, v in headers if k.lower() == "transfer-encoding" for t in v.split(",")}
    if "chunked" in te:
        async for data in read_chunked(reader):
            yield data
        return
    cl = [v for k, v in headers if k.lower() == "content-length"]
    if cl:
        left = int(cl[0])
        while left > 0:
            data = await reader.read(min(left, READ_SIZE))
            if not data:
                raise asyncio.IncompleteReadError(b"", left)
            left -= len(data)
            yield data
        return
    if until_eof:
        while True:
            data = await reader.read(READ_SIZE)
            if not data:
                return
            yield data


def reset(writer: asyncio.StreamWriter) -> None:
    """Closes the connection with a RST (SO_LINGER 0), discarding anything not yet sent."""
    sock = writer.get_extra_info("socket")
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    writer.transport.abort()


def status_line(version: str, code: int, reason: str) -> bytes:
    return f"{version} {code} {reason}\r\n".encode("latin-1")


def encode_headers(headers) -> bytes:
    return b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in headers) + b"\r\n"


def s3_error(code: str, message: str, resource: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{resource}</Resource><RequestId>faultproxy</RequestId></Error>"
    ).encode()


class Proxy:
    """The proxy server (inside the subprocess)."""

    def __init__(self, upstream: str, config: Config, verbose=False):
        u = urllib.parse.urlsplit(upstream)
        if u.scheme != "http" or not u.hostname:
            raise SystemExit(f"faultproxy: upstream must be http://HOST:PORT, not {upstream!r}")
        self.up_host, self.up_port = u.hostname, u.port or 80
        self.config = config
        self.stats = new_stats()
        self.verbose = verbose
        self.tasks: set[asyncio.Task] = set()

    def log(self, msg: str) -> None:
        if self.verbose:
            print(f"[faultproxy {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def count(self, key: str, sub: str | None = None, n: int = 1) -> None:
        if sub is None:
            self.stats[key] += n
        else:
            self.stats[key][sub] = self.stats[key].get(sub, 0) + n

    # ---------------------------------------------------------------------------------------
    def is_object_get(self, req: Request) -> bool:
        if req.method != "GET":
            return False
        path, query = req.path_and_query
        parts = path.lstrip("/").split("/", 1)
        if len(parts) < 2 or not parts[1]:
            return False  # the bucket itself: a listing or a bucket sub-resource
        keys = {kv.split("=", 1)[0] for kv in query.split("&") if kv}
        return not (keys & NOT_DATA)

    def is_listing(self, req: Request) -> bool:
        path, query = req.path_and_query
        keys = {kv.split("=", 1)[0] for kv in query.split("&") if kv}
        return req.method == "GET" and "/" not in path.strip("/") and bool(keys & {"list-type", "prefix", "delimiter"})

    def decide(self, req: Request) -> str | None:
        cfg = self.config
        if cfg.mode == "down":
            return "down"
        if not self.is_object_get(req):
            return None
        self.count("object_gets")
        self.count("keys", req.path_and_query[0])
        if cfg.mode == "none":
            return None
        if cfg.match is not None and not re.search(cfg.match, req.path_and_query[0]):
            return None
        if cfg.count is not None and cfg.injected >= cfg.count:
            return None
        if cfg.rng.random() >= cfg.rate:
            return None
        cfg.injected += 1
        return cfg.rng.choice(MIX) if cfg.mode == "mix" else cfg.mode

    # ---------------------------------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self.tasks.add(task)
        self.count("connections")
        try:
            while True:
                keep = await self.one(reader, writer)
                if not keep:
                    break
        except (BadRequest, ValueError) as e:
            self.log(f"bad request: {e}")
            try:
                body = str(e).encode() + b"\n"
                writer.write(
                    status_line("HTTP/1.1", 400, "Bad Request")
                    + encode_headers([("Content-Length", len(body)), ("Connection", "close")])
                    + body
                )
                await writer.drain()
            except OSError:
                pass
        except (asyncio.IncompleteReadError, ConnectionError, OSError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            reset(writer)  # shutting down (not re-raised: start_server's callback would complain)
        finally:
            self.tasks.discard(task)
            if not writer.transport.is_closing():
                writer.close()

    async def one(self, reader, writer) -> bool:
        """Serves one request; returns whether the connection stays open."""
        head = await read_head(reader)
        if head is None:
            return False
        lines = head.decode("latin-1").split("\r\n")
        first = lines[0].split(" ")
        if len(first) != 3 or not first[2].startswith("HTTP/1."):
            raise BadRequest(f"bad request line {lines[0]!r}")
        req = Request(first[0], first[1], first[2], parse_headers(lines[1:]))
        path = req.path_and_query[0]

        # The control endpoints: never forwarded, never faulted.
        if path in ("/__fault__", "/__stats__", "/__stats__/reset"):
            req.body = b"".join([d async for d in read_body(reader, req.headers)])
            return await self.control(req, writer)

        self.count("requests")
        signed = re.search(r"Credential=([^/,\s]+)/", req.header("authorization", "") or "")
        if signed:
            self.count("access_keys", signed.group(1))
        self.count("by_method", req.method)
        if self.is_listing(req):
            self.count("listings")
        if self.config.latency:
            await asyncio.sleep(self.config.latency)
        fault = self.decide(req)
        if fault:
            self.count("faults", fault)
            self.log(f"{req.method} {req.target}: fault {fault}")

        if fault == "down":
            reset(writer)
            return False

        # A reset of this kind comes either before any answer, or after part of the body.
        early_reset = fault == "reset" and self.config.rng.random() < 0.5
        if fault == "timeout" or early_reset:
            # The request body is left unread: the connection does not survive this.
            if early_reset:
                reset(writer)
                return False
        else:
            # The request body (answering Expect: 100-continue ourselves).
            if "100-continue" in req.tokens("expect"):
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                await writer.drain()
            req.body = b"".join([d async for d in read_body(reader, req.headers)])

        if fault in ("500", "503", "throttle"):
            code, reason, s3code, msg = {
                "500": (500, "Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
                "503": (503, "Service Unavailable", "ServiceUnavailable", "Service is unable to handle request."),
                "throttle": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
            }[fault]
            body = s3_error(s3code, msg, path)
            keep = req.keep_alive()
            hdrs = [("Content-Type", "application/xml"), ("Content-Length", len(body)), ("x-amz-request-id", "faultproxy")]
            if fault != "500":
                hdrs.append(("Retry-After", "0"))
            if not keep:
                hdrs.append(("Connection", "close"))
            writer.write(status_line("HTTP/1.1", code, reason) + encode_headers(hdrs) + body)
            await writer.drain()
            self.count("statuses", str(code))
            return keep

        if fault == "timeout":
            hold = asyncio.ensure_future(asyncio.sleep(self.config.hold))
            gone = asyncio.ensure_future(reader.read(1))  # the client giving up (EOF or data)
            try:
                await asyncio.wait({hold, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                hold.cancel()
                gone.cancel()
            writer.close()
            return False

        return await self.forward(req, writer, truncate=(fault == "truncate"), reset_mid=(fault == "reset"))

    async def control(self, req: Request, writer) -> bool:
        path = req.path_and_query[0]
        code, out = 200, None
        try:
            if path == "/__fault__" and req.method == "POST":
                self.config.update(json.loads(req.body or b"{}"))
                self.log(f"configuration: {self.config.to_json()}")
                out = self.config.to_json()
            elif path == "/__fault__" and req.method == "GET":
                out = self.config.to_json()
            elif path == "/__stats__" and req.method == "GET":
                out = dict(self.stats, config=self.config.to_json())
            elif path == "/__stats__/reset" and req.method == "POST":
                self.stats = new_stats()
                out = self.stats
            else:
                code, out = 405, {"error": f"{req.method} {path} is not allowed"}
        except (ValueError, TypeError) as e:
            code, out = 400, {"error": str(e)}
        body = json.dumps(out).encode() + b"\n"
        keep = req.keep_alive()
        hdrs = [("Content-Type", "application/json"), ("Content-Length", len(body))]
        if not keep:
            hdrs.append(("Connection", "close"))
        reason = {200: "OK", 400: "Bad Request", 405: "Method Not Allowed"}[code]
        writer.write(status_line("HTTP/1.1", code, reason) + encode_headers(hdrs) + body)
        await writer.drain()
        return keep

    async def forward(self, req: Request, writer, *, truncate=False, reset_mid=False) -> bool:
        keep = req.keep_alive()
        try:
            ur, uw = await asyncio.wait_for(
                asyncio.open_connection(self.up_host, self.up_port, limit=HEAD_LIMIT), 10
            )
        except (OSError, asyncio.TimeoutError) as e:
            self.count("upstream_errors")
            self.log(f"{req.method} {req.target}: upstream unreachable: {e}")
            body = f"faultproxy: upstream unreachable: {e}\n".encode()
            hdrs = [("Content-Type", "text/plain"), ("Content-Length", len(body))]
            if not keep:
                hdrs.append(("Connection", "close"))
            writer.write(status_line("HTTP/1.1", 502, "Bad Gateway") + encode_headers(hdrs) + body)
            await writer.drain()
            return keep
        try:
            had_body = req.header("content-length") is not None or req.header("transfer-encoding") is not None
            hdrs = [(k, v) for k, v in req.headers if k.lower() not in HOP_BY_HOP and k.lower() != "content-length"]
            if had_body:
                hdrs.append(("Content-Length", len(req.body)))
            hdrs.append(("Connection", "close"))
            uw.write(f"{req.method} {req.target} HTTP/1.1\r\n".encode("latin-1") + encode_headers(hdrs) + req.body)
            await uw.drain()
            self.count("forwarded")
            self.count("request_bytes", n=len(req.body))

            # The response head, skipping interim 1xx responses.
            while True:
                head = await read_head(ur)
                if head is None:
                    raise ConnectionError("upstream closed without a response")
                lines = head.decode("latin-1").split("\r\n")
                parts = lines[0].split(" ", 2)
                code = int(parts[1])
                reason = parts[2] if len(parts) > 2 else ""
                rhdrs = parse_headers(lines[1:])
                if not 100 <= code < 200:
                    break
            self.count("statuses", str(code))
            no_body = req.method == "HEAD" or code in (204, 304)
            out_hdrs = [(k, v) for k, v in rhdrs if k.lower() not in HOP_BY_HOP]
            has_cl = any(k.lower() == "content-length" for k, _ in rhdrs)
            chunked = any(
                k.lower() == "transfer-encoding" and "chunked" in v.lower() for k, v in rhdrs
            )

            if (truncate or reset_mid) and code in (200, 206) and not no_body:
                body = b"".join([d async for d in read_body(ur, rhdrs, until_eof=True)])
                if len(body) >= 2:
                    cut = self.config.rng.randint(1, len(body) - 1) if truncate else self.config.rng.randint(0, len(body) - 1)
                    out_hdrs = [(k, v) for k, v in out_hdrs if k.lower() != "content-length"]
                    out_hdrs.append(("Content-Length", len(body)))
                    out_hdrs.append(("Connection", "close"))
                    writer.write(status_line("HTTP/1.1", code, reason) + encode_headers(out_hdrs) + body[:cut])
                    await writer.drain()
                    self.count("bytes_forwarded", n=cut)
                    self.log(f"{req.method} {req.target}: {'truncated' if truncate else 'reset'} at {cut}/{len(body)}")
                    if truncate:
                        writer.close()
                    else:
                        reset(writer)
                    return False
                # Too short to cut: served whole.
                out_hdrs = [(k, v) for k, v in out_hdrs if k.lower() != "content-length"]
                out_hdrs.append(("Content-Length", len(body)))
                if not keep:
                    out_hdrs.append(("Connection", "close"))
                writer.write(status_line("HTTP/1.1", code, reason) + encode_headers(out_hdrs) + body)
                await writer.drain()
                self.count("bytes_forwarded", n=len(body))
                return keep

            if no_body:
                if not keep:
                    out_hdrs.append(("Connection", "close"))
                writer.write(status_line("HTTP/1.1", code, reason) + encode_headers(out_hdrs))
                await writer.drain()
                return keep

            # Stream the body: by Content-Length as received, else re-chunked to the client.
            rechunk = chunked or not has_cl
            if rechunk:
                out_hdrs = [(k, v) for k, v in out_hdrs if k.lower() != "content-length"]
                if req.version == "HTTP/1.1":
                    out_hdrs.append(("Transfer-Encoding", "chunked"))
                else:
                    keep, rechunk = False, False
            if not keep:
                out_hdrs.append(("Connection", "close"))
            writer.write(status_line("HTTP/1.1", code, reason) + encode_headers(out_hdrs))
            per_key = self.is_object_get(req)
            async for data in read_body(ur, rhdrs, until_eof=True):
                writer.write(b"%x\r\n%s\r\n" % (len(data), data) if rechunk else data)
                self.count("bytes_forwarded", n=len(data))
                if per_key:
                    self.count("key_bytes", req.path_and_query[0], n=len(data))
                await writer.drain()
                if self.config.bandwidth:
                    await asyncio.sleep(len(data) / self.config.bandwidth)
            if rechunk:
                writer.write(b"0\r\n\r\n")
            await writer.drain()
            return keep
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, IndexError) as e:
            # Upstream broke mid-response: the client sees a broken connection, as it would.
            self.count("upstream_errors")
            self.log(f"{req.method} {req.target}: upstream error: {e!r}")
            reset(writer)
            return False
        finally:
            uw.close()

    async def serve(self, host: str, port: int, lifetime: float, tls=None) -> None:
        ctx = None
        if tls:
            import ssl

            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(*tls)
        server = await asyncio.start_server(self.handle, host, port, limit=HEAD_LIMIT, reuse_address=True, ssl=ctx)
        h, p = server.sockets[0].getsockname()[:2]
        print(f"{'https' if tls else 'http'}://{h}:{p}", flush=True)
        self.log(f"listening on {h}:{p}, upstream {self.up_host}:{self.up_port}")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            if lifetime > 0:
                await asyncio.wait_for(stop.wait(), lifetime)
            else:
                await stop.wait()
        except asyncio.TimeoutError:
            self.log(f"lifetime of {lifetime:g} s is over")
        server.close()
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", required=True, help="http://HOST:PORT of the S3-compatible server")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    ap.add_argument("--mode", default="none", choices=MODES)
    ap.add_argument("--rate", type=float, default=1.0, help="fraction of object GETs faulted (default 1)")
    ap.add_argument("--seed", type=int, default=0, help="RNG seed (default 0)")
    ap.add_argument("--hold", type=float, default=40.0, help="seconds a `timeout` fault holds a request")
    ap.add_argument("--count", type=int, default=None, help="inject at most this many faults")
    ap.add_argument("--match", default=None, help="fault only object paths matching this regex")
    ap.add_argument("--lifetime", type=float, default=3600.0, help="exit after this many seconds (0: never)")
    ap.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM; with --tls-key)")
    ap.add_argument("--tls-key", help="the certificate's private key (PEM)")
    ap.add_argument("-v", "--verbose", action="store_true", help="log requests and faults to stderr")
    a = ap.parse_args(argv)
    if a.host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("faultproxy: listens on the loopback interface only")
    cfg = Config()
    try:
        cfg.update({"mode": a.mode, "rate": a.rate, "seed": a.seed, "hold": a.hold, "count": a.count, "match": a.match})
    except ValueError as e:
        raise SystemExit(f"faultproxy: {e}")
    if bool(a.tls_cert) != bool(a.tls_key):
        raise SystemExit("faultproxy: --tls-cert and --tls-key go together")
    tls = (a.tls_cert, a.tls_key) if a.tls_cert else None
    asyncio.run(Proxy(a.upstream, cfg, a.verbose).serve(a.host, a.port, a.lifetime, tls))


# ------------------------------------------------------------------------------------------
# Client side: start the proxy as a subprocess and drive it.
# ------------------------------------------------------------------------------------------


class ProxyHandle:
    def __init__(self, proc: subprocess.Popen, url: str):
        self.proc = proc
        self.url = url
        self.port = int(url.rsplit(":", 1)[1])
        self.ssl_context = None
        if url.startswith("https://"):  # a test certificate: the control calls do not verify it
            import ssl

            self.ssl_context = ssl._create_unverified_context()

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=10, context=self.ssl_context) as r:
            return json.loads(r.read())

    def set(self, mode: str = "none", rate: float = 1.0, count: int | None = None, match: str | None = None, **kw) -> dict:
        """Switch to MODE at RATE, with at most COUNT faults (None: no cap) on object paths
        matching MATCH (None: all); seed= restarts the RNG, hold= sets a timeout's hold."""
        return self._call("POST", "/__fault__", {"mode": mode, "rate": rate, "count": count, "match": match, **kw})

    def config(self) -> dict:
        return self._call("GET", "/__fault__")

    def stats(self) -> dict:
        return self._call("GET", "/__stats__")

    def reset_stats(self) -> dict:
        return self._call("POST", "/__stats__/reset", {})

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start(upstream: str, *, mode="none", rate=1.0, seed=0, lifetime=3600.0, stderr=None, verbose=False, tls=None) -> ProxyHandle:
    """Run the proxy in a subprocess on a free loopback port; returns once it listens.
    TLS=(cert.pem, key.pem) serves HTTPS (the control endpoints too)."""
    args = [
        sys.executable, os.path.abspath(__file__), "--upstream", upstream, "--mode", mode,
        "--rate", str(rate), "--seed", str(seed), "--lifetime", str(lifetime),
    ]
    if tls:
        args += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
    if verbose:
        args.append("-v")
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, text=True)
    line = ""
    try:
        line = _readline_within(proc, 20)
    finally:
        if not line.startswith(("http://", "https://")):
            proc.kill()
            proc.wait(10)
    if not line.startswith(("http://", "https://")):
        raise RuntimeError(f"faultproxy did not start (first line {line!r}, exit {proc.returncode})")
    return ProxyHandle(proc, line.strip())


def _readline_within(proc: subprocess.Popen, timeout: float) -> str:
    """The first stdout line of PROC, or '' if none came within TIMEOUT seconds."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if sel.select(timeout):
            return proc.stdout.readline()
        return ""
    finally:
        sel.close()


if __name__ == "__main__":
    main()
