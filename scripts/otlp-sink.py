#!/usr/bin/env python3
"""A stand-in OpenTelemetry collector for benchmarks: accepts OTLP/HTTP exports on
/v1/traces (any body, answered 200 at once) and, on SIGINT/SIGTERM, prints how many
exports and bytes it received. Usage: scripts/otlp-sink.py [port] (default 4318)."""

import http.server
import signal
import sys
import threading

PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 4318
seen = {"exports": 0, "bytes": 0}


class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("content-length", 0))
        self.rfile.read(length)
        seen["exports"] += 1
        seen["bytes"] += length
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Sink)


def stop(*_):
    print(f"exports={seen['exports']} bytes={seen['bytes']}", flush=True)
    threading.Thread(target=server.shutdown).start()


signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
server.serve_forever()
