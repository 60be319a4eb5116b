#!/usr/bin/env bash
# Runs every Google Benchmark binary of a build folder and prints its figures.
set -euo pipefail
build=${1:-build/release}
found=0
while IFS= read -r bench; do
  found=1
  echo "== $(basename "$bench")"
  "$bench" --benchmark_counters_tabular=true
done < <(find "$build/tests" -type f -perm -u+x -name '*_benchmark' | sort)
[ $found -eq 1 ] || { echo "no benchmarks found under $build/tests" >&2; exit 1; }
