"""Import time of a trace whose ``traceEvents`` array comes after a long value (issue 30):
``{"junk":"AAA…","traceEvents":[…]}``. Prints the time of each size and the ratio for 2x the size,
which is about 2 when the reader is linear (it was 3-4 and growing: ijson's string building).

    python benchmarks/junk_before_events.py [--mb 32] [--kind string|escapes|nested] [--gzip]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfscope.analysis.readers.kineto.parse import parse_trace

EVENTS = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": i, "dur": 1,
           "args": {"device": 0, "stream": 7, "correlation": i}} for i in range(100)]


def junk(kind: str, nbytes: int) -> bytes:
    if kind == "string":
        return b'"' + b"A" * nbytes + b'"'
    if kind == "escapes":
        return b'"' + b'\\"\\\\ab' * (nbytes // 6) + b'"'
    return json.dumps([[1, {"a": "]}"}]] * (nbytes // 16)).encode()


def write(folder: Path, kind: str, nbytes: int, gz: bool) -> Path:
    path = folder / f"junk-{kind}-{nbytes}.json{'.gz' if gz else ''}"
    text = b'{"junk":' + junk(kind, nbytes) + b',"traceEvents":' + json.dumps(EVENTS).encode() + b"}"
    path.write_bytes(gzip.compress(text, 1) if gz else text)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=32, help="size of the junk value (then twice that)")
    ap.add_argument("--kind", choices=["string", "escapes", "nested"], default="string")
    ap.add_argument("--gzip", action="store_true")
    args = ap.parse_args()
    times = []
    with tempfile.TemporaryDirectory(prefix="perfscope-junk-") as tmp:
        for scale in (1, 2):
            nbytes = int(args.mb * scale * (1 << 20))
            path = write(Path(tmp), args.kind, nbytes, args.gzip)
            start = time.perf_counter()
            trace = parse_trace(path)
            times.append(time.perf_counter() - start)
            assert trace.n_events == len(EVENTS), trace.n_events
            print(f"{args.kind} {nbytes / 2**20:.0f} MB{' (gzip ' + str(path.stat().st_size >> 10) + ' KB)' if args.gzip else ''}: "
                  f"{times[-1]:.2f} s, {nbytes / 2**20 / times[-1]:.0f} MB/s")
            path.unlink()
    print(f"ratio for 2x the size: {times[1] / times[0]:.2f} (linear: about 2)")


if __name__ == "__main__":
    main()
