#!/usr/bin/env bash
# One GPU session in one call of the device machine (a 10-minute command
# limit, a few files returned): every GPU check, from a kit that
# tests/gpu/kit.sh built elsewhere (nothing compiles there), under a global
# time budget.
#
#   bash tests/gpu/session.sh OUT KIT                  every step (BUDGET 420 s)
#   bash tests/gpu/session.sh OUT KIT --only STEP[,STEP...] [--debug nccl|blocking|sanitizer]
#                                                      those steps again (180 s)
#   bash tests/gpu/session.sh OUT --steps FILE         a dry run: FILE's steps,
#                                                      no kit (tests/gpu/check_session.py)
#   bash tests/gpu/session.sh --list                   the steps, in order
#
# OUT receives exactly three files: summary.txt (also printed last, so the
# command's output tail carries it), summary.tsv (step, status, seconds,
# detail) and logs.tgz (every step's log; refreshed every PACK_EVERY = 15 s
# and after each step, so a session killed from outside still returns what
# it had). Logs are written outside OUT.
#
# Each step has a cap (seconds). Before a step the budget left is checked:
# a step runs under min(cap, budget left) and is NOT-RUN (budget) when less
# than a quarter of its cap, or 15 s, is left. A step that outlives its
# time gets a backtrace of each process it left (cuda-gdb or gdb in batch
# mode when present, else the kernel's wait channel) before it is killed:
# TIMEOUT. Statuses: PASS, FAIL, TIMEOUT, NOT-RUN. The most uncertain steps
# run first (TP x PP shards on the GPU, then a GPU worker under the control
# plane, then the rest).
set -uo pipefail

usage() {
  sed -n 8,12p "$0" >&2
  exit 2
}
LIST=0
if [ "${1:-}" = --list ]; then
  LIST=1
  shift
else
  OUT=${1:-}
  [ -n "$OUT" ] || usage
  shift
fi
KIT="" ONLY="" DEBUG="" STEPS_FILE=""
if [ "$LIST" = 0 ] && [ "${1:-}" != --steps ]; then
  KIT=${1:-}
  [ -n "$KIT" ] || usage
  shift
fi
while [ $# -gt 0 ]; do
  case $1 in
    --only) ONLY=${2:?}; shift 2 ;;
    --debug) DEBUG=${2:?}; shift 2 ;;
    --steps) STEPS_FILE=${2:?}; shift 2 ;;
    *) usage ;;
  esac
done
cd "$(dirname "$0")/../.."
ROOT=$PWD
if [ -n "$ONLY" ]; then BUDGET=${BUDGET:-180}; else BUDGET=${BUDGET:-420}; fi
PACK_EVERY=${PACK_EVERY:-15}
T0=$SECONDS

# ---------------------------------------------------------------------------
# The steps: name, cap in seconds, and the function that runs it (its
# stdout and stderr go to the step's log; it returns 0 for a pass; it may
# write one line of detail to $DETAIL).

PROMPT="What is the capital of France?"
WRAP=()  # --debug sanitizer: compute-sanitizer before every binary.

# Runs a gtest binary of the kit. Fails on a failed case, a crash or a
# skipped case (every GPU test must run here), except NCCL's multi-rank
# cases on a machine with one GPU (a group of one is the identity), which
# pass with a detail.
gtest() {
  local name=$1
  shift
  "${WRAP[@]}" "$BIN/$name" --gtest_color=no \
    --gtest_output="xml:$LOGS/$name.xml" "$@"
  local rc=$?
  # "<skipped cases> <of them, not multi-rank cases> <first reason>".
  local skips
  skips=$(python3 - "$LOGS/$name.xml" <<'EOF' 2>/dev/null || echo "0 1 no XML"
import sys, xml.etree.ElementTree as ET
why = [s.get("message", "") for s in ET.parse(sys.argv[1]).iter("skipped")]
other = [w for w in why if "multi-rank case: needs 2 GPUs" not in w]
print(len(why), len(other), " ".join((other or [""])[0].split())[:200])
EOF
)
  local skipped unexplained reason
  read -r skipped unexplained reason <<<"$skips"
  if [ "$rc" = 77 ] && [ "$unexplained" = 0 ] && [ "$skipped" -gt 0 ]; then
    echo "$skipped multi-rank case(s) not run: one GPU" >"$DETAIL"
    return 0
  fi
  if [ "$rc" = 77 ]; then
    echo "$unexplained case(s) skipped: $reason" >"$DETAIL"
    return 1
  fi
  [ "$rc" = 0 ] || echo "exit $rc: $(grep -m1 '^\[  FAILED  \]' "$LOG")" >"$DETAIL"
  return "$rc"
}

gen() {
  timeout -k 5 120 "${WRAP[@]}" "$BIN/shardlm" generate --prompt "$PROMPT" \
    --chat --max-tokens 24 --logprobs 2 "$@"
}

# The CPU's greedy answer and its logprobs table (f32: the reference of
# the text checks), once per session.
cpu_reference() {
  if [ ! -s "$WORK/cpu.err" ]; then
    gen --model "$SHARDLM_MODEL" --device cpu --kv-cache-dtype f32 \
      >"$WORK/cpu.txt" 2>"$WORK/cpu.err"
    cp "$WORK/cpu.err" "$LOGS/generate_cpu.err"
  fi
}

# Ports nothing holds now (bind(0)'s), not fixed ones another run may hold.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Asks the server at $1 with `generate --server` until it answers or the
# process $2 ends (at most $3 tries a second apart); the answer's logprobs
# table goes to $4.
ask() {
  local answer=""
  for _ in $(seq "$3"); do
    answer=$(gen --server "$1" 2>"$4") && break
    answer=""
    kill -0 "$2" 2>/dev/null || break
    sleep 1
  done
  echo "$answer"
}

# The greedy tokens of a GPU run (its logprobs table in $2) against the
# CPU's, with margins (tests/gpu/compare_greedy.py): a 4-block cut of
# SmolLM2 has near ties that bf16 may break the other way.
same_as_cpu() {  # what, logprobs file
  cpu_reference
  echo "cpu : $(cat "$WORK/cpu.txt")"
  local verdict
  verdict=$(python3 "$ROOT/tests/gpu/compare_greedy.py" "$WORK/cpu.err" "$2" \
    --tolerance 0.25 --flip-margin 0.25)
  local rc=$?
  echo "$1: $verdict"
  [ "$rc" = 0 ] || echo "$1: $verdict" >"$DETAIL"
  return "$rc"
}

step_probe() {
  cat "$KIT/MANIFEST"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem \
    --format=csv || echo "nvidia-smi failed"
  nvcc --version 2>/dev/null | tail -1
  # Driver, runtime, NCCL and cuBLAS against what the kit was built with.
  "$BIN/gpu_probe"
  local probe=$?
  # The kit's CPU instruction set against this machine's.
  local isa flags need=""
  isa=$(sed -n 's/^isa: \([^ ]*\).*/\1/p' "$KIT/MANIFEST")
  flags=$(grep -m1 '^flags' /proc/cpuinfo)
  case $isa in
    x86-64-v3) need="avx2 fma bmi2 f16c movbe" ;;
    x86-64-v4) need="avx2 fma bmi2 f16c movbe avx512f avx512bw avx512vl" ;;
  esac
  for f in $need; do
    if ! grep -qw "$f" <<<"$flags"; then
      echo "kit built for $isa; this CPU lacks $f" | tee "$DETAIL"
      return 1
    fi
  done
  echo "kit ISA: ${isa:-unrecorded}; this CPU has what it needs"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  # Library resolution per binary: one binary's missing library fails its
  # steps, not the session.
  local missing=()
  for b in "$BIN"/*; do
    if ldd "$b" | grep "not found"; then missing+=("$(basename "$b")"); fi
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "libraries missing for: ${missing[*]}" | tee "$DETAIL"
    return 1
  fi
  if [ "$probe" != 0 ]; then
    echo "gpu_probe: exit $probe ($(grep -m1 '^MISMATCH\|^devices: none' "$LOG"))" >"$DETAIL"
    return 1
  fi
}

step_engine_shards() {
  gtest cuda_engine_test --gtest_filter='*ShardsOnOneGpu*:*RanksSharing*'
}

# A cluster without mpirun (as Kubernetes runs it): shardlm coordinator and
# one shardlm worker --device cuda (TP = PP = 1: NCCL refuses two ranks of
# a group on one GPU): the worker's registration with its GPU, KV sizing on
# the worker and device sampling over the control plane.
step_gpu_worker() {
  export SHARDLM_CLUSTER_TOKEN=gpu-run-token-0123456789abcdef
  local cport aport
  cport=$(free_port)
  aport=$(free_port)
  [ "$aport" != "$cport" ] || aport=$(free_port)
  "${WRAP[@]}" "$BIN/shardlm" coordinator --model "$SHARDLM_MODEL" \
    --device cuda --listen "127.0.0.1:$aport" \
    --control-listen "127.0.0.1:$cport" >"$LOGS/coordinator.log" 2>&1 &
  local coord=$!
  "${WRAP[@]}" "$BIN/shardlm" worker --model "$SHARDLM_MODEL" \
    --coordinator "127.0.0.1:$cport" --rank 1 --device cuda \
    >"$LOGS/worker.log" 2>&1 &
  local worker=$!
  local answer
  answer=$(ask "127.0.0.1:$aport" "$coord" 90 "$LOGS/gpu_worker.err")
  echo "answer: $answer"
  grep "\[shardlm\]" "$LOGS/worker.log" | head -5
  kill "$coord" 2>/dev/null
  wait "$coord" "$worker" 2>/dev/null
  same_as_cpu "coordinator + GPU worker" "$LOGS/gpu_worker.err"
}

step_generate() {
  gen --model "$SHARDLM_MODEL" --device cuda 2>"$LOGS/generate_gpu.err"
  grep "^shardlm:" "$LOGS/generate_gpu.err"
  same_as_cpu "generate --device cuda" "$LOGS/generate_gpu.err" || return 1
  gen --model "$SHARDLM_MODEL" --device cuda --tp 2 --pp 2 \
    --allow-shared-gpu 2>"$LOGS/generate_gpu_tp2pp2.err"
  same_as_cpu "generate --device cuda --tp 2 --pp 2 (one GPU)" \
    "$LOGS/generate_gpu_tp2pp2.err"
}

step_serve() {
  local port
  port=$(free_port)
  "${WRAP[@]}" "$BIN/shardlm" serve --model "$SHARDLM_MODEL" --device cuda \
    --listen "127.0.0.1:$port" >"$LOGS/serve.log" 2>&1 &
  local serve=$!
  local answer
  answer=$(ask "127.0.0.1:$port" "$serve" 60 "$LOGS/serve_remote.err")
  echo "answer: $answer"
  kill "$serve" 2>/dev/null
  wait "$serve" 2>/dev/null
  same_as_cpu "serve --device cuda over gRPC" "$LOGS/serve_remote.err"
}

decode_bench() {  # name, flags...
  local name=$1
  shift
  "${WRAP[@]}" "$BIN/gpu_decode_bench" "$@" --json "$LOGS/$name.json"
  local rc=$?
  if [ "$rc" != 0 ]; then
    echo "exit $rc" >"$DETAIL"
    return "$rc"
  fi
  # The figures in the summary (its output tail is what a call returns):
  # the fraction of the nominal peak per batch, with CUDA graphs.
  python3 - "$LOGS/$name.json" >"$DETAIL" 2>/dev/null <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
runs = [r for r in d["runs"] if r["mode"] == "graphs"]
print("of peak: " + ", ".join(
    f"b{r['batch']} {100 * r['frac_of_peak']:.1f}% ({r['step_ms']:.2f} ms)"
    for r in runs))
EOF
  return 0
}

step_profile() {  # batch, kernels to skip (the prefill steps and more)
  # Per-kernel time and DRAM bytes of decode steps: not a check.
  ncu --clock-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum \
    --launch-skip "$2" --launch-count "${PROFILE_COUNT:-300}" \
    --csv "$BIN/gpu_decode_bench" --batches "$1" --prompt 128 --steps 8 \
    >"$LOGS/ncu_decode_b$1.csv"
}

STEP_NAMES=() STEP_CAPS=() STEP_CMDS=()
add_step() { STEP_NAMES+=("$1"); STEP_CAPS+=("$2"); STEP_CMDS+=("$3"); }
add_step probe 60 step_probe
add_step engine_shards 120 step_engine_shards
add_step gpu_worker 150 step_gpu_worker
add_step cuda_backend_test 60 "gtest cuda_backend_test"
add_step forward_ops_gpu_test 90 "gtest forward_ops_gpu_test"
# With the GEMV kernel on every batch it takes (LinearCuda's default is 1 row).
add_step kernels_cross_backend_test 120 \
  "export SHARDLM_CUDA_GEMV_ROWS=8; gtest kernels_cross_backend_test"
add_step nccl_communicator_test 90 "gtest nccl_communicator_test"
add_step cuda_model_runner_test 150 "gtest cuda_model_runner_test"
add_step cuda_engine_test 150 \
  "gtest cuda_engine_test --gtest_filter=-*ShardsOnOneGpu*:*RanksSharing*"
add_step generate 150 step_generate
add_step serve 120 step_serve
add_step decode_bench_1b 150 \
  "decode_bench decode_bench_1b --model 1b --batches 1,8,64 --prompt 128 --steps 64"
add_step decode_bench_8b 180 \
  "decode_bench decode_bench_8b --model 8b --batches 1,8,64 --prompt 128 --steps 64"
# Quantized weights kept in their blocks (--cuda-weights quantized, #43
# part 4; never run on a GPU before): Q8_0 and Q4_0 at batch 1 and 8 (the
# quantized GEMV), against the floor of their packed bytes.
for q in q8_0 q4_0; do
  add_step "decode_${q}_8b" 90 \
    "decode_bench decode_${q}_8b --model 8b --weights $q --batches 1,8 --prompt 128 --steps 32"
done
for fraction in 0 0.5; do
  add_step "decode_host_$fraction" 90 \
    "decode_bench decode_host_$fraction --model 1b --batches 1,8 --prompt 2048 --steps 32 --host-fraction $fraction"
done
# Where the GEMV kernel stops beating cuBLAS (LinearCuda's kGemvMaxRows).
add_step decode_gemv_8b 120 \
  "export SHARDLM_CUDA_GEMV_ROWS=8; decode_bench decode_gemv_8b --model 8b --batches 1,2,3,4,6,8 --prompt 128 --steps 32"
add_step decode_cublas_8b 120 \
  "export SHARDLM_CUDA_GEMV_ROWS=0; decode_bench decode_cublas_8b --model 8b --batches 1,2,3,4,6,8 --prompt 128 --steps 32"
# A 1B decode step is about 210 kernels: skip the prefill and warm-up steps.
if [ "${PROFILE:-0}" = 1 ]; then
  add_step profile 180 "step_profile 1 600"
  add_step profile_b64 180 "step_profile 64 15000"
fi

if [ "$LIST" = 1 ]; then
  for i in "${!STEP_NAMES[@]}"; do
    printf '%-28s cap %4d s  %s\n' "${STEP_NAMES[$i]}" "${STEP_CAPS[$i]}" "${STEP_CMDS[$i]}"
  done
  exit 0
fi

# A dry run's steps come from FILE: name<TAB>cap<TAB>shell command.
if [ -n "$STEPS_FILE" ]; then
  STEP_NAMES=() STEP_CAPS=() STEP_CMDS=()
  while IFS=$'\t' read -r name cap cmd; do
    [ -z "$name" ] || [ "${name:0:1}" = "#" ] && continue
    add_step "$name" "$cap" "bash -c $(printf '%q' "$cmd")"
  done <"$STEPS_FILE"
fi

# ---------------------------------------------------------------------------
# The session.

mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/shardlm-gpu-session.XXXXXX")
LOGS=$WORK/logs
mkdir -p "$LOGS"
TSV=$WORK/summary.tsv
printf 'step\tstatus\tseconds\tdetail\n' >"$TSV"

pack() {
  tar -czf "$OUT/logs.tgz.part" -C "$WORK" logs 2>/dev/null &&
    mv -f "$OUT/logs.tgz.part" "$OUT/logs.tgz"
}

summarize() {
  cp "$TSV" "$OUT/summary.tsv"
  {
    echo "GPU session summary ($(date -u +%FT%TZ)); budget ${BUDGET} s, used $((SECONDS - T0)) s"
    [ -n "$KIT" ] && [ -f "$KIT/MANIFEST" ] && sed -n '1,3p' "$KIT/MANIFEST"
    [ -n "$DEBUG" ] && echo "debug: $DEBUG"
    echo
    column -t -s $'\t' "$TSV" 2>/dev/null || cat "$TSV"
    local bad
    bad=$(awk -F'\t' 'NR > 1 && ($2 == "FAIL" || $2 == "TIMEOUT") {print $1}' "$TSV")
    for s in $bad; do
      echo
      echo "--- last lines of $s.log"
      tail -n 15 "$LOGS/$s.log" 2>/dev/null
    done
    echo
    echo "totals: $(awk -F'\t' 'NR > 1 {n[$2]++} END {for (s in n) printf "%s %d  ", s, n[s]}' "$TSV")"
  } >"$OUT/summary.txt"
}

# Descendants of $1, deepest first.
descendants() {
  local c
  for c in $(pgrep -P "$1"); do
    descendants "$c"
    echo "$c"
  done
}

backtrace() {  # pid
  local dbg
  dbg=$(command -v cuda-gdb || command -v gdb || true)
  local n=0
  for pid in $(descendants "$1") "$1"; do
    [ -d "/proc/$pid" ] || continue
    n=$((n + 1))
    [ $n -le 6 ] || break
    echo "--- backtrace of $pid ($(cat "/proc/$pid/comm" 2>/dev/null)):"
    if [ -n "$dbg" ]; then
      timeout -k 2 20 "$dbg" -p "$pid" -batch -ex "thread apply all bt" 2>&1 |
        grep -v "^\[New LWP\|^warning:" | head -80
    else
      echo "no gdb or cuda-gdb here; wait channel: $(cat "/proc/$pid/wchan" 2>/dev/null)"
      cat "/proc/$pid/stack" 2>/dev/null | head -20
    fi
  done
}

# SIGTERM to a process and every descendant, then SIGKILL to what is left.
kill_tree() {
  local pids
  pids="$(descendants "$1") $1"
  kill -TERM $pids 2>/dev/null
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    kill -0 $pids 2>/dev/null || return 0
    sleep 0.2
  done
  kill -KILL $pids 2>/dev/null
}

record() {  # name status seconds detail
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4//$'\t'/ }" >>"$TSV"
  printf '%-28s %-8s %4s s  %s\n' "$1" "$2" "$3" "$4"
  summarize
  pack
}

run_step() {  # name cap command
  local name=$1 cap=$2 cmd=$3
  local left=$((BUDGET - (SECONDS - T0)))
  if [ "$left" -lt 15 ] || [ $((left * 4)) -lt "$cap" ]; then
    record "$name" NOT-RUN 0 "budget: ${left} s left of ${BUDGET}, cap ${cap} s"
    return
  fi
  local limit=$((cap < left ? cap : left))
  LOG=$LOGS/$name.log
  DETAIL=$WORK/$name.detail
  : >"$DETAIL"
  local start=$SECONDS
  # In the session's process group, so that whoever kills the session's
  # group takes the step too; a timeout kills the step's process tree.
  (eval "$cmd") >"$LOG" 2>&1 </dev/null &
  local pid=$!
  STEP_PID=$pid
  local status=""
  while kill -0 "$pid" 2>/dev/null; do
    if [ $((SECONDS - start)) -ge "$limit" ]; then
      backtrace "$pid" >"$LOGS/$name.backtrace" 2>&1
      kill_tree "$pid"
      status=TIMEOUT
      echo "timed out after ${limit} s (cap ${cap} s); backtraces in $name.backtrace" >"$DETAIL"
      break
    fi
    sleep 0.2
  done
  wait "$pid" 2>/dev/null
  local rc=$?
  STEP_PID=""
  if [ -z "$status" ]; then
    if [ "$rc" = 0 ]; then status=PASS; else status=FAIL; fi
    [ "$status" = PASS ] || [ -s "$DETAIL" ] ||
      echo "exit $rc: $(tail -n 1 "$LOG")" >"$DETAIL"
  fi
  record "$name" "$status" $((SECONDS - start)) "$(head -c 300 "$DETAIL" | head -1)"
}

cleanup() {
  if [ -n "${PACKER:-}" ]; then
    pkill -P "$PACKER" 2>/dev/null
    kill "$PACKER" 2>/dev/null
  fi
  summarize
  pack
  rm -f "$OUT/logs.tgz.part"
  rm -rf "$WORK"
}
trap cleanup EXIT
# Stopped from outside: the running step's processes go too.
STEP_PID=""
trap '[ -n "$STEP_PID" ] && kill_tree "$STEP_PID"; exit 143' TERM INT
(while sleep "$PACK_EVERY"; do pack; done) &
PACKER=$!
disown "$PACKER"

if [ -z "$STEPS_FILE" ]; then
  [ -f "$KIT/kit.tar.xz" ] || {
    echo "session.sh: no kit at $KIT (bash tests/gpu/kit.sh $KIT)"
    exit 2
  }
  KIT=$(cd "$KIT" && pwd)
  mkdir -p "$WORK/kit"
  python3 -c 'import lzma, sys, tarfile; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])' \
    "$KIT/kit.tar.xz" "$WORK/kit" || { echo "cannot unpack the kit"; exit 1; }
  BIN=$WORK/kit/bin
  # NCCL and cuBLAS from the Python packages when present, else the toolkit.
  py_libs=$(python3 - <<'EOF' 2>/dev/null
import importlib, os
for m in ("nvidia.nccl", "nvidia.cublas", "nvidia.cu13", "nvidia.cuda_runtime"):
    try:
        for p in importlib.import_module(m).__path__:
            for d in (os.path.join(p, "lib"), os.path.join(p, "lib64")):
                if os.path.isdir(d):
                    print(d)
    except Exception:
        pass
EOF
)
  LD=$WORK/kit/lib
  for d in $py_libs /usr/local/cuda/lib64 /usr/local/cuda/lib; do
    [ -d "$d" ] && LD=$LD:$d
  done
  export LD_LIBRARY_PATH=$LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  SHARDLM_MODEL=$(ls "$KIT"/models/*.gguf | head -1)
  export SHARDLM_MODEL
fi

case $DEBUG in
  "") ;;
  nccl) export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL,NET ;;
  blocking) export CUDA_LAUNCH_BLOCKING=1 ;;
  sanitizer)
    if command -v compute-sanitizer >/dev/null; then
      WRAP=(compute-sanitizer --tool memcheck --error-exitcode 97)
    else
      echo "no compute-sanitizer on this machine" >&2
      exit 2
    fi
    ;;
  *) usage ;;
esac

# --only's steps, each checked against the list before anything runs.
for want in ${ONLY//,/ }; do
  case " ${STEP_NAMES[*]} " in
    *" $want "*) ;;
    *) echo "session.sh: no step '$want' (--list names them)" >&2; exit 2 ;;
  esac
done
for i in "${!STEP_NAMES[@]}"; do
  name=${STEP_NAMES[$i]}
  case ",$ONLY,probe," in
    ,,*|*",$name,"*) ;;
    *) continue ;;
  esac
  run_step "$name" "${STEP_CAPS[$i]}" "${STEP_CMDS[$i]}"
done

cleanup
trap - EXIT
echo
cat "$OUT/summary.txt"
! awk -F'\t' 'NR > 1 && ($2 == "FAIL" || $2 == "TIMEOUT") {bad = 1} END {exit !bad}' \
  "$OUT/summary.tsv"
