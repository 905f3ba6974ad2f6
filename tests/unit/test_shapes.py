"""The one ``op_shapes`` parser (perfscope/shapes.py), on every form the readers and tables write: Kineto's compact
JSON (tensor lists included), TraceLens's JSON with spaces and its Python tuples; memoized per distinct string."""

from __future__ import annotations

import ast
import json

import pandas as pd
import pytest

from perfscope.device_models import gemm_shape_class
from perfscope.shapes import parse_shapes, shapes_text, tensor_shapes

KINETO = ("kineto/tracelens_h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
          "thirdparty/tracelens_sglang_decode/sglang_Qwen3-8B_decode.json.gz",
          "kineto/kineto_resnet50_v100_2021.pt.trace.json.gz")


def _frozen(v):
    return tuple(_frozen(x) for x in v) if isinstance(v, (list, tuple)) else v


@pytest.mark.parametrize("name", KINETO)
def test_every_kineto_shapes_text_reads_as_its_json(load, name) -> None:
    """Every distinct ``op_shapes`` of the kernel table: the parse is its JSON, lists as tuples (tensor lists too)."""
    texts = load(name).kernels["op_shapes"].dropna().unique()
    assert len(texts) > 0
    for t in texts:
        assert parse_shapes(t) == _frozen(json.loads(t)), t
    nested = [t for t in texts if "[[[" in t or ",[[" in t]
    if name.startswith("thirdparty"):  # sglang's fused ops take tensor lists: kept as one entry, not a tensor
        assert nested and all(tensor_shapes(t) for t in nested)
        t = nested[0]
        assert [len(e) for e in parse_shapes(t)] == [len(e) for e in json.loads(t)]
        assert all(s == () or all(isinstance(d, int) for d in s) for s in tensor_shapes(t))


def test_tracelens_tables_spaces_and_tuples(fixtures_dir) -> None:
    """TraceLens's perf reports: ``gemm_kernel_times.csv`` writes JSON with spaces, ``ops_unique_args.csv``
    Python tuples; both read as the literal they are."""
    gemm = pd.read_csv(fixtures_dir / "crossgpu/tracelens_perf_report_gemms_h100_vs_mi300/gemm_kernel_times.csv")
    args = pd.read_csv(fixtures_dir / "thirdparty/tracelens_sglang_decode/perf_csvs/ops_unique_args.csv")
    tuples = [t for t in args["Input Dims"].dropna().unique() if t.startswith("((")]
    assert tuples
    for t in [*gemm["Input Dims_first"].unique(), *tuples]:
        assert parse_shapes(t) == _frozen(ast.literal_eval(t)), t
    assert parse_shapes("[[8944, 1024], [1024, 2816]]") == parse_shapes("((8944, 1024), (1024, 2816))") == (
        (8944, 1024), (1024, 2816))
    assert gemm_shape_class("aten::mm", "((8944, 1024), (1024, 2816))") == "square"


def test_not_shapes_and_the_words() -> None:
    for bad in (None, float("nan"), "", "  ", "not shapes", "5", "{}", "[[1,2]"):
        assert parse_shapes(bad) is None and tensor_shapes(bad) == [] and shapes_text(bad) is None, bad
    assert tensor_shapes("[[8,2,38],[[1],[2]],[],[1.5]]") == [(8, 2, 38), (), (), ()]
    assert shapes_text("[[8,2,38],[8,38,128],[]]") == "8x2x38, 8x38x128"
    assert shapes_text("[[1],[2],[3],[4]]") == "1, 2, 3"


def test_memoized_per_distinct_string() -> None:
    from perfscope.shapes import _parse

    text = "[[12345,678],[678,91011]]"
    before = _parse.cache_info()
    first = parse_shapes(text)
    again = parse_shapes(text[:13] + text[13:])  # an equal string, another object
    after = _parse.cache_info()
    assert first is again and after.misses == before.misses + 1 and after.hits == before.hits + 1
    with pytest.raises(AttributeError):
        first.append(())  # the memoized value cannot be changed by a caller
