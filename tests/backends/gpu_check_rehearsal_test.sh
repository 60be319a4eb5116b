#!/usr/bin/env bash
# gpu-check's CPU rehearsal: with the binaries of this build as the bundle, every stage runs
# (the first look first) on the CPU device, the three scenarios replay, and the whole run stays
# inside its budget. Calibration needs a GPU, so the script's own exit status is 1 here.
#   gpu_check_rehearsal_test.sh BUILD_DIR OFFSIM_EXE WORK_DIR
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$1 offsim=$2 work=$3
budget=120
rm -rf "$work" && mkdir -p "$work/bundle/bin" "$work/bundle/lib" "$work/bundle/lib-compat"
ln -s "$offsim" "$work/bundle/bin/offsim"
for t in tests/backends/backends_cuda_replay_test tests/calibrate/calibrate_gpu_test lib/liboffsim_gpu.so; do
  ln -s "$build/$t" "$work/bundle/bin/$(basename "$t")"
done
REPLAY_DEVICE=cpu BUDGET_S=$budget BUNDLE=$work/bundle "$root/scripts/gpu-check.sh" "$work/out" >"$work/stdout.txt" 2>&1
rc=$?
fail() {
  echo "FAILED: $*"
  cat "$work/stdout.txt"
  exit 1
}
((rc == 0 || rc == 1)) || fail "gpu-check exited with $rc"
grep -q '0/5 first look' "$work/out/logs.txt" || fail "no first-look stage"
first=$(grep -n 'first look' "$work/out/logs.txt" | head -n1 | cut -d: -f1)
tests=$(grep -n '1/5 gpu tests' "$work/out/logs.txt" | head -n1 | cut -d: -f1)
((first < tests)) || fail "the first look does not run first"
grep -q '3/3 scenarios replayed' "$work/stdout.txt" || fail "not every scenario replayed"
grep -q '4/5 sustained GEMM and attention' "$work/out/logs.txt" || fail "no sustained stage"
grep -q 'skipped: no CUDA PyTorch' "$work/out/logs.txt" || fail "the CPU rehearsal ran the sustained stage"
took=$(sed -n 's/.*done in \([0-9]*\) s.*/\1/p' "$work/stdout.txt" | tail -n1)
[[ -n "$took" ]] || fail "no 'done in N s' line"
((took < budget)) || fail "took $took s of a $budget s budget"
echo "gpu-check CPU rehearsal: $took s of $budget s"
