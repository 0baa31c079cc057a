#!/usr/bin/env python3
"""An Iceberg REST catalog on loopback for the tests, over a pyiceberg SQL catalog: the REST
specification's calls a reader makes (`GET /v1/config`, `POST /v1/oauth/tokens`,
`GET /v1/{prefix}/namespaces/{namespace}/tables/{table}`), answered from the SQL catalog's
tables, with the specification's error model. Requests must carry the bearer token TOKEN, which
`/v1/oauth/tokens` hands out for the client credentials CLIENT_ID:SECRET.

    python iceberg_rest_server.py SQLITE_URI WAREHOUSE --token T --credential ID:SECRET [--prefix P]

Prints its URL (http://127.0.0.1:PORT) on the first line of stdout once it listens. pyiceberg's
own REST client (`load_catalog(type="rest")`) reads tables from it, as tensorfs does.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("uri")
    ap.add_argument("warehouse")
    ap.add_argument("--token", required=True)
    ap.add_argument("--credential", required=True)
    ap.add_argument("--prefix", default="")
    a = ap.parse_args()

    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import NoSuchTableError

    # The SQL catalog keys its tables by catalog name: the one the tests create them under.
    catalog = SqlCatalog("backing", uri=a.uri, warehouse=a.warehouse)
    client_id, secret = a.credential.split(":", 1)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def error(self, code: int, kind: str, message: str) -> None:
            self.reply(code, {"error": {"message": message, "type": kind, "code": code}})

        def authorised(self) -> bool:
            if self.headers.get("Authorization") == f"Bearer {a.token}":
                return True
            self.error(401, "NotAuthorizedException", "a bearer token is required")
            return False

        def do_POST(self):
            path = urllib.parse.urlparse(self.path).path
            if path != "/v1/oauth/tokens":
                return self.error(404, "NotFoundException", path)
            n = int(self.headers.get("Content-Length") or 0)
            form = urllib.parse.parse_qs(self.rfile.read(n).decode())
            given = (form.get("client_id", [""])[0], form.get("client_secret", [""])[0])
            if form.get("grant_type") != ["client_credentials"] or given != (client_id, secret):
                return self.error(401, "NotAuthorizedException", "bad client credentials")
            self.reply(200, {"access_token": a.token, "token_type": "bearer", "expires_in": 3600,
                             "issued_token_type": "urn:ietf:params:oauth:token-type:access_token"})

        def do_GET(self):
            url = urllib.parse.urlparse(self.path)
            if not self.authorised():
                return
            if url.path == "/v1/config":
                overrides = {"prefix": a.prefix} if a.prefix else {}
                return self.reply(200, {"defaults": {}, "overrides": overrides})
            parts = url.path.split("/")
            # /v1/[prefix/]namespaces/NS/tables/T
            if a.prefix:
                if len(parts) < 3 or parts[2] != a.prefix:
                    return self.error(404, "NotFoundException", f"no prefix in {url.path}")
                parts = parts[:2] + parts[3:]
            if len(parts) != 6 or parts[2] != "namespaces" or parts[4] != "tables":
                return self.error(404, "NotFoundException", url.path)
            namespace = tuple(urllib.parse.unquote(parts[3]).split("\x1f"))
            table = urllib.parse.unquote(parts[5])
            try:
                t = catalog.load_table(namespace + (table,))
            except NoSuchTableError as e:
                return self.error(404, "NoSuchTableException", str(e))
            location = t.metadata_location
            metadata = json.loads(Path(location.removeprefix("file://")).read_text())
            self.reply(200, {"metadata-location": location, "metadata": metadata, "config": {}})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
