#!/usr/bin/env bash
# `mpirun -np N offsim replay --mpi --device cpu` on a dp2 and a pp2 plan: one rank per process,
# collectives and pipeline transfers carried across the processes by MPI, rank 0 comparing the
# merged measurement with the forecast; fewer processes than ranks replay a subset and say so;
# an input error is reported once with exit code 2; a failure on one rank ends every process
# with a message naming that rank. Every member of each communicator group joins it with the id
# its first member made (random per process, so only the broadcast makes them agree); --device
# cuda without the GPU module stops every process with a message naming the module.
#   mpi_replay_test.sh MPIEXEC OFFSIM_EXE DATA_DIR WORK_DIR     (MPIEXEC "none": skipped)
set -uo pipefail
mpiexec=$1 offsim=$2 data=$3 work=$4
if [[ "$mpiexec" == none ]]; then
  echo "skipped: offsim was built without MPI (configure with OFFSIM_WITH_MPI=ON)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
flags=(--oversubscribe)
[[ $(id -u) == 0 ]] && flags+=(--allow-run-as-root)
fail() {
  echo "FAILED: $*"
  exit 1
}
run() {  # run NP OUTPUT_PREFIX ARGS...: stdout and stderr to PREFIX.out/.err, prints the status
  local np=$1 out=$2
  shift 2
  timeout 300 "$mpiexec" "${flags[@]}" -n "$np" "$@" >"$out.out" 2>"$out.err"
  echo $?
}
# same_ids "rank R: ranks G as member I id H; ...": every group joined once by each member, each
# at its own position, all with one id; prints what is wrong, nothing when all agree.
same_ids() {
  python3 - "$1" <<'PY'
import re, sys
groups = {}
for entry in filter(None, sys.argv[1].split("; ")):
    m = re.fullmatch(r"rank (\d+): ranks ([\d,]+) as member (\d+) id ([0-9a-f]{16})", entry)
    if not m:
        print("malformed entry:", entry); sys.exit()
    rank, members, me, ident = int(m[1]), [int(x) for x in m[2].split(",")], int(m[3]), m[4]
    if members[me] != rank:
        print(f"rank {rank} joined {members} at position {me}")
    groups.setdefault(tuple(members), []).append((rank, ident))
if not groups:
    print("no communicator was joined")
for members, joins in groups.items():
    if sorted(r for r, _ in joins) != list(members):
        print(f"group {members} joined by {joins}")
    if len({i for _, i in joins}) != 1:
        print(f"group {members}: members hold different ids {joins}")
PY
}
measured() {  # measured JSON KEY: a replay.* metadata value
  python3 -c "import json,sys; t=json.load(open(sys.argv[1])); print(dict(t['metadata'])[sys.argv[2]])" "$1" "$2"
}
common=(--mpi --device cpu --layers 2 --steps 2 --warmup 1)

for plan in dp2 pp2; do
  rc=$(run 2 "$work/$plan" "$offsim" replay "$data/mpi-$plan.yaml" "${common[@]}" \
    --out "$work/$plan.json")
  [[ $rc == 0 ]] || { cat "$work/$plan.out" "$work/$plan.err"; fail "$plan: exit status $rc"; }
  grep -q "^mpi: 2 processes ran ranks 0,1, one each" "$work/$plan.out" || fail "$plan: no mpi line"
  grep -q "over MPI" "$work/$plan.out" || fail "$plan: not the MPI device"
  # Every op of the plan ran somewhere: none only predicted.
  grep -Eq "^ops +[0-9]+ matched, 0 only predicted, 0 only measured" "$work/$plan.out" ||
    fail "$plan: ops missing from the merged measurement: $(grep '^ops' "$work/$plan.out")"
  [[ $(measured "$work/$plan.json" replay.ranks) == "0,1" ]] || fail "$plan: replay.ranks"
  [[ $(measured "$work/$plan.json" replay.skipped_ops) == 0 ]] || fail "$plan: skipped ops"
  comms=$(measured "$work/$plan.json" replay.communicators)
  bad=$(same_ids "$comms")
  [[ -z "$bad" ]] || fail "$plan: communicator ids disagree: $bad (replay.communicators: $comms)"
  [[ $(grep -c "replayed mpi-$plan" "$work/$plan.out") == 1 ]] || fail "$plan: rank 0 only prints"
done
# The pipeline's two stages ran in the two processes: both pools were measured.
grep -Eq "rank1.hbm +predicted .* measured +[1-9]" "$work/pp2.out" || fail "pp2: rank1.hbm not measured"

# One process for a two-rank pipeline: rank 0 runs, rank 1 is emulated, and the output says so.
rc=$(run 1 "$work/subset" "$offsim" replay "$data/mpi-pp2.yaml" "${common[@]}")
[[ $rc == 0 ]] || { cat "$work/subset.out" "$work/subset.err"; fail "subset: exit status $rc"; }
grep -q "the plan has 2 ranks but 1 processes ran" "$work/subset.out" || fail "subset: not said"
grep -Eq "^ops +[0-9]+ matched, [1-9][0-9]* only predicted" "$work/subset.out" ||
  fail "subset: rank 1's ops should be missing"

# An input error: reported once, exit status 2.
rc=$(run 2 "$work/input" "$offsim" replay "$data/mpi-dp2.yaml" "${common[@]}" \
  --set parallelism.dp=3)
[[ $rc == 2 ]] || fail "input error: exit status $rc, expected 2"
[[ $(grep -c "offsim: error:" "$work/input.err") == 1 ]] || { cat "$work/input.err"; fail "input error not reported once"; }

# A failure on rank 1 only (it asks for the cuda device): every process ends, rank 1 is named.
rc=$(run 1 "$work/abort" "$offsim" replay "$data/mpi-dp2.yaml" "${common[@]}" : \
  -n 1 "$offsim" replay "$data/mpi-dp2.yaml" --mpi --device cuda --layers 2 --steps 2)
[[ $rc != 0 ]] || fail "a failing rank: exit status 0"
grep -q "offsim: error: rank 1 of 2 (.*): replay --mpi on cuda" "$work/abort.err" ||
  { cat "$work/abort.err"; fail "the failing rank is not named"; }
# --device cuda without the GPU module: every process stops, the module is named.
rc=$(run 2 "$work/nomodule" env OFFSIM_GPU_PLUGIN="$work/no-such-module.so" "$offsim" replay \
  "$data/mpi-dp2.yaml" --mpi --device cuda --layers 2 --steps 2)
[[ $rc != 0 ]] || fail "cuda without the GPU module: exit status 0"
grep -Eq "offsim: error: rank [01] of 2 \(.*\): replay --mpi on cuda: (the GPU module liboffsim_gpu.so was not found \(looked for: $work/no-such-module.so\)|offsim was built without CUDA)" \
  "$work/nomodule.err" || { cat "$work/nomodule.err"; fail "the missing GPU module is not named"; }
echo "mpi replay: dp2 and pp2 across 2 processes (communicator ids agree), subset, input error, abort and missing GPU module all as expected"
