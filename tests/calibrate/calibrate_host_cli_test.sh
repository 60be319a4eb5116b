#!/usr/bin/env bash
# `offsim calibrate --host`: measures this machine's host into the host keys of a base profile
# (origin "measured", listed in the provenance; the other keys kept), and refuses a missing
# --base or an unknown GPU kind with exit status 2 and nothing written.
#   calibrate_host_cli_test.sh OFFSIM_EXE WORK_DIR
set -uo pipefail
offsim=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
fail() {
  echo "FAILED: $*"
  exit 1
}
"$offsim" calibrate --host --quick --host-array-mib 8 --base h200 --out "$work/host.json" \
  >"$work/out.txt" 2>&1 || { cat "$work/out.txt"; fail "exit status $?"; }
grep -q "^  CPU Adam, one core" "$work/out.txt" || fail "no CPU Adam line"
grep -q "^  CPU Adam,   1 thread(s) together" "$work/out.txt" || fail "no CPU Adam scaling"
grep -q "^  pinnable memory: RLIMIT_MEMLOCK" "$work/out.txt" || fail "no pinnable memory line"
python3 - "$work/host.json" <<'PY' || fail "profile keys"
import json, sys
p = json.load(open(sys.argv[1]))
for key in ("cores_per_socket", "dram_bytes_per_s_per_socket", "adam_bytes_per_s_per_core"):
    f = p["host"][key]
    assert f["origin"] == "measured", key
    assert "calibrate --host" in f["source"], key
    assert f["value"] > 0, key
    assert "host." + key in p["provenance"]["measured"], key
assert "threads together" in p["host"]["adam_bytes_per_s_per_core"]["source"]
assert p["host"]["remote_dram_time_ratio"]["origin"] != "measured"
assert p["gpu"]["dense_flops_bf16"]["origin"] != "measured"
PY
rc=0
"$offsim" calibrate --host --out "$work/none.json" >/dev/null 2>&1 || rc=$?
[[ $rc == 2 && ! -e "$work/none.json" ]] || fail "no --base: status $rc"
rc=0
"$offsim" calibrate --host --base no-such-gpu --out "$work/none.json" >/dev/null 2>&1 || rc=$?
[[ $rc == 2 && ! -e "$work/none.json" ]] || fail "unknown base: status $rc"
echo "calibrate --host: measured host keys written, bad bases refused"
