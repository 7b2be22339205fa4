"""A benchmark's peer servers (llama-server, llama-cpp-python) start as their user would start them: without the
OpenMP settings skippy gave the bench process (skippy.openmp), with what the user set. A real child HTTP server
started by `skippy.bench.http_servers` answers with the environment it got."""

from __future__ import annotations

import http.client
import json
import sys
from pathlib import Path

import pytest

from skippy.bench.http_servers import _free_port, _start_http, stop
from skippy.openmp import MARKER

SERVE_ENV = """
import http.server, json, os, sys
class Env(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({n: os.environ.get(n) for n in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "SKIPPY_OMP_DEFAULTS",
                                                          "PEER_MARK")}).encode()
        self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Env).serve_forever()
"""


@pytest.mark.parametrize("user_spin", [None, "4000"])
def test_a_peer_gets_the_users_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user_spin: str | None) -> None:
    monkeypatch.setenv("PEER_MARK", "kept")
    if user_spin is None:  # what importing skippy does in a shell that set nothing
        monkeypatch.setenv("GOMP_SPINCOUNT", "1000")
        monkeypatch.setenv(MARKER, "GOMP_SPINCOUNT,OMP_WAIT_POLICY")
    else:
        monkeypatch.setenv("GOMP_SPINCOUNT", user_spin)
        monkeypatch.setenv(MARKER, "OMP_WAIT_POLICY")
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    port = _free_port()
    server = _start_http("peer", [sys.executable, "-c", SERVE_ENV, str(port)], port, tmp_path / "peer.log", "/", 60)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/")
        seen = json.loads(conn.getresponse().read())
        conn.close()
    finally:
        stop(server)
    assert seen == {"GOMP_SPINCOUNT": user_spin, "OMP_WAIT_POLICY": None, MARKER: None, "PEER_MARK": "kept"}
