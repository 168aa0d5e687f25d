"""A collector stand-in for the `omnigate+otel` row: accepts OTLP/HTTP trace exports on loopback and drops
them, so the row measures what tracing costs the gateway (spans built, batched, encoded, posted), not a
collector. Prints `PORT n` once listening.

    python -m bench.common.otlp_sink
"""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: one line per export would be noise."""


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()
