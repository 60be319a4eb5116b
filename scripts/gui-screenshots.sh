#!/usr/bin/env bash
# Regenerates the GUI screenshots in docs/images with the commands of gui/README.md: simulates
# the example scenarios with `offsim`, replays one on the CPU device, sweeps the ~2B example and
# renders each view with `offsim-gui --screenshot` (offscreen, no display needed).
#
#   scripts/gui-screenshots.sh [BUILD_DIR [OUT_DIR]]   # build/ci, docs/images; needs offsim and
#                                                     # offsim-gui built
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/ci}"
images="${2:-docs/images}"
mkdir -p "$images"
offsim="$build/scenarios/offsim"
gui="$build/gui/offsim-gui"
for exe in "$offsim" "$gui"; do
  [[ -x "$exe" ]] || { echo "gui-screenshots: $exe not built" >&2; exit 2; }
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$offsim" run scenarios/examples/llama3-70b-8xh200-activation-offload.yaml \
  --timeline-out "$work/l70.json" > /dev/null
"$offsim" replay scenarios/examples/h100-1gpu-activation-offload.yaml --device cpu --layers 4 \
  --steps 1 --warmup 0 --out "$work/measured.json" --predicted-out "$work/predicted.json" \
  > /dev/null
"$offsim" sweep scenarios/examples/2b-1xa100-sweep.yaml --out "$work/sweep.jsonl" --quiet

"$gui" --screenshot "$images"/gui_timeline.png --view timeline "$work/l70.json"
"$gui" --screenshot "$images"/gui_memory.png --view memory "$work/l70.json"
"$gui" --screenshot "$images"/gui_timeline_predicted_measured.png --view timeline \
  "$work/predicted.json" "$work/measured.json"
"$gui" --screenshot "$images"/gui_sweep.png --view sweep "$work/sweep.jsonl"
for name in timeline memory timeline_predicted_measured sweep; do
  [[ -s "$images/gui_$name.png" ]] || { echo "gui-screenshots: no gui_$name.png" >&2; exit 1; }
done
