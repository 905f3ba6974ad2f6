#!/usr/bin/env bash
# outputs_snapshot.sh DIR: what perfscope prints and writes for a report of every fixture format,
# into DIR, to diff two trees' behaviour (tools/relayout.py: before and after the move).
#
# For every profiler output under tests/fixtures (kineto, nsys, ncu, the H200 captures, the
# third-party traces) and every report folder (tests/fixtures/h200/*.perfscope, sample_reports/):
#   NAME.import.txt   `perfscope import FILE --out WORK/NAME.perfscope --no-html` (stdout, stderr, exit)
#   NAME.manifest.json the imported report's manifest, its creation time masked
#   NAME.analyze.json `perfscope analyze REPORT --json` (stdout, then stderr and the exit code)
#   NAME.html         `perfscope report REPORT --cdn` (plotly.js from its CDN: the rest of the page
#                     byte for byte; inlining would add the same 4.6 MB of plotly.js to every file)
# Reports are imported under one fixed WORK folder, so that two runs print the same paths.
# Masked, because they differ by nature: the manifest's `created` (import time), and the same
# timestamp where the HTML or the JSON prints it. Usage: tools/outputs_snapshot.sh /tmp/before
set -uo pipefail
out=${1:?usage: tools/outputs_snapshot.sh DIR}
cd "$(dirname "$0")/.."
FIX=${PERFSCOPE_FIXTURES:-tests/fixtures}
WORK=/tmp/perfscope-snapshot-work
rm -rf "$WORK" && mkdir -p "$WORK" "$out"
mask() {  # ISO timestamps of the import (manifest `created`) -> <created>
  sed -E 's/"created": ?"[^"]*"/"created": "<created>"/g; s/[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(\+00:00|Z)?/<time>/g'
}
one() {  # one NAME REPORT: analyze and report an existing report folder
  local name=$1 rep=$2
  { perfscope analyze "$rep" --json 2>&1; echo "exit: $?"; } | mask > "$out/$name.analyze.json"
  { perfscope report "$rep" --cdn --force -o "$WORK/$name.html" 2>&1; echo "exit: $?"; } | mask > "$out/$name.report.txt"
  [ -f "$WORK/$name.html" ] && mask < "$WORK/$name.html" > "$out/$name.html"
}
files=$(find "$FIX/kineto" "$FIX/nsys" "$FIX/ncu" "$FIX/h200" "$FIX/thirdparty" -type f \
          \( -name '*.json' -o -name '*.json.gz' -o -name '*.sqlite' -o -name '*.ncu-rep' -o -name '*.ncu-rep.gz' -o -name '*.csv' \) \
          -not -path '*/perf_csvs/*' -not -path '*.perfscope/*' -not -name 'execution_details.json' | sort)
for f in $files; do
  name=$(echo "${f#"$FIX"/}" | tr '/' '__')
  { perfscope import "$f" --out "$WORK/$name.perfscope" --no-html --force 2>&1; echo "exit: $?"; } | mask > "$out/$name.import.txt"
  if [ -f "$WORK/$name.perfscope/manifest.json" ]; then
    mask < "$WORK/$name.perfscope/manifest.json" > "$out/$name.manifest.json"
    one "$name" "$WORK/$name.perfscope"
  fi
  echo "$name" >&2
done
for rep in "$FIX"/h200/*.perfscope sample_reports/*.perfscope; do
  name=report__$(basename "$rep")
  cp -r "$rep" "$WORK/$name"
  one "$name" "$WORK/$name"
  echo "$name" >&2
done
rm -rf "$WORK"
echo "outputs_snapshot: $(ls "$out" | wc -l) files in $out"
