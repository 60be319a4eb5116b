#!/usr/bin/env bash
# GPU validation in one go, on a machine with one or more NVIDIA GPUs, using the binaries that
# scripts/bundle-gpu-check.sh put into .bundle/ (nothing is built or fetched here):
#   1. the `gpu` tests (replay on CUDA, calibration microbenchmarks);
#   2. `offsim calibrate --quick` → a fresh calibration profile;
#   3. replays of three example scenarios scaled with --layers to fit one GPU — no offload,
#      activation offload, optimizer offload with the CPU update — each compared with its
#      prediction from the fresh profile;
#   4. a summary table: step-time and peak-HBM error per scenario, and the bandwidth the replay's
#      offload copies reached against the calibrated host-link bandwidth.
# Budget: 8 minutes on one H200. It only reads the GPU's state (nvidia-smi -q); it never changes
# clocks, power, persistence, compute mode or MIG, and never resets the GPU.
#
#   scripts/gpu-check.sh [OUTDIR]        # default: $OUT, else ./gpu-check-out
#
# OUTDIR receives at most 6 files: summary.md, profile.json, comparisons.json, logs.txt,
# gpu.txt and timelines.tar.gz (predicted and measured timelines of every scenario).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-${OUT:-$root/gpu-check-out}}
bundle=${BUNDLE:-$root/.bundle}
layers=${LAYERS:-4}
system=${SYSTEM:-h200-1gpu}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log=$work/logs.txt
start=$(date +%s)

say() { echo "[gpu-check +$(( $(date +%s) - start ))s] $*" | tee -a "$log"; }

if [[ ! -x "$bundle/bin/offsim" ]]; then
  echo "gpu-check: no bundle at $bundle (run scripts/bundle-gpu-check.sh on a build machine)" >&2
  exit 2
fi

# The CUDA 13 libraries come from the machine: the toolkit's folders, else the pip wheels
# (nvidia-cublas, nvidia-nccl-cu13) of its Python.
libs=$bundle/lib
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d "$d" ]] && libs=$libs:$d
done
if command -v python3 >/dev/null; then
  for mod in nvidia.nccl nvidia.cublas nvidia.cuda_runtime; do
    p=$(python3 -c "import $mod, os; print(os.path.join(list($mod.__path__)[0], 'lib'))" 2>/dev/null) \
      && [[ -d "$p" ]] && libs=$libs:$p
  done
fi
# Debian 12's libstdc++ only where the machine's is older (it lacks GCC 12's GLIBCXX_3.4.30).
sys_stdcxx=$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 / {print $NF; exit}')
if [[ -z "$sys_stdcxx" ]] || ! grep -q GLIBCXX_3.4.30 "$sys_stdcxx" 2>/dev/null; then
  libs=$bundle/lib-compat:$libs
fi
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
offsim=$bundle/bin/offsim
# The CUDA device is the module next to the binaries; naming it spares the search.
export OFFSIM_GPU_PLUGIN=$bundle/bin/liboffsim_gpu.so

say "GPU state (read only)"
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm,power.limit,persistence_mode --format=csv; } \
  >"$out/gpu.txt" 2>&1 || echo "nvidia-smi not available" >>"$out/gpu.txt"
cat "$out/gpu.txt" >>"$log"

say "1/4 gpu tests"
tests_ok=1
timeout 150 "$bundle/bin/backends_cuda_replay_test" --gtest_brief=1 >>"$log" 2>&1 || tests_ok=0
# The quick calibration is run below through the CLI; the test's own copy of it is skipped here.
timeout 90 "$bundle/bin/calibrate_gpu_test" --gtest_brief=1 \
  --gtest_filter=-*QuickCalibrationFitsAProfile* >>"$log" 2>&1 || tests_ok=0

say "2/4 offsim calibrate --quick"
profile=$out/profile.json
cal_ok=1
timeout 200 "$offsim" calibrate --quick --gpus 1 --out "$profile" >>"$log" 2>&1 || cal_ok=0
profile_args=()
if (( cal_ok )) && [[ -s "$profile" ]]; then
  profile_args=(--profile "$profile")
else
  say "calibration failed: the predictions below use the built-in profile"
fi

say "3/4 replays (--layers $layers on $system)"
# name | scenario file | extra overrides
scenarios=(
  "no-offload|scenarios/examples/h100-1gpu-activation-offload.yaml|offload=none"
  "activation-offload|scenarios/examples/h100-1gpu-activation-offload.yaml|"
  "cpu-optimizer-offload|scenarios/examples/zero-offload-1gpu.yaml|"
)
names=()
for entry in "${scenarios[@]}"; do
  IFS='|' read -r name file extra <<<"$entry"
  sets=(--set "hardware.system=$system")
  [[ -n "$extra" ]] && sets+=(--set "$extra")
  say "  $name: $file ${extra:+($extra)}"
  # Scale to $layers layers: a catalogue model `model: NAME` becomes {base: NAME, layers: N}
  # (every layer shape kept); a scenario with a model map gets --layers instead.
  scaled=$work/$name.yaml
  layer_args=()
  if grep -Eq '^model:[[:space:]]*[A-Za-z0-9._-]+[[:space:]]*(#.*)?$' "$root/$file"; then
    sed -E "s/^model:[[:space:]]*([A-Za-z0-9._-]+).*$/model:\n  base: \1\n  layers: $layers/" \
      "$root/$file" >"$scaled"
  else
    cp "$root/$file" "$scaled"
    layer_args=(--layers "$layers")
  fi
  if timeout 100 "$offsim" replay "$scaled" "${sets[@]}" "${profile_args[@]}" "${layer_args[@]}" \
       --warmup 1 --steps 3 --device cuda \
       --out "$work/measured-$name.json" --predicted-out "$work/predicted-$name.json" \
       >>"$log" 2>&1 &&
     "$offsim" compare "$work/predicted-$name.json" "$work/measured-$name.json" --format json \
       >"$work/compare-$name.json" 2>>"$log"; then
    names+=("$name")
  else
    say "  $name failed (see logs.txt)"
  fi
done

say "4/4 summary"
python3 - "$work" "$profile" "$out/summary.md" "$out/comparisons.json" "${names[@]}" <<'PY' 2>>"$log"
import json, statistics, sys
work, profile_path, summary_path, comparisons_path, *names = sys.argv[1:]
try:
    profile = json.load(open(profile_path))
    h2d = profile["host_link"]["h2d_bytes_per_s"]["value"]
    d2h = profile["host_link"]["d2h_bytes_per_s"]["value"]
except Exception:
    profile, h2d, d2h = None, None, None

def copy_bandwidth(timeline, direction):
    """Bytes over time of the copies on the <rank>.<direction> lanes (sum of bytes / busy time)."""
    lanes = timeline["lanes"]
    moved = busy = 0
    for s in timeline["spans"]:
        if not lanes[s["lane"]].endswith("." + direction):
            continue
        op = timeline["ops"][s["op"]]
        if op["kind"] != "copy" or op["bytes"] <= 0:
            continue
        moved += op["bytes"]
        busy += s["end_ns"] - s["start_ns"]
    return moved / (busy * 1e-9) if busy else None

rows, all_cmp, step_errs, hbm_errs, bw_ratios = [], {}, [], [], []
for name in names:
    cmp = json.load(open(f"{work}/compare-{name}.json"))
    measured = json.load(open(f"{work}/measured-{name}.json"))
    all_cmp[name] = cmp
    step = cmp["step_relative_error"]
    step_errs.append(abs(step))
    hbm = [p for p in cmp["pools"] if p["pool"].endswith(".hbm")]
    hbm_err = max((abs(p["relative_error"]) for p in hbm), default=None)
    if hbm_err is not None:
        hbm_errs.append(hbm_err)
    bws = []
    for direction, cal in (("h2d", h2d), ("d2h", d2h)):
        bw = copy_bandwidth(measured, direction)
        if bw and cal:
            bws.append(f"{direction} {bw/1e9:.1f} GB/s = {100*bw/cal:.0f}%")
            bw_ratios.append(bw / cal)
    rows.append((name, cmp["predicted_step_ns"] / 1e6, cmp["measured_step_ns"] / 1e6, step,
                 hbm_err, "; ".join(bws) or "no offload copies"))

lines = ["| scenario | predicted step (ms) | measured step (ms) | step error | peak HBM error | offload copies vs calibrated |",
         "|---|---:|---:|---:|---:|---|"]
for n, p, m, e, h, b in rows:
    lines.append(f"| {n} | {p:.2f} | {m:.2f} | {100*e:+.1f}% | "
                 f"{'-' if h is None else f'{100*h:.2f}%'} | {b} |")
lines.append("")
if step_errs:
    med = statistics.median(step_errs)
    lines.append(f"median |step-time error| {100*med:.1f}% (target <= 5%: {'met' if med <= 0.05 else 'NOT met'})")
if hbm_errs:
    worst = max(hbm_errs)
    lines.append(f"largest |peak-HBM error| {100*worst:.2f}% (target <= 2%: {'met' if worst <= 0.02 else 'NOT met'})")
if bw_ratios:
    low = min(bw_ratios)
    lines.append(f"slowest offload copy direction at {100*low:.0f}% of the calibrated bandwidth "
                 f"(target >= 90%: {'met' if low >= 0.9 else 'NOT met'})")
if profile is None:
    lines.append("no fresh profile: predictions used the built-in profile")
text = "\n".join(lines) + "\n"
open(summary_path, "w").write(text)
json.dump(all_cmp, open(comparisons_path, "w"), indent=2)
print(text)
PY
[[ -s "$out/summary.md" ]] || echo "summary could not be written (python3 missing?)" >"$out/summary.md"

(cd "$work" && tar -czf "$out/timelines.tar.gz" predicted-*.json measured-*.json) 2>>"$log" || true
say "done in $(( $(date +%s) - start )) s; tests $([[ $tests_ok == 1 ]] && echo passed || echo FAILED), ${#names[@]}/3 scenarios replayed"
cp "$log" "$out/logs.txt"
cat "$out/summary.md"
(( tests_ok && cal_ok && ${#names[@]} == 3 )) || exit 1
