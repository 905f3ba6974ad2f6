"""Each device named right: AMD devices speak AMD (CU, wavefront, matrix core, gpu:N) in every output;
a trace's own device name wins over "host"; a trace with no GPU work says what it is."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from perfscope.analysis.findings import run_rules
from perfscope.analysis.readers.detect import import_file
from perfscope.cli import main
from perfscope.device import DeviceSpec
from perfscope.text_report import render_text
from perfscope.vocab import device_label, device_record, is_amd_device, speak

SGLANG = "thirdparty/tracelens_sglang_decode/sglang_Qwen3-8B_decode.json.gz"  # AMD Instinct MI300X, device 9
MI250 = "kineto/hta_amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz"  # "AMD Radeon Graphics", no HIP keys
B200 = "kineto/tracelens_b200__eager_trace.json.gz"
NVIDIA_WORDS = re.compile(r"\b(SMs?|warps?|tensor[- ]cores?|cuda:\d+)\b")


def test_speak_changes_words_not_names() -> None:
    amd, nv = DeviceSpec("AMD Instinct MI300X", "rocm"), DeviceSpec("NVIDIA H100", "cuda")
    text = "launch enough blocks to cover every SM; 4 warps per SM on cuda:3 run warp_reduce_kernel on tensor cores"
    assert speak(text, amd) == ("launch enough blocks to cover every CU; 4 wavefronts per CU on gpu:3 run "
                                "warp_reduce_kernel on matrix cores")
    assert speak(text, nv) == text and speak(text, None) == text
    assert device_label(9, amd=True) == "gpu:9" and device_label(0, amd=False) == "cuda:0"
    assert is_amd_device("AMD Radeon Graphics") and is_amd_device(None, {"warpSize": 64})
    assert not is_amd_device("NVIDIA GB10", {"warpSize": 32})
    assert device_record(amd)["unit"] == "CU" and device_record(nv)["thread_group"] == "warp"


def test_the_sglang_mi300x_trace_speaks_amd_everywhere(fixtures_dir: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    report = import_file(fixtures_dir / SGLANG)
    assert report.device.kind == "rocm"
    assert set(report.kernels["device"].astype(str)) == {"gpu:9"}  # decided at import
    text = render_text(report)
    assert not NVIDIA_WORDS.search(text), NVIDIA_WORDS.search(text)
    assert "304 CUs" in text and "gpu:9" in text
    # the datasheet's source sentence is said once, not once per roof (9 roofs)
    assert text.count("AMD Instinct MI300X accelerator datasheet") == 1
    for f in run_rules(report):
        assert not NVIDIA_WORDS.search(f.title + " " + f.recommendation), f.id
    out = tmp_path / "sg.perfscope"
    assert main(["import", str(fixtures_dir / SGLANG), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["analyze", str(out), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    dev = payload["device"]
    assert (dev["vendor"], dev["unit"], dev["unit_count"], dev["thread_group"]) == ("amd", "CU", 304, "wavefront")
    assert not NVIDIA_WORDS.search(json.dumps({k: payload[k] for k in ("device", "top_kernels", "findings")}))
    html = (out / "report.html").read_text()
    visible = re.sub(r"<[^>]+>", " ", re.sub(r"<script.*?</script>", "", html, flags=re.DOTALL))
    assert not NVIDIA_WORDS.search(visible), NVIDIA_WORDS.search(visible)
    assert visible.count("AMD Instinct MI300X accelerator datasheet") == 1


def test_an_amd_trace_without_hip_metadata_is_still_amd(fixtures_dir: Path) -> None:
    report = import_file(fixtures_dir / MI250)
    assert report.device.kind == "rocm" and report.device.name == "AMD Radeon Graphics"
    assert report.kernels["device"].astype(str).str.startswith("gpu:").all()
    note = next(w for w in report.warnings if "datasheet roofs of" in w)
    # 104 CUs of gfx90a with 64 GiB: one MI250 GCD or an MI210, whose figures agree; the note names both
    assert "MI250 (per GCD) or MI210" in note and "104 CUs" in note and "SMs" not in note
    assert report.device.peak_flops("fp16") == 181.0e12 and report.device.peak_bandwidth("dram") == 1638.4e9
    assert not NVIDIA_WORDS.search(render_text(report))


def test_nvidia_traces_keep_their_words(fixtures_dir: Path) -> None:
    report = import_file(fixtures_dir / B200)
    assert report.device.kind == "cuda" and report.kernels["device"].astype(str).str.startswith("cuda:").all()
    assert "148 SMs" in render_text(report)


# ------------------------------------------------------------------ a process with no GPU work
def _frontend_trace(folder: Path) -> Path:
    """A vLLM API-server (AsyncLLM) process's Kineto trace as torch.profiler writes it with
    with_stack=True: Python events and CPU ops, no kernels, and the GPU it saw in deviceProperties."""
    events, ts = [], 1_000.0
    stack = ["vllm/entrypoints/openai/api_server.py(1200): create_chat_completion",
             "vllm/v1/engine/async_llm.py(310): generate", "vllm/v1/engine/async_llm.py(420): add_request",
             "vllm/v1/engine/core_client.py(890): add_request_async", "zmq/asyncio.py(120): send_multipart"]
    for req in range(20):
        for depth, name in enumerate(stack):
            events.append({"ph": "X", "cat": "python_function", "name": name, "pid": 100, "tid": 100,
                           "ts": ts + depth, "dur": 400.0 - 10 * depth,
                           "args": {"Python id": req * 10 + depth + 1,
                                    "Python parent id": req * 10 + depth if depth else 0}})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 100, "tid": 100,
                       "ts": ts + 50, "dur": 5.0, "args": {"External id": req + 1, "Input Dims": [[16]],
                                                           "Input type": ["long int"]}})
        events.append({"ph": "X", "cat": "user_annotation", "name": "AsyncLLM.generate", "pid": 100,
                       "tid": 100, "ts": ts, "dur": 450.0, "args": {}})
        ts += 1_000.0
    trace = {"schemaVersion": 1, "with_stack": 1, "record_shapes": 1, "cuda_runtime_version": 12080,
             "deviceProperties": [{"id": 0, "name": "NVIDIA GB10", "totalGlobalMem": 128_000_000_000,
                                   "computeMajor": 12, "computeMinor": 1, "numSms": 48, "warpSize": 32}],
             "traceEvents": events, "displayTimeUnit": "ms", "baseTimeNanoseconds": 1_700_000_000_000_000_000}
    path = folder / "spark_12345.1700000000000.pt.trace.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump(trace, fh)
    (folder / "rank0.1700000000001.pt.trace.json.gz").write_bytes(b"")  # the engine core's, beside it
    return path


def test_a_vllm_frontend_trace_says_what_it_is_and_where_the_gpu_work_is(tmp_path: Path) -> None:
    report = import_file(_frontend_trace(tmp_path))
    assert report.device.name == "NVIDIA GB10" and report.device.kind == "cuda"  # not "CPU (host of the trace)"
    assert report.device.properties["gpu_work"] is False and not report.device.compute
    warning = next(w for w in report.warnings if w.startswith("no GPU work in this trace"))
    assert "vLLM frontend" in warning and "rank0.*.pt.trace.json.gz" in warning
    assert "rank0.1700000000001.pt.trace.json.gz" in warning and "AsyncLLM" in warning
    assert report.params["with_stack"] and report.params["python_events"] == 100
    text = render_text(report)
    assert "with_stack=True" not in text and "CPU (host of the trace)" not in text
    from perfscope.text_tree import render_tree

    assert "with_stack=True" not in render_tree(report)
    assert not any("no device roofs known" in w for w in report.warnings)  # nothing ran on the GPU here
    findings = run_rules(report)
    first = findings[0]  # what the file is comes before what to fix in it
    assert first.id == "no-gpu-work" and "vLLM frontend" in first.title
    assert "rank0.*.pt.trace.json.gz" in first.recommendation
    # its items: the operators it ran and the reader's note that names where the GPU work is
    assert f"{len(report.kernels):,} CPU operators, no GPU kernel" in first.items[0].label
    assert "rank0.1700000000001.pt.trace.json.gz" in first.items[1].label
    assert not any(f.id == "roofline-unchecked" for f in findings)  # GB10 is listed; nothing ran on it here


def test_a_cpu_trace_with_no_device_is_the_host(fixtures_dir: Path) -> None:
    path = fixtures_dir / "kineto/hta_cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
    report = import_file(path)
    with gzip.open(path, "rt") as fh:
        props = json.load(fh).get("deviceProperties")
    if props and props[0].get("name"):
        assert report.device.name == props[0]["name"]  # the trace's name wins
    else:
        assert report.device.kind == "cpu" and report.device.name == "CPU (host of the trace)"
