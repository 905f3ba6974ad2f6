"""What each exposed collective exchanged and in which pass (analysis/rules/collectives.py), and the exposed-comm
advice chosen from them: read from PyTorch's ``nccl:<collective>`` ranges, c10d operators and kernel names, the pass
from the range path or, where the collective's own path has none, the step's pass range around its launch."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.rules.collectives import (
    collective_kind,
    collective_pass,
    passes_by_time,
    unreliable_names,
)
from perfscope.analysis.rules.ranks import rank_findings

FILTER0 = "kineto/hta_trace_filter__sampled_rank-0.json.gz"
NEGATIVE = "kineto/hta_negative_queue_length_values_check__rank0.json.gz"
SENDRECV = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"


@pytest.mark.parametrize(("name", "op", "path", "kind", "source"), [
    (SENDRECV, "record_param_comms", "ProfilerStep#1/## forward ##/## alltoall_fwd_single ##/nccl:all_to_all",
     "all_to_all", "range"),
    (SENDRECV, "c10d::_allgather_base_", "## reduce_scatter_base_bw (all_gather) ##/nccl:_all_gather_base",
     "all_gather", "range"),
    (SENDRECV, "c10d::_reduce_scatter_base_", None, "reduce_scatter", "op"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", None, None, "all_reduce", "name"),
    ("ncclKernel_ReduceScatter_RING_LL_Sum_float", None, None, "reduce_scatter", "name"),
    ("ncclDevKernel_Broadcast_RING_LL", None, None, "broadcast", "name"),
    (SENDRECV, None, None, "send_recv", "name"),
    ("some_comm_kernel", None, None, "unknown", "none"),
])
def test_collective_kind_from_the_range_then_the_op_then_the_kernel(name, op, path, kind, source) -> None:
    assert collective_kind(name, op, path) == (kind, source)


def test_collective_pass_from_the_innermost_segment_that_names_one() -> None:
    assert collective_pass("record_param_comms", "ProfilerStep#1/## forward ##/DistributedDataParallel.forward/"
                           "## alltoall_fwd_single ##/nccl:all_to_all") == "forward"
    assert collective_pass(None, "ProfilerStep#2/## optimizer ##/Optimizer.step#Shampoo.step/nccl:_all_gather_base") \
        == "optimizer"
    assert collective_pass(None, "## backward ##/## alltoall_bwd_single ##/nccl:all_to_all") == "backward"
    assert collective_pass("record_param_comms", "nccl:all_reduce") == "unknown"
    assert collective_pass(None, "ProfilerStep#551/## sdd_preprocess_splits ##/nccl:all_to_all") == "unknown"


def test_a_kernel_name_the_trace_shows_running_other_collectives_is_not_evidence() -> None:
    """NCCL versions that run every collective as ncclKernel_SendRecv: a SendRecv kernel that no range or op names is
    of unknown kind there; where no SendRecv kernel is named otherwise, the name stands."""
    kinds = [collective_kind(SENDRECV, "record_param_comms", "nccl:all_reduce"), collective_kind(SENDRECV)]
    assert unreliable_names(kinds, [SENDRECV, SENDRECV]) == {SENDRECV}
    assert unreliable_names([collective_kind(SENDRECV)], [SENDRECV]) == set()


def test_passes_by_time_the_outermost_pass_range_on_any_thread() -> None:
    ranges = pd.DataFrame({
        "name": ["## forward ##", "DistributedDataParallel.forward", "## backward ##",
                 "autograd::engine::evaluate_function: MmBackward0", "## optimizer ##", "## forward ##"],
        "path": ["Step#1/## forward ##", "Step#1/## forward ##/DistributedDataParallel.forward", "Step#1/## backward ##",
                 "autograd::engine::evaluate_function: MmBackward0", "Step#1/## optimizer ##", "Step#2/## forward ##"],
        "start_ns": [0, 10, 100, 150, 300, 250], "end_ns": [90, 80, 290, 160, 350, 320]})
    t = np.array([5.0, 85.0, 95.0, 155.0, 200.0, 310.0, 400.0])
    # 95 lies in no range; 310 in a forward and an optimizer range at once (overlapping threads): not told
    assert passes_by_time(ranges, t).tolist() == ["forward", "forward", "unknown", "backward", "backward", "unknown",
                                                  "unknown"]


def test_exposed_comm_advice_follows_each_collectives_kind_and_pass(load) -> None:
    """TorchRec DLRM-style training (HTA's sampled rank 0): the exposed time is all-to-all in the forward pass,
    the sharded optimizer's all-gather, and DDP's all-reduce, launched from its reducer inside ## backward ##."""
    (f,) = [f for f in rank_findings(load(FILTER0)) if f.id == "exposed-comm"]
    by = {(i.attrs["kind"], i.attrs["pass"]): i for i in f.items}
    assert set(by) >= {("all_to_all", "forward"), ("all_gather", "optimizer"), ("all_reduce", "backward")}
    assert by[("all_reduce", "backward")].attrs["pass_by_time"] and not by[("all_to_all", "forward")].attrs["pass_by_time"]
    assert sum(i.time_ns for i in f.items) == pytest.approx(f.time_at_stake_ns, rel=1e-6)
    rec = f.recommendation
    assert "all-to-all in the forward pass: all-to-all exchanges" in rec and "TrainPipelineSparseDist" in rec
    assert "all-gather in the optimizer pass: all-gather in the optimizer step" in rec
    assert "all-reduce in the backward pass (by time: inside its range): gradient all-reduce" in rec
    assert rec.index("all-to-all") < rec.index("bucket_cap_mb")  # the largest first


def test_exposed_comm_unnamed_sendrecv_is_not_called_point_to_point(load) -> None:
    """Every collective of this trace runs as ncclKernel_SendRecv; the one no range or operator names is of unknown
    kind, and its advice says how to record it instead of giving pipeline-parallel advice."""
    (f,) = [f for f in rank_findings(load(NEGATIVE)) if f.id == "exposed-comm"]
    kinds = {i.attrs["kind"] for i in f.items}
    assert "send_recv" not in kinds and "unknown" in kinds
    unknown = [i for i in f.items if i.attrs["kind"] == "unknown"]
    assert not any(i.explains for i in unknown) and "record them with torch.profiler" in f.recommendation
    assert "1F1B" not in f.recommendation
    ar = [i for i in f.items if i.attrs["kind"] == "all_reduce"]
    assert ar and all(i.attrs["pass"] == "backward" for i in ar)


def test_passes_by_time_each_rank_its_own_ranges() -> None:
    ranges = pd.DataFrame({"name": ["## backward ##", "## forward ##"], "path": ["s/## backward ##", "s/## forward ##"],
                           "start_ns": [0, 0], "end_ns": [100, 100], "rank": [0, 1]})
    assert passes_by_time(ranges, np.array([50.0, 50.0, 50.0]), np.array([0, 1, 2])).tolist() == [
        "backward", "forward", "unknown"]
