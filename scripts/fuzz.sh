#!/usr/bin/env bash
# Builds the libFuzzer targets (in the `asan` preset: clang 14, ASan + UBSan) and runs each for SECONDS (default 60) over its
# seed corpus. Fails on any crash, leak, sanitizer report or timeout. Prints executions per target.
#   scripts/fuzz.sh            # 60 s per target (CI runs 30 s)
#   scripts/fuzz.sh 3600       # an hour per target
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
seconds=${1:-60}
cmake --preset asan >/dev/null
targets=(plan_json_fuzzer timeline_json_fuzzer profile_fuzzer hf_config_fuzzer scenario_fuzzer
         sweep_file_fuzzer megatron_args_fuzzer)
cmake --build build/asan -j "$(nproc)" --target "${targets[@]}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for bin in $(find build/asan/tests/fuzz -maxdepth 1 -type f -perm -u+x -name '*_fuzzer' | sort); do
  name=$(basename "$bin" _fuzzer)
  seeds=("tests/fuzz/corpus/$name")
  # The import examples seed the launch-script fuzzer too.
  if [ "$name" = megatron_args ]; then seeds+=(scenarios/imports); fi
  mkdir -p "$work/$name"
  log="$work/$name.log"
  if "$bin" "$work/$name" "${seeds[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$work/$name-" >"$log" 2>&1; then
    execs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
    echo "fuzz $name: ${execs:-?} executions in ${seconds}s, no findings"
  else
    echo "fuzz $name: FAILED" >&2
    tail -40 "$log" >&2
    status=1
  fi
done
exit $status
