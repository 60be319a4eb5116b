#!/usr/bin/env bash
# Fails when a tracked C++/CUDA source is not clang-formatted (the repository's .clang-format).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
bad=()
while IFS= read -r -d '' f; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done < <(git ls-files -z -- '*.h' '*.cc' '*.cu' '*.cuh')
if [ ${#bad[@]} -ne 0 ]; then
  echo "Not clang-formatted (run: clang-format -i FILE):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "clang-format: all $(git ls-files -- '*.h' '*.cc' '*.cu' '*.cuh' | wc -l) sources formatted"
