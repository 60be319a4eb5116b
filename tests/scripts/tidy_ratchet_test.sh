#!/usr/bin/env bash
# Checks the matching of scripts/tidy.sh against its known-findings list on canned clang-tidy
# output (clang-tidy itself is not run): listed findings pass, a new finding fails, a listed
# finding that no longer occurs fails unless its file was not checked, repeated header findings
# count once, and a malformed or duplicated list line fails. Last, the repository's own list parses.
#   tests/scripts/tidy_ratchet_test.sh   (ctest: tidy_ratchet_test, label tidy)
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
root=/src/offsim
failures=0

# expect NAME WANTED_EXIT PATTERN LOG KNOWN [SOURCES]: runs the matcher, checks its exit code and
# that its output contains PATTERN.
expect() {
  local name="$1" wanted="$2" pattern="$3"
  shift 3
  local output rc
  output="$(scripts/tidy.sh --match "$1" "$2" "$root" ${3:+"$3"} 2>&1)"
  rc=$?
  if [ "$rc" -ne "$wanted" ] || ! grep -q -F -- "$pattern" <<<"$output"; then
    echo "FAIL $name: exit $rc (wanted $wanted), output lacks '$pattern':"
    echo "$output"
    failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}

cat >"$tmp/log.txt" <<LOG
$root/models/cost_model.cc:61:22: error: function 'create' exceeds recommended size/complexity thresholds [readability-function-size,-warnings-as-errors]
$root/models/cost_model.cc:61:22: note: 180 lines including whitespace and comments (threshold 100)
$root/models/cost_model.cc:61:22: error: function 'create' has cognitive complexity of 74 (threshold 40) [readability-function-cognitive-complexity,-warnings-as-errors]
$root/models/cost_model.cc:70:5: note: +1, including nesting penalty of 0, nesting level increased to 1
$root/sim/core/table.h:12:3: error: function 'lookup' has cognitive complexity of 41 (threshold 40) [readability-function-cognitive-complexity,-warnings-as-errors]
$root/sim/core/table.h:12:3: error: function 'lookup' has cognitive complexity of 41 (threshold 40) [readability-function-cognitive-complexity,-warnings-as-errors]
$root/scenarios/document.cc:40:9: warning: 'path' used after it was moved [bugprone-use-after-move]
3 warnings generated.
LOG
cat >"$tmp/known.txt" <<KNOWN
# comment lines and blank lines are skipped

models/cost_model.cc:create:readability-function-size
models/cost_model.cc:create:readability-function-cognitive-complexity
sim/core/table.h:lookup:readability-function-cognitive-complexity
scenarios/document.cc:-:bugprone-use-after-move
KNOWN
expect all-listed 0 "4 findings, 4 of them listed; 0 new, 0 listed but gone" \
  "$tmp/log.txt" "$tmp/known.txt"

# The same log with an unlisted finding, reported with its key.
cp "$tmp/log.txt" "$tmp/new.txt"
echo "$root/models/evaluate.cc:195:8: error: function 'steady_state_report' exceeds recommended size/complexity thresholds [readability-function-size,-warnings-as-errors]" >>"$tmp/new.txt"
expect new-finding 1 "new finding (fix it; the list only shrinks): models/evaluate.cc:steady_state_report:readability-function-size" \
  "$tmp/new.txt" "$tmp/known.txt"

# A function that was split: its listed findings are gone.
grep -v "cost_model" "$tmp/log.txt" >"$tmp/split.txt"
expect listed-gone 1 "no longer occurs (delete its line from $tmp/known.txt): models/cost_model.cc:create:readability-function-size" \
  "$tmp/split.txt" "$tmp/known.txt"

# ... but not when the file was not checked in this build (e.g. a CUDA source without CUDA).
printf '%s\n' sim/core/table.h scenarios/document.cc >"$tmp/sources.txt"
expect unchecked-file 0 "0 new, 0 listed but gone" "$tmp/split.txt" "$tmp/known.txt" "$tmp/sources.txt"
printf '%s\n' models/cost_model.cc >>"$tmp/sources.txt"
expect checked-file 1 "models/cost_model.cc:create:readability-function-cognitive-complexity" \
  "$tmp/split.txt" "$tmp/known.txt" "$tmp/sources.txt"

# Line numbers are not part of the key: the finding moved down the file.
sed 's/cost_model.cc:61:22/cost_model.cc:75:22/' "$tmp/log.txt" >"$tmp/moved.txt"
expect moved-line 0 "0 new, 0 listed but gone" "$tmp/moved.txt" "$tmp/known.txt"

# A malformed or repeated list line.
{ cat "$tmp/known.txt"; echo "models/cost_model.cc:create:readability-function-size"; } >"$tmp/twice.txt"
expect listed-twice 1 "listed twice" "$tmp/log.txt" "$tmp/twice.txt"
{ cat "$tmp/known.txt"; echo "models/cost_model.cc create"; } >"$tmp/bad.txt"
expect malformed 1 "expected file:function:check" "$tmp/log.txt" "$tmp/bad.txt"

# The repository's list is well formed (no file checked, so nothing counts as gone).
: >"$tmp/empty.txt"
expect repository-list 0 "0 findings" "$tmp/empty.txt" scripts/tidy-known-findings.txt "$tmp/empty.txt"

[ "$failures" -eq 0 ]
