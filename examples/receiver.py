#!/usr/bin/env python3
"""A webhook receiver for trying Herald out: prints every delivery and whether its
Standard Webhooks signature verifies with the endpoint's secret.

    python3 examples/receiver.py whsec_... [PORT]     (port 9000 by default)

Standard library only. Answers 204 to a delivery whose signature verifies, 400 otherwise.
"""

import base64
import hashlib
import hmac
import http.server
import sys


def verifies(secret: bytes, headers, body: bytes) -> bool:
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(secret, signed, hashlib.sha256).digest()).decode()
    # The header may carry several signatures (during a key rotation), space-separated.
    given = [s.partition(",")[2] for s in headers.get("webhook-signature", "").split()]
    return any(hmac.compare_digest(expected, g) for g in given)


def main() -> None:
    secret = base64.b64decode(sys.argv[1].removeprefix("whsec_"))
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 9000

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            ok = verifies(secret, self.headers, body)
            verdict = "signature valid" if ok else "signature INVALID"
            print(f"{self.headers['webhook-id']} {body.decode()} ({verdict})", flush=True)
            self.send_response(204 if ok else 400)
            self.end_headers()

        def log_message(self, *args) -> None:  # one line per delivery is enough
            pass

    http.server.HTTPServer(("127.0.0.1", port), Hook).serve_forever()


if __name__ == "__main__":
    main()
