"""The load-test client's own ceiling: requests per second it sustains against a trivial server.

    python benchmarks/endpoint_client.py                       # rates 50..1600/s, 400 requests each
    python benchmarks/endpoint_client.py --rates 100,200 --requests 300 --tokens 16

A trivial OpenAI-compatible streaming server (a separate process, stdlib asyncio: ``/v1/models``
and ``/v1/completions`` answering ``--tokens`` chunks at once, with usage) is started on
127.0.0.1 on a free port; ``perfscope loadtest --endpoint`` (the library call, no report written)
then sends it Poisson arrivals at each rate. The server does no work, so what limits the
achieved rate is the client (and the machine's cores, which the two processes share).

Per rate: achieved requests/s and its ratio to the offered rate (the schedule's own count over
its span), the client's dispatch delay (actual - intended send) p50/p99, the server-side
TTFT p50. The last line is ``client_ceiling_per_s=X``: the highest rate whose achieved/offered
ratio is >= 0.95 (the dispatch delay's p99 is in the table: on a shared machine it spikes at any
rate when another job takes the cores).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SERVER = r'''
import asyncio, json, sys
TOKENS = int(sys.argv[1])
async def handle(r, w):
    line = await r.readline()
    n = 0
    while True:
        h = await r.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        k, _, v = h.decode().partition(":")
        if k.strip().lower() == "content-length":
            n = int(v)
    if n:
        await r.readexactly(n)
    if line.startswith(b"GET /v1/models"):
        body = json.dumps({"object": "list", "data": [{"id": "trivial", "object": "model"}]}).encode()
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\n\r\n" + body)
    else:
        out = [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"]
        for i in range(TOKENS):
            out.append(b'data: {"choices": [{"index": 0, "text": " t", "finish_reason": null}]}\n\n')
        out.append(b'data: {"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": '
                   + str(TOKENS).encode() + b', "total_tokens": ' + str(8 + TOKENS).encode() + b'}}\n\n')
        out.append(b"data: [DONE]\n\n")
        w.write(b"".join(out))
    await w.drain()
    w.close()
async def main():
    srv = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
    print(srv.sockets[0].getsockname()[1], flush=True)
    await srv.serve_forever()
asyncio.run(main())
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="50,100,200,400,800,1600")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--tokens", type=int, default=8, help="streamed chunks per answer")
    args = ap.parse_args()

    from perfscope.sessions.endpoint import EndpointRun, run_endpoint_loadtest

    server = subprocess.Popen([sys.executable, "-c", SERVER, str(args.tokens)], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{port}/v1"
        rows = []
        for rate in [float(r) for r in args.rates.split(",")]:
            run = EndpointRun(url, rates=(rate,), requests=args.requests, prompt_len="8", output_len=str(args.tokens),
                              timeout_s=60)
            t = time.perf_counter()
            report = run_endpoint_loadtest(run)
            wall = time.perf_counter() - t
            m = report.params["loadtest"]["metrics"][0]
            meta = report.params["loadtest"]["runs"][0]
            offered = meta["offered_rate_per_s"]
            achieved = m["request_throughput_per_s"]
            rows.append((rate, offered, achieved, achieved / offered, m["dispatch_delay_s"]["p50"] * 1e3,
                         m["dispatch_delay_s"]["p99"] * 1e3, m["ttft_s"]["p50"] * 1e3, m["requests"],
                         m["requests_sent"], wall))
    finally:
        server.kill()
        server.wait()
    print("| rate/s | offered/s | achieved/s | achieved/offered | dispatch p50 ms | dispatch p99 ms | TTFT p50 ms | "
          "completed/sent |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]:g} | {r[1]:.1f} | {r[2]:.1f} | {r[3]:.3f} | {r[4]:.2f} | {r[5]:.2f} | {r[6]:.2f} | "
              f"{r[7]}/{r[8]} |")
    ok = [r[0] for r in rows if r[3] >= 0.95]
    print(f"client_ceiling_per_s={max(ok) if ok else float('nan'):g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
