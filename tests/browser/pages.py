"""The reports every page is checked on: the committed samples, the real H200 engine report, a
report imported from each kind of fixture, and a 1M-kernel nsys export tiled from a real one.

Each is built once per session. The 1M-kernel report goes through the real importer: the
benchmark's tiler (``benchmarks/ingest_nsys.py``) replicates a fixture's kernels in a temp copy.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from perfscope.analysis.readers.detect import import_file
from perfscope.report import Report
from tests.conftest import REPO, _fixtures_dir

TILED_KERNELS = 1_000_000
H200 = "h200/h200_llama1b_b1_p2048_g64.perfscope"
IMPORTED = {
    "import-kineto": "kineto/tracelens_h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "import-nsys": "nsys/nvfuser_h100_matmul.sqlite",
    "import-nsys-copies": "nsys/aws_t4_softmax.sqlite",
    "import-ncu-rep": "ncu/esmm_a10g_all_metrics.ncu-rep",
    "import-ncu-csv": "ncu/esmm_a10g_roofline_metrics.csv",
    "import-sglang": "thirdparty/tracelens_sglang_decode/sglang_Qwen3-8B_decode.json.gz",
    "import-server-metrics": "serving/vllm_metrics_llama2_7b_h100_bsc",
}
ENDPOINT = "endpoint/loadtest_endpoint_tiny_r4.perfscope"


def _sample(path: Path) -> Callable[[], Report]:
    return lambda: Report.load(path)


def _fixture(rel: str, load: bool = False) -> Callable[[], Report]:
    return lambda: Report.load(_fixtures_dir() / rel) if load else import_file(_fixtures_dir() / rel)


def tiled_nsys(kernels: int = TILED_KERNELS) -> Report:
    """A >= ``kernels``-kernel nsys export built from the nvFuser fixture, imported."""
    spec = importlib.util.spec_from_file_location("ingest_nsys", REPO / "benchmarks" / "ingest_nsys.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with tempfile.TemporaryDirectory(prefix="perfscope-tiled-") as tmp:
        path = Path(tmp) / "tiled.sqlite"
        bench.build(_fixtures_dir() / "nsys" / "nvfuser_h100_matmul.sqlite", path, kernels)
        return import_file(path)


def planted_loadtest() -> Report:
    """The engine's load test of docs/tails.md (every tenth prompt 480 tokens among 16-token prompts)
    on the simulated clock: its serving-tails section, bars, requests and finding."""
    import torch

    from perfscope.device import DeviceSpec
    from perfscope.engine.generate import build_model
    from perfscope.engine.serving import SimClock, TimedExecutor
    from perfscope.sessions.loadtest import LoadRun, run_loadtest

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory(prefix="perfscope-lens-") as tmp:
            lens = Path(tmp) / "lens.txt"
            lens.write_text("\n".join(["16"] * 9 + ["480"]) + "\n")
            run = LoadRun(model="tiny", rates=(100.0,), requests=30, prompt_len=str(lens), output_len="16",
                          max_batch=16, profile=False)
            return run_loadtest(run, model=build_model("tiny", seed=0), roofs=DeviceSpec("cpu", "cpu"),
                                clock_factory=SimClock, executor_wrap=lambda e, c: TimedExecutor(e, c))
    finally:
        torch.set_num_threads(threads)


PAGES: dict[str, Callable[[], Report]] = {
    **{f"sample-{p.name.removesuffix('.perfscope')}": _sample(p)
       for p in sorted((REPO / "sample_reports").glob("*.perfscope"))},
    "h200-engine": _fixture(H200, load=True),
    "endpoint-loadtest": _fixture(ENDPOINT, load=True),
    "engine-loadtest-tails": planted_loadtest,
    **{name: _fixture(rel) for name, rel in IMPORTED.items()},
    "tiled-1m": tiled_nsys,
}
"""Page name -> how to get its report."""


@functools.cache
def page_report(name: str) -> Report:
    """The report of page ``name``, built once per session."""
    return PAGES[name]()


@contextlib.contextmanager
def dashboard_servers(names: Iterable[str], report: Callable[[str], Report],
                      folder: Callable[[str], Path]) -> Iterator[dict[str, str]]:
    """One Dash app per report on 127.0.0.1 (each the app's only report, so it is the one shown):
    name -> URL; ``report(name)`` is saved into ``folder(name)``; the servers stop on exit."""
    import threading

    from werkzeug.serving import make_server

    from perfscope.dashboard.app import create_app

    urls, servers = {}, []
    try:
        for name in names:
            root = folder(name)
            report(name).save(root / f"{name}.perfscope")
            server = make_server("127.0.0.1", 0, create_app([root]).server, threaded=True)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            servers.append(server)
            urls[name] = f"http://127.0.0.1:{server.server_port}/"
        yield urls
    finally:
        for server in servers:
            server.shutdown()
