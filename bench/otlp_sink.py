"""A collector that takes OTLP/HTTP exports and throws them away: where bench/gateway.py's traced gateway sends.

It answers ``POST /v1/traces`` with 200 and counts the exports and their
bytes (``GET /count``), in a process of its own so that receiving costs the
load generator nothing.

    python -m bench.otlp_sink --port 4318
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def serve(port: int) -> None:
    counts = {"exports": 0, "bytes": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            size = int(self.headers.get("content-length", "0"))
            self.rfile.read(size)
            with lock:
                counts["exports"] += 1
                counts["bytes"] += size
            self._answer(b"")

        def do_GET(self) -> None:
            with lock:
                self._answer(json.dumps(counts).encode())

        def _answer(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    serve(parser.parse_args().port)


if __name__ == "__main__":
    main()
