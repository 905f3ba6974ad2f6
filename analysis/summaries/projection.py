"""A projected report's whole run and its kernel families, with their bands, as rows every output shows
(the terminal, ``whatif``, the HTML report, the dashboard): read from the manifest's ``projection`` record
(:mod:`perfscope.analysis.projection.devices` writes it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perfscope.format import banded, pct, seconds

if TYPE_CHECKING:
    from collections.abc import Mapping

    from perfscope.report import Report

WHOLE_RUN = (("kernel_time_s", "kernel time"), ("busy_s", "busy time"), ("wall_s", "wall time"))


def projection_of(report: Report) -> Mapping[str, Any] | None:
    """The report's ``projection`` record (None for a measured report)."""
    return report.manifest.get("projection") or None


def band_line(projection: Mapping[str, Any]) -> str:
    """What the bands are, in one line: their name, the vendor pair and the models used (stand-ins said)."""
    band = projection.get("band") or {}
    models = projection.get("device_models") or {}
    pair = band.get("vendor_pair")
    share = band.get("validated_share") or 0.0
    if not share:
        why = ("the same GPU at other shapes" if not models.get("moves") and (models.get("source") or {}).get("device")
               == (models.get("target") or {}).get("device") else f"{pair or 'this GPU pair'}")
        return f"band: unvalidated ({why} was never validated: docs/whatif.md)"
    used = []
    for side in ("source", "target"):
        m = models.get(side) or {}
        if m:
            used.append(f"{m.get('device')}" + (f" (stand-in: {m.get('model')})" if m.get("stand_in") else ""))
    covered = "" if share >= 0.999 else f"; it covers {share:.0%} of the projected kernel time, the rest unvalidated"
    return (f"band: {band.get('text')} of {pair} projections (device models {' -> '.join(used)}{covered}; "
            "docs/whatif.md)")


def whole_run_rows(projection: Mapping[str, Any]) -> list[dict[str, str]]:
    """Kernel, busy and wall time of the whole run: measured, projected with its band."""
    whole = projection.get("whole_run") or {}
    rows = []
    for key, label in WHOLE_RUN:
        v = whole.get(key) or {}
        if v:
            rows.append({"whole run": label, "measured": seconds(v.get("measured")),
                         "projected (band)": banded(v.get("projected"), v.get("low"), v.get("high"))})
    return rows


def family_rows(projection: Mapping[str, Any]) -> list[dict[str, str]]:
    """The whole run by kernel family: measured, projected with its band, its share and the rule used."""
    return [{"family": r["family"], "kernels": str(r["kernels"]), "measured": seconds(r["measured_s"]),
             "projected (band)": banded(r["projected_s"], r.get("low_s"), r.get("high_s")),
             "share": pct(100.0 * r["share"]), "rule": r["rule"]} for r in projection.get("families") or ()]


def text_table(rows: list[dict[str, str]], indent: str = "  ") -> list[str]:
    """Rows as aligned text lines (a header, then one line per row)."""
    if not rows:
        return []
    cols = list(rows[0])
    width = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    lines = [indent + "  ".join(c.ljust(width[c]) if i == 0 else c.rjust(width[c]) for i, c in enumerate(cols))]
    for r in rows:
        lines.append(indent + "  ".join(r[c].ljust(width[c]) if i == 0 else r[c].rjust(width[c])
                                        for i, c in enumerate(cols)))
    return lines


def projection_lines(projection: Mapping[str, Any]) -> list[str]:
    """The whole run, the families and the band, as terminal lines."""
    return [*text_table(whole_run_rows(projection)), *text_table(family_rows(projection)),
            "  " + band_line(projection)]


__all__ = ["band_line", "family_rows", "projection_lines", "projection_of", "text_table", "whole_run_rows"]
