"""Reads that bench/pgo_build.sh's training never runs, timed over HTTP, to compare two builds
(code a profile-guided build saw no use of is compiled as cold: this checks it is not slower).

For each server binary given, in turn and ROUNDS times over: start it on a fresh database,
append 1,000 journal events of the reference's kinds to one engagement, then time 300 GETs each
of the engagement's summary, board and event list and of the engagement list on one keep-alive
connection, and print the p50 of each in ms.

    python3 bench/untrained_paths.py target/release/flightlog target/pgo/flightlog [ROUNDS=3]
"""
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

KINDS = ["mail_sent", "mail_delivered", "mail_completed", "board_written", "budget_charged",
         "turn_started", "turn_finished", "tool_called"]
READS = [("summary", "/v1/engagements/e1/summary"), ("board", "/v1/engagements/e1/board"),
         ("events", "/v1/engagements/e1/events?fromSeq=0"),
         ("engagements", "/v1/engagements?limit=50")]


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def connect(port, server):
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            connection.request("GET", "/healthz")
            connection.getresponse().read()
            return connection
        except OSError:
            time.sleep(0.05)
    server.kill()
    raise SystemExit("the server did not start")


def measure(binary):
    with tempfile.TemporaryDirectory() as directory:
        port = free_port()
        server = subprocess.Popen(
            [binary, "serve", "--db", os.path.join(directory, "untrained.db"),
             "--addr", f"127.0.0.1:{port}", "--grpc-addr", "off"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            connection = connect(port, server)
            headers = {"content-type": "application/json"}
            for n in range(1000):
                data = {"from": f"agent-{n % 7}", "to": f"agent-{(n + 1) % 7}",
                        "mailId": f"m{n // 3}", "key": f"k{n % 50}", "kind": "note",
                        "value": {"n": n}, "amount": 1.5, "costUsd": 0.01, "tool": "search"}
                body = json.dumps({"type": KINDS[n % len(KINDS)], "at": n, "data": data})
                connection.request("POST", "/v1/engagements/e1/events", body, headers)
                answer = connection.getresponse()
                answer.read()
                if answer.status != 201:
                    raise SystemExit(f"append {n}: HTTP {answer.status}")
            p50 = {}
            for name, path in READS:
                times = []
                for _ in range(300):
                    started = time.perf_counter()
                    connection.request("GET", path)
                    answer = connection.getresponse()
                    answer.read()
                    times.append(time.perf_counter() - started)
                    if answer.status != 200:
                        raise SystemExit(f"{path}: HTTP {answer.status}")
                times.sort()
                p50[name] = round(times[len(times) // 2] * 1e3, 3)
            return p50
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    binaries = [arg for arg in sys.argv[1:] if not arg.isdigit()]
    rounds = next((int(arg) for arg in sys.argv[1:] if arg.isdigit()), 3)
    if not binaries:
        raise SystemExit(__doc__)
    for _ in range(rounds):
        for binary in binaries:
            print(binary, "p50 ms", measure(binary), flush=True)
