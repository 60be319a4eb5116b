#!/usr/bin/env bash
# `offsim calibrate --host`: measures this machine's host into the host keys of a base profile
# (origin "measured", listed in the provenance; the other keys kept), and refuses a missing
# --base or an unknown GPU kind with exit status 2 and nothing written. With --host-out it writes a
# host file (measured figures over the catalogue host --host-base) that a scenario's
# hardware.host reads: the run equals the base host with the measured figures as overrides.
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

# --host-out: a host file for hardware.host, and a run that reads it.
"$offsim" calibrate --host --quick --host-array-mib 8 --host-out "$work/lab.json" \
  --host-base xeon-8480c >"$work/out2.txt" 2>&1 || { cat "$work/out2.txt"; fail "--host-out"; }
grep -q "wrote the host file (base xeon-8480c" "$work/out2.txt" || fail "no host file line"
# list hosts --file: the catalogue, then the host file as a scenario reads it.
"$offsim" list hosts --file "$work/lab.json" >"$work/list.txt" 2>&1 ||
  { cat "$work/list.txt"; fail "list hosts --file"; }
grep -q "^xeon-8480c " "$work/list.txt" || fail "list hosts --file: no catalogue"
grep -q "^lab  *xeon-8480c with figures measured by offsim calibrate --host" "$work/list.txt" ||
  { cat "$work/list.txt"; fail "list hosts --file: no host file line"; }
grep -q "cores per socket (measured), CPU Adam .* GB/s per core (measured)" "$work/list.txt" ||
  fail "list hosts --file: no measured figures"
overrides=$(python3 - "$work/lab.json" <<'PY'
import json, sys
h = json.load(open(sys.argv[1]))
assert h["format"] == "offsim-host" and h["base"] == "xeon-8480c" and h["name"] == "lab", h
sets = []
for key in ("cores_per_socket", "dram_bytes_per_s_per_socket", "adam_bytes_per_s_per_core"):
    f = h[key]
    assert f["origin"] == "measured" and "calibrate --host" in f["source"] and f["value"] > 0, key
    sets.append("--set hardware.overrides.profile.host.%s=%r" % (key, f["value"]))
assert "vector_bits" not in h and "attach" not in h
print(" ".join(sets))
PY
) || fail "host file keys"
cat >"$work/s.yaml" <<'YAML'
name: host-file
model: llama3-8b
hardware:
  system: h100-1gpu
  host: lab.json
training:
  global_batch: 8
  micro_batch: 1
  seq_len: 4096
recompute: selective
offload: zero_offload
YAML
"$offsim" run "$work/s.yaml" --format json >"$work/file.json" 2>"$work/err.txt" ||
  { cat "$work/err.txt"; fail "run with the host file"; }
# shellcheck disable=SC2086
"$offsim" run "$work/s.yaml" --format json --set hardware.host=xeon-8480c $overrides \
  >"$work/same.json" 2>"$work/err.txt" || { cat "$work/err.txt"; fail "run with overrides"; }
python3 - "$work/file.json" "$work/same.json" <<'PY' || fail "host file run differs"
import json, sys
a, b = (json.load(open(p))[0] for p in sys.argv[1:])
for key in ("step_time_s", "limited_by", "tokens_per_s", "host_peak_bytes"):
    assert a[key] == b[key], (key, a[key], b[key])
PY
# A run may not overwrite the host file it reads.
cp "$work/lab.json" "$work/lab.keep"
rc=0
"$offsim" run "$work/s.yaml" --trace "$work/lab.json" >"$work/err.txt" 2>&1 || rc=$?
[[ $rc == 2 ]] || fail "--trace over the host file: status $rc"
cmp -s "$work/lab.json" "$work/lab.keep" || fail "--trace overwrote the host file"
rc=0
"$offsim" calibrate --host --quick --host-out "$work/nobase.json" >/dev/null 2>&1 || rc=$?
[[ $rc == 2 && ! -e "$work/nobase.json" ]] || fail "--host-out without --host-base: status $rc"
rc=0
"$offsim" calibrate --host --quick --host-out "$work/nobase.json" --host-base pentium \
  >"$work/err.txt" 2>&1 || rc=$?
[[ $rc == 2 && ! -e "$work/nobase.json" ]] || fail "unknown --host-base: status $rc"
grep -q "unknown host 'pentium'" "$work/err.txt" || fail "unknown --host-base message"
printf '{"format": "offsim-host", "base": "xeon-8480c", "cores_per_socket": 56}\n' >"$work/bad.json"
rc=0
"$offsim" run "$work/s.yaml" --set hardware.host="$work/bad.json" >"$work/err.txt" 2>&1 || rc=$?
[[ $rc == 2 ]] || fail "bad host file: status $rc"
grep -q "bad.json: \$.cores_per_socket: expected an object" "$work/err.txt" ||
  { cat "$work/err.txt"; fail "bad host file message"; }
rc=0
"$offsim" list hosts --file "$work/bad.json" >"$work/err.txt" 2>&1 || rc=$?
[[ $rc == 2 ]] || fail "list hosts --file bad.json: status $rc"
grep -q "bad.json: \$.cores_per_socket: expected an object" "$work/err.txt" ||
  { cat "$work/err.txt"; fail "list hosts --file bad.json message"; }
echo "calibrate --host: measured host keys and host file written, read back, bad inputs refused"
