"""``perfscope profile --stack -- python SCRIPT`` and ``perfscope.profile(stack=True)`` record the
script's nn.Module calls: the report's tree has one collapsed row for the repeated blocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfscope.analysis.summaries.hierarchy import hierarchy
from perfscope.cli import main
from perfscope.report import Report

SCRIPT = """
import torch
from torch import nn
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 64)
    def forward(self, x):
        return x + self.proj(x)
model = nn.Sequential(*[Block() for _ in range(4)]).eval()
with torch.no_grad():
    model(torch.randn(2, 64))
"""


def test_profile_stack_gives_the_module_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "blocks.py"
    script.write_text(SCRIPT)
    out = tmp_path / "r.perfscope"
    assert main(["profile", "--stack", "--no-html", "-q", "--out", str(out), "--", "python", str(script)]) == 0
    report = Report.load(out)
    mods = report.ranges[report.ranges["source"] == "module"]
    assert sorted(mods["name"][mods["name"].str.startswith("Block_")]) == [f"Block_{i}" for i in range(4)]
    tree = hierarchy(report)
    assert tree.source == "module"
    blocks = tree.nodes[tree.nodes["name"] == "Block ×4"]
    assert len(blocks) == 1 and blocks["instances"].iat[0] == 4
    linear = tree.nodes[(tree.nodes["parent"] == blocks["node"].iat[0]) & (tree.nodes["name"] == "Linear")]
    assert linear["flops"].iat[0] == pytest.approx(4 * 2 * 2 * 64 * 64, rel=0.01)  # 4 blocks x 2*M*N*K (+ bias)
    assert main(["profile", "--stack", "--out", str(tmp_path / "x.perfscope")]) != 0
    assert "--stack records a Python script" in capsys.readouterr().err


def test_notebook_profile_stack() -> None:
    import torch

    import perfscope
    from perfscope.device import DeviceSpec

    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 32))
    with perfscope.profile(roofs=DeviceSpec("cpu", "cpu"), stack=True) as run:
        model(torch.randn(4, 32))
    assert run.report.hierarchy()["name"].str.startswith("Sequential").any()
    with perfscope.profile(roofs=DeviceSpec("cpu", "cpu")) as run:
        model(torch.randn(4, 32))
    assert hierarchy(run.report).source != "module"
