"""Component ids of the Dash app, in one place (layout and callbacks both import them)."""

from __future__ import annotations

REPORT = "report-picker"
TABS = "view-tabs"
STATUS = "status-line"

OVERVIEW = "overview-body"
FINDINGS = "overview-findings"  # filled after the overview (the rules are the slow part on a big report)
FINDING_PICK = "finding-pick"  # pattern-matching id type: {"type": FINDING_PICK, "index": i, "view": "timeline"|"kernels"}
FINDING_SELECTION = "finding-selection"  # dcc.Store: what the clicked finding selects (views.finding_selection)
FINDING_NOTE = "finding-note"  # the line above the tabs that names the selected finding
FINDING_CLEAR = "finding-clear"

TIMELINE = "timeline-graph"
TIMELINE_RESET = "timeline-reset"
IDLE_FIGURE = "idle-causes"  # the timeline tab: idle time per cause (figures.idle_causes); click a bar for its gaps
IDLE_GAPS = "idle-gaps"
TIMELINE_ZOOM = "timeline-zoom"  # dcc.Store: the last zoom relayout of the timeline (callbacks.TIMELINE_ZOOM_JS fills it)

ROOFLINE = "roofline-graph"
ROOF_PER = "roofline-per"
ROOF_COLOR = "roofline-color"
ROOF_PHASE = "roofline-phase"
ROOF_RANGE = "roofline-range-filter"
ROOF_NAME = "roofline-name-filter"
DETAILS = "roofline-details"

KERNEL_GRID = "kernel-grid"
KERNEL_MODE = "kernel-mode"
KERNEL_FILTER = "kernel-filter"
KERNEL_NOTE = "kernel-note"
KERNEL_EXPORT = "kernel-export"
KERNEL_DOWNLOAD_BTN = "kernel-download-button"
KERNEL_DOWNLOAD = "kernel-download"

PHASE_FIGURE = "phase-breakdown"
STEP_FIGURE = "step-times"
LATENCY_FIGURE = "latency-distributions"
LOAD_FIGURES = "load-figures"  # perfscope loadtest reports: figures_load.load_figures
PHASE_TABLE = "phase-metrics"
TAILS_TABLE = "tails-table"  # load tests: the p50 and p99 with their parts (figures.tails)
TAILS_FIGURE = "tails-figure"
TAIL_REQUESTS = "tail-requests"  # every request by arrival and E2E; click one for its timeline
REQUEST_TIMELINE = "request-timeline"

COUNTERS = "counters-graph"
MEMORY = "memory-graph"
MEMORY_LIVE = "memory-live"

COMPARE_A = "compare-a"
COMPARE_B = "compare-b"
COMPARE_FIGURE = "compare-graph"
COMPARE_TABLE = "compare-table"

TREE_FIGURE = "tree-graph"  # the hierarchy tab (figures_tree.tree_figure); click a node to filter
TREE_PHASE = "tree-phase"
TREE_EXPAND = "tree-expand"  # repeated layers: one collapsed box, or every instance
TREE_ROOFLINE = "tree-roofline"
TREE_GRID = "tree-kernels"
TREE_NOTE = "tree-note"

RANKS_METRIC = "ranks-metric"  # the ranks tab (multi-rank reports): which rank x step heat map
RANKS_HEATMAP = "ranks-heatmap"  # click a cell: that rank's step below
RANKS_NOTE = "ranks-note"
RANKS_STEP = "ranks-step"  # the clicked rank's step, as a timeline

VIEWS = ("overview", "timeline", "roofline", "kernels", "tree", "phases", "ranks", "counters", "compare")
