"""`helm test`: every pod of every preemptctl component answers /readyz with 200.

Usage: python helm-test.py HOST:PORT [HOST:PORT ...]  (the chart passes each component's headless
Service, so HOST resolves to every pod of that component). Exit 0 when every address of every host
is ready, else 1 with one line per address that is not. Only the standard library: it runs in the
preemptctl image with nothing else.
"""

from __future__ import annotations

import socket
import sys
import urllib.error
import urllib.request

# One answer per pod within this long: a loaded pod's health server answers in milliseconds.
TIMEOUT_S = 5.0


def addresses(host: str, port: int) -> list[str]:
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in found})


def ready(address: str, port: int) -> str | None:
    """None when /readyz says 200, else why not."""
    where = f"[{address}]" if ":" in address else address
    try:
        with urllib.request.urlopen(f"http://{where}:{port}/readyz", timeout=TIMEOUT_S) as answer:
            return None if answer.status == 200 else f"HTTP {answer.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}: {exc.read().decode(errors='replace').strip()}"
    except OSError as exc:
        return str(exc)


def main(targets: list[str]) -> int:
    if not targets:
        print("usage: helm-test.py HOST:PORT [HOST:PORT ...]", file=sys.stderr)
        return 2
    failed = 0
    for target in targets:
        host, _, port_text = target.rpartition(":")
        port = int(port_text)
        try:
            found = addresses(host, port)
        except OSError as exc:
            print(f"FAIL {host}: cannot resolve: {exc}")
            failed += 1
            continue
        if not found:
            print(f"FAIL {host}: no pod")
            failed += 1
        for address in found:
            problem = ready(address, port)
            print(f"{'FAIL' if problem else 'ok  '} {host} {address}:{port}{f': {problem}' if problem else ''}")
            failed += problem is not None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
