#!/usr/bin/env bash
# GPU validation in one go, on a machine with one or more NVIDIA GPUs, using the binaries that
# scripts/bundle-gpu-check.sh put into .bundle/ (nothing is built or fetched here):
#   0. preflight: the CUDA 13 libraries the GPU module needs are found, and a GPU is visible;
#      then a first look (45 s at most): attention throughput and the pool's high-water marks;
#   1. the `gpu` tests (replay on CUDA, calibration microbenchmarks);
#   2. `offsim calibrate --quick` → a fresh calibration profile;
#   3. replays of three example scenarios scaled with --layers to fit one GPU — no offload,
#      activation offload, optimizer offload with the CPU update — each compared with its
#      prediction from the fresh profile;
#   4. where the machine's python3 has PyTorch: sustained GEMM and attention throughput with the
#      clocks and power they ran at (scripts/gpu-sustained.py, 75 s at most);
#   5. a summary table: step-time and peak-HBM error per scenario, and the bandwidth the replay's
#      offload copies reached against the calibrated host-link bandwidth.
# Budget: 8 minutes in all (BUDGET_S). Every stage runs under `timeout`, capped by its own limit
# and by what is left of the budget, so a hang costs one stage, never the device time; the log
# and the summary are written into OUTDIR as the run goes, so a run killed from outside still
# leaves them. It only reads the GPU's state (nvidia-smi queries); it never changes clocks,
# power, persistence, compute mode or MIG, and never resets the GPU.
#
#   scripts/gpu-check.sh [OUTDIR]        # default: $OUT, else build/gpu-check-out (ignored)
#   REPLAY_DEVICE=cpu scripts/gpu-check.sh /tmp/rehearsal   # no GPU: rehearse every stage,
#                                                           # replaying on the CPU device
#
# OUTDIR receives at most 7 files: summary.md, profile.json, comparisons.json, logs.txt,
# gpu.txt, timelines.tar.gz (predicted and measured timelines of every scenario) and
# sustained.json.
# Exit status: 0 all stages passed; 1 a stage failed; 2 no bundle; 3 no usable GPU.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-${OUT:-$root/build/gpu-check-out}}
bundle=${BUNDLE:-$root/.bundle}
layers=${LAYERS:-4}
system=${SYSTEM:-h200-1gpu}
budget_s=${BUDGET_S:-480}
device=${REPLAY_DEVICE:-cuda}
reserve_s=15 # kept back for the summary and the archive
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A rerun into the same folder starts clean: no summary or profile of an earlier run survives.
rm -f "$out"/{summary.md,profile.json,comparisons.json,logs.txt,gpu.txt,timelines.tar.gz,sustained.json}
log=$out/logs.txt
: >"$log"
start=$(date +%s)

say() { echo "[gpu-check +$(($(date +%s) - start))s] $*" | tee -a "$log"; }

# Runs "$@" with its output in the log, under `timeout` at min(CAP, what the budget has left).
# Returns the command's status; 124 when it timed out, 125 when no time was left to start it.
run_stage() {
  local name=$1 cap=$2
  shift 2
  local left=$((budget_s - ($(date +%s) - start) - reserve_s))
  ((left < cap)) && cap=$left
  if ((cap < 5)); then
    say "  $name: skipped, the ${budget_s} s budget is spent"
    return 125
  fi
  echo "--- $name (limit ${cap} s): $*" >>"$log"
  timeout -k 10 "$cap" "$@" >>"$log" 2>&1
  local rc=$?
  if ((rc == 124 || rc == 137)); then
    say "  $name: TIMED OUT after ${cap} s (killed)"
    rc=124
  elif ((rc != 0)); then
    say "  $name: failed with status $rc (see logs.txt)"
  fi
  return $rc
}

# Written at every exit path: whatever is known so far, never an empty summary.
write_fallback_summary() {
  [[ -s "$out/summary.md" ]] && return
  {
    echo "# offsim GPU check: $1"
    echo
    echo "No comparison table: $2"
    echo "See logs.txt for each stage's output."
  } >"$out/summary.md"
}

if [[ ! -x "$bundle/bin/offsim" ]]; then
  echo "gpu-check: no bundle at $bundle (run scripts/bundle-gpu-check.sh on a build machine)" >&2
  write_fallback_summary "no bundle" "no bundle at $bundle"
  exit 2
fi

# The CUDA 13 libraries come from the machine: the dynamic loader's cache, the toolkit's
# folders, else the pip wheels of its Python (nvidia-nccl-cu13 in nvidia/nccl/lib; CUDA 13's
# cuBLAS and runtime wheels in nvidia/cu13/lib or nvidia/<name>/lib, depending on the wheel).
# The module links cudart and cuBLASLt; NCCL (first communicator) and cuDNN are opened on
# demand, so they are looked for but a one-GPU check runs without them.
needed=(libcudart.so.13 libcublasLt.so.13)
optional=(libnccl.so.2 libcudnn.so.9)
search_dirs=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib)
for d in /usr/local/cuda-13*/lib64 /usr/local/cuda-13*/targets/x86_64-linux/lib; do
  [[ -d "$d" ]] && search_dirs+=("$d")
done
for d in /opt/*/.venv/lib/python3*/site-packages/nvidia /usr/local/lib/python3*/dist-packages/nvidia \
  /usr/lib/python3/dist-packages/nvidia; do
  [[ -d "$d" ]] && search_dirs+=("$d")
done
if command -v python3 >/dev/null; then
  while IFS= read -r sp; do
    [[ -d "$sp/nvidia" ]] && search_dirs+=("$sp/nvidia")
  done < <(timeout 20 python3 -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))' 2>/dev/null | sort -u)
fi
libs=$bundle/lib
missing=()
optional_missing=()
for so in "${needed[@]}" "${optional[@]}"; do
  if ldconfig -p 2>/dev/null | grep -q "[[:space:]]$so "; then continue; fi
  found=""
  for d in "${search_dirs[@]}"; do
    [[ -d "$d" ]] || continue
    found=$(find "$d" -maxdepth 3 -name "$so" \( -type f -o -type l \) 2>/dev/null | head -n1)
    [[ -n "$found" ]] && break
  done
  if [[ -n "$found" ]]; then
    libs=$libs:$(dirname "$found")
  elif [[ " ${optional[*]} " == *" $so "* ]]; then
    optional_missing+=("$so")
  else
    missing+=("$so")
  fi
done
((${#optional_missing[@]})) &&
  say "  not found (loaded on demand, not needed on one GPU): ${optional_missing[*]}"
# Debian 12's libstdc++ only where the machine's is older (it lacks GCC 12's GLIBCXX_3.4.30).
sys_stdcxx=$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 / {print $NF; exit}')
if [[ -z "$sys_stdcxx" ]] || ! grep -q GLIBCXX_3.4.30 "$sys_stdcxx" 2>/dev/null; then
  libs=$bundle/lib-compat:$libs
fi
libs=$(echo "$libs" | tr ':' '\n' | awk '!seen[$0]++' | paste -sd:) # each folder once
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
offsim=$bundle/bin/offsim
# The CUDA device is the module next to the binaries; naming it spares the search.
export OFFSIM_GPU_PLUGIN=$bundle/bin/liboffsim_gpu.so

say "GPU state (read only)"
{
  timeout 30 nvidia-smi -L &&
    timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem,clocks.max.sm,power.limit,persistence_mode,mig.mode.current --format=csv
} >"$out/gpu.txt" 2>&1 || echo "nvidia-smi not available or failed" >>"$out/gpu.txt"
{
  echo
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  [[ -f "$bundle/MANIFEST" ]] && cat "$bundle/MANIFEST"
} >>"$out/gpu.txt"
cat "$out/gpu.txt" >>"$log"

say "0/5 preflight"
gpu_ok=1
why=""
if ((${#missing[@]})); then
  gpu_ok=0
  why="CUDA libraries not found on this machine: ${missing[*]} (searched the loader cache, ${search_dirs[*]})"
else
  unresolved=$(ldd "$OFFSIM_GPU_PLUGIN" 2>&1 | awk '/not found/ {print $1}' | tr '\n' ' ')
  if [[ -n "$unresolved" ]]; then
    gpu_ok=0
    why="liboffsim_gpu.so cannot load: not found: $unresolved"
  fi
fi
if ((gpu_ok)); then
  timeout -k 5 60 "$offsim" list devices >"$work/devices.txt" 2>&1
  cat "$work/devices.txt" >>"$log"
  cuda_devices=$(grep -c '^cuda' "$work/devices.txt")
  if ((cuda_devices == 0)); then
    gpu_ok=0
    # calibrate opens the GPU first, so it fails at once and says why (module, driver, device).
    reason=$(timeout -k 5 60 "$offsim" calibrate --quick --gpus 1 --out "$work/probe.json" 2>&1 |
      tail -n 3 | tr '\n' ' ')
    why="offsim sees no CUDA device: ${reason:-no message}"
  else
    say "  $cuda_devices CUDA device(s) visible"
  fi
fi
if ((!gpu_ok)); then
  say "no usable GPU: $why"
  if [[ "$device" == cuda ]]; then
    write_fallback_summary "no usable GPU" "$why"
    say "stopping: nothing to measure (REPLAY_DEVICE=cpu rehearses the stages without a GPU)"
    cat "$out/summary.md"
    exit 3
  fi
  say "REPLAY_DEVICE=$device: rehearsing the stages without a GPU"
fi

say "0/5 first look"
# First, whatever happens later: attention throughput of the kernel the replay runs and of the
# cuDNN SDPA graph (checked against it), and what the pool's high-water marks count (used vs
# reserved), printed into the log.
tests_ok=1
run_stage "first look" 45 "$bundle/bin/backends_cuda_replay_test" --gtest_brief=1 \
  --gtest_filter='*FirstLook*:*CudnnSdpa*' || tests_ok=0
grep '^first look:' "$log" | while read -r line; do say "  $line"; done

say "1/5 gpu tests"
run_stage "backends_cuda_replay_test" 120 "$bundle/bin/backends_cuda_replay_test" --gtest_brief=1 \
  --gtest_filter='-*FirstLook*:*CudnnSdpa*' || tests_ok=0
# The quick calibration is run below through the CLI; the test's own copy of it is skipped here.
run_stage "calibrate_gpu_test" 60 "$bundle/bin/calibrate_gpu_test" --gtest_brief=1 \
  --gtest_filter=-*QuickCalibrationFitsAProfile* || tests_ok=0

say "2/5 offsim calibrate --quick"
profile=$out/profile.json
cal_ok=1
run_stage "offsim calibrate --quick" 200 "$offsim" calibrate --quick --gpus 1 --out "$profile" ||
  cal_ok=0
profile_args=()
if ((cal_ok)) && [[ -s "$profile" ]]; then
  profile_args=(--profile "$profile")
else
  cal_ok=0
  rm -f "$profile"
  say "  calibration failed: the predictions below use the built-in profile of $system"
fi

say "3/5 replays (--layers $layers on $system, device $device)"
# name | scenario file | extra override
scenarios=(
  "no-offload|scenarios/examples/h100-1gpu-activation-offload.yaml|offload=none"
  "activation-offload|scenarios/examples/h100-1gpu-activation-offload.yaml|offload=megatron_activation_offload"
  "cpu-optimizer-offload|scenarios/examples/zero-offload-1gpu.yaml|"
)
names=()
for entry in "${scenarios[@]}"; do
  IFS='|' read -r name file extra <<<"$entry"
  sets=(--set "hardware.system=$system")
  [[ -n "$extra" ]] && sets+=(--set "$extra")
  say "  $name: $file${extra:+ ($extra)}"
  # --layers keeps every layer shape but only N layers (a catalogue model name is expanded).
  if run_stage "replay $name" 90 "$offsim" replay "$root/$file" "${sets[@]}" "${profile_args[@]}" \
    --layers "$layers" --warmup 1 --steps 3 --device "$device" \
    --out "$work/measured-$name.json" --predicted-out "$work/predicted-$name.json" &&
    run_stage "compare $name" 30 "$offsim" compare "$work/predicted-$name.json" \
      "$work/measured-$name.json" --format text &&
    timeout 30 "$offsim" compare "$work/predicted-$name.json" "$work/measured-$name.json" \
      --format json >"$work/compare-$name.json" 2>>"$log"; then
    names+=("$name")
  fi
done

say "4/5 sustained GEMM and attention (PyTorch)"
if [[ "$device" == cuda ]] && timeout 60 python3 -c 'import torch; assert torch.cuda.is_available()' \
  >/dev/null 2>&1; then
  run_stage "gpu-sustained" 75 python3 "$root/scripts/gpu-sustained.py" "$out/sustained.json" 60 ||
    true
else
  say "  skipped: no CUDA PyTorch on this machine (or not a GPU run)"
fi

say "5/5 summary"
if command -v python3 >/dev/null; then
  timeout 60 python3 - "$work" "$profile" "$out/summary.md" "$out/comparisons.json" "$device" \
    "${names[@]}" <<'PY' 2>>"$log"
import json, statistics, sys
work, profile_path, summary_path, comparisons_path, device, *names = sys.argv[1:]
try:
    with open(profile_path) as f:
        profile = json.load(f)
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
    try:
        with open(f"{work}/compare-{name}.json") as f:
            cmp = json.load(f)
        with open(f"{work}/measured-{name}.json") as f:
            measured = json.load(f)
    except Exception as e:
        print(f"{name}: unreadable result: {e}", file=sys.stderr)
        continue
    all_cmp[name] = cmp
    step = cmp["step_relative_error"]
    step_errs.append(abs(step))
    hbm = [p for p in cmp.get("pools", []) if p["pool"].endswith(".hbm")]
    hbm_err = max((abs(p["relative_error"]) for p in hbm), default=None)
    if hbm_err is not None:
        hbm_errs.append(hbm_err)
    bws = []
    for direction, cal in (("h2d", h2d), ("d2h", d2h)):
        bw = copy_bandwidth(measured, direction)
        if bw and cal:
            bws.append(f"{direction} {bw/1e9:.1f} GB/s = {100*bw/cal:.0f}%")
            bw_ratios.append(bw / cal)
        elif bw:
            bws.append(f"{direction} {bw/1e9:.1f} GB/s")
    rows.append((name, cmp["predicted_step_ns"] / 1e6, cmp["measured_step_ns"] / 1e6, step,
                 hbm_err, "; ".join(bws) or "no offload copies"))

lines = ["# offsim GPU check" + ("" if device == "cuda" else f" (REHEARSAL on the {device} device: times are not GPU times)"),
         "",
         "| scenario | predicted step (ms) | measured step (ms) | step error | peak HBM error | offload copies vs calibrated |",
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
try:
    with open(summary_path.rsplit("/", 1)[0] + "/sustained.json") as f:
        sustained = json.load(f)
    for data, what in (("randn", "randn data"), ("replay_fill", "the replay's fill pattern")):
        runs = [r for r in sustained.get("sustained", []) if r.get("data", "randn") == data]
        if not runs:
            continue
        tf = statistics.median(r["tflops"] for r in runs)
        mhz = statistics.median(r.get("sm_mhz", 0) for r in runs)
        watts = statistics.median(r.get("power_w", 0) for r in runs)
        lines.append(f"sustained 8192^3 bf16 GEMM (PyTorch, {what}, {len(runs)} s): "
                     f"{tf:.0f} TFLOP/s at SM {mhz:.0f} MHz, {watts:.0f} W")
except Exception:
    pass
text = "\n".join(lines) + "\n"
with open(summary_path, "w") as f:
    f.write(text)
with open(comparisons_path, "w") as f:
    json.dump(all_cmp, f, indent=2)
PY
fi
write_fallback_summary "summary not computed" "python3 missing or failed"

(cd "$work" && ls predicted-*.json measured-*.json >/dev/null 2>&1 &&
  tar -czf "$out/timelines.tar.gz" predicted-*.json measured-*.json) 2>>"$log" || true
status="tests $( ((tests_ok)) && echo passed || echo FAILED), calibration $( ((cal_ok)) && echo ok || echo FAILED), ${#names[@]}/${#scenarios[@]} scenarios replayed"
say "done in $(($(date +%s) - start)) s; $status"
echo "$status" >>"$out/summary.md"
cat "$out/summary.md"
((tests_ok && cal_ok && ${#names[@]} == ${#scenarios[@]})) || exit 1
