#!/usr/bin/env bash
# GPU acceptance check for a bare CUDA machine (NVIDIA driver with CUDA 13; no Rust, no
# network): runs the release `sparkd` that sits next to this script (or $SPARKD) and
# prints a short table.
#
#   1. parity: GPU against CPU on small synthetic models (every legacy and float weight
#      format and IQ4_NL on a tiny llama, the other architectures, the Q4_K/Q6_K mix at
#      head size 64 and Q2_K, Q3_K and IQ4_XS alone at those shapes, and Llama-3-8B
#      shapes with the mix at one layer): `sparkd gpu-parity` must report a max
#      relative logit error < 1e-2
#      and 32 greedy steps equal to the CPU's, on the f32 paths and again on the
#      tensor-core paths (f16 operands); the reference is the CPU forward with f32
#      activations and exact sums (not the served CPU path, whose
#      8-bit activations alone move logits by up to 1e-2), so the f32 paths must come
#      within 1e-3; a different pick passes only as a near tie (within 1e-2 in the
#      CPU's logits: random weights make ties common);
#   2. benchmark on Llama-3-8B shapes (random weights): decode tok/s at batch 1, 8, 32,
#      prefill tok/s at 512 and 2048 tokens, and decode GB/s against a measured
#      device-to-device copy.
#
# What it expects from sparkd (subcommands of the CUDA backend):
#   sparkd synth --out F [--preset tiny|small|llama3-8b] [--arch A] [--weight-type T] [--layers N]
#     (exists today) writes a synthetic GGUF.
#   sparkd gpu-parity --model F --steps 32
#     prints ONE line of JSON, flat:
#       {"model":"F","device":"NVIDIA GB10","steps":32,"max_rel_err":0.0004,
#        "f32_max_rel_err":0.0000005,"greedy_matched":32,"near_tie_steps":0,
#        "tc_steps":32,"tc_max_rel_err":0.0004,"tc_greedy_matched":31,
#        "tc_near_tie_steps":1,"pass":true}
#     Two runs. The first, all in f32 (mat-vec, f32 KV cache): two sequences, 48- and
#     20-token prompts prefilled together, then decoded as a batch of two. The second
#     ("tc_"), the tensor-core paths: five sequences, 266 prompt tokens through the
#     GEMM, decoded on the tensor-core mat-mul. max_rel_err = max over both runs'
#     compared rows of max|gpu - cpu| / max|cpu| (the prompts' last logits and each
#     decode step; both backends are fed the CPU's greedy tokens so one flip does not
#     cascade), f32_max_rel_err and tc_max_rel_err each run's own; greedy_matched =
#     steps whose GPU argmax equals the CPU's in every row; near_tie_steps = the other
#     steps where each different pick is within 1e-2 of the CPU's best logit. Exit 0
#     when f32_max_rel_err < 1e-3, tc_max_rel_err < 1e-2 and, in each run,
#     greedy_matched + near_tie_steps == steps; 1 when not; anything else for errors
#     (no GPU, unsupported model).
#   sparkd bench --device cuda --model F --batches 1,8,32 --prefill 512,2048 --json
#     prints JSON lines, one flat object per measurement:
#       {"kind":"device","name":"NVIDIA GB10","sm":"sm_121","memory_bytes":128000000000}
#       {"kind":"copy","gb_s":230.5}            device-to-device copy, (read+write)/time
#       {"kind":"decode","batch":8,"graphs":true,"pdl":true,"matmul":"mmq","tok_s":310.2,
#        "gb_s":201.7,"served_tok_s":290.0,"served_logits_tok_s":250.3}
#                                               gb_s = bytes read per step (weights and
#                                               KV) / step time; batch 1 comes
#                                               again without CUDA graphs and (where
#                                               the device takes it, sm_90+) without
#                                               programmatic dependent launch; larger
#                                               batches twice, on the tensor-core
#                                               mat-mul (first) and on the mat-vec;
#                                               served_*: the host's clock around each
#                                               step with its copies and picks, with
#                                               greedy picks made on the device (as the
#                                               engine does for greedy requests) and,
#                                               on the first line of a batch only, with
#                                               whole logit rows to the host (sampled)
#       {"kind":"prefill","tokens":512,"pdl":true,"tok_s":4100.0}
#   with --profile, then per-kernel device times (graphs off, each launch timed):
#       {"kind":"profile","phase":"decode batch 1","steps":9,"kernel":"mmv_q4_k_b1",
#        "launches":1152,"ms_per_step":5.1,"share":0.62}
#                                               phases: decode at the smallest and the
#                                               largest batch, prefill at the longest
#       {"kind":"profile_error","error":"..."}  if timing failed (the rest stands)
#
# Usage: gpu-check.sh [--work DIR] [--results DIR] [--budget SECONDS] [--skip-bench] [--skip-parity] [--smoke]
#   --results DIR: also write there, as they come, what this prints (gpu-check.txt),
#   sparkd's log (gpu-check.log) and the benchmark's JSON lines (bench.jsonl), apart
#   from the multi-GB models in the work dir: on a lent machine, point it at $OUT, so
#   that a run cut short by the command's time limit still brings back what it measured.
#   --budget SECONDS (or GPU_CHECK_BUDGET): the time the whole run may take, for a
#   command with a time limit: parity starts no new model past about half of it (the
#   rest is said as skipped), and the benchmark gets what is left (a minute at least) as
#   its timeout, so that one call brings back both parity and figures.
#   --smoke: a rehearsal of this script on one tiny one-layer model (parity for 2 steps,
#   the benchmark at small sizes), for CI, where it runs through the stand-in
#   CUDA driver (tests/tests/cuda_fake_driver.rs); its figures mean nothing.
# Env: SPARKD (binary), SPARKD_GPU_CHECK_DIR (work dir, default ./gpu-check-work next to
# this script; synthetic models and the compiled kernels are kept there and reused),
# GPU_CHECK_PARITY_TIMEOUT and GPU_CHECK_BENCH_TIMEOUT (seconds for each parity run and
# for the benchmark; 300 and 900 by default: lower them to fit a time-limited session).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
SPARKD=${SPARKD:-$HERE/sparkd}
WORK=${SPARKD_GPU_CHECK_DIR:-$HERE/gpu-check-work}
RESULTS=""
PARITY_TIMEOUT=${GPU_CHECK_PARITY_TIMEOUT:-300}
BENCH_TIMEOUT=${GPU_CHECK_BENCH_TIMEOUT:-900}
BUDGET=${GPU_CHECK_BUDGET:-0}
DO_PARITY=1
DO_BENCH=1
SMOKE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --work) WORK=$2; shift 2 ;;
    --results) RESULTS=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --skip-bench) DO_BENCH=0; shift ;;
    --skip-parity) DO_PARITY=0; shift ;;
    --smoke) SMOKE=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument $1" >&2; exit 2 ;;
  esac
done

die() { echo "gpu-check: $*" >&2; exit 1; }
case "$BUDGET" in ''|*[!0-9]*) die "--budget takes whole seconds, not '$BUDGET'" ;; esac
# Seconds since the script started ($SECONDS counts from the shell's start).
elapsed() { echo "$SECONDS"; }
# The value of "key" in a flat JSON object (numbers, booleans, strings without commas).
field() { printf '%s\n' "$1" | sed -n "s/.*\"$2\": *\"\{0,1\}\([^,\"}]*\).*/\1/p" | head -n1; }
# A number as 1.23e-04 (nothing for nothing).
sci() { [ -z "$1" ] || awk -v e="$1" 'BEGIN { printf "%.2e", e }'; }

[ -x "$SPARKD" ] || die "no sparkd binary at $SPARKD (set SPARKD=...)"

# sparkd compiles its kernels with NVRTC, loaded by soname (libnvrtc.so.13). A toolkit
# or a pip wheel outside the loader's search path is found here and named to sparkd.
find_nvrtc() {
  local dirs=() d
  IFS=: read -r -a dirs <<< "${LD_LIBRARY_PATH:-}"
  for d in "${dirs[@]}"; do
    [ -n "$d" ] && compgen -G "$d/libnvrtc.so.13*" > /dev/null && return 1  # found by the loader
  done
  ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so\.13' && return 1
  dirs=()
  [ -n "${CUDA_HOME:-}" ] && dirs+=("$CUDA_HOME/lib64" "$CUDA_HOME/lib")
  dirs+=(/usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda*/targets/*/lib)
  while IFS= read -r d; do dirs+=("$d/nvidia"); done < <(python3 -c \
    'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null || true)
  for d in "${dirs[@]}"; do
    [ -d "$d" ] || continue
    find "$d" -maxdepth 3 -name 'libnvrtc.so.13*' ! -name '*builtins*' 2>/dev/null | sort | head -n1
  done | head -n1
}
if [ -z "${SPARKD_NVRTC_LIB:-}" ]; then
  nvrtc=$(find_nvrtc || true)
  [ -n "$nvrtc" ] && export SPARKD_NVRTC_LIB="$nvrtc"
fi
mkdir -p "$WORK"
# The compiled kernels are cached in the work dir, so only the first sparkd run pays
# NVRTC (tens of seconds), whatever HOME is on the machine.
export SPARKD_CACHE="${SPARKD_CACHE:-$WORK/cache}"
OUTDIR=$WORK
if [ -n "$RESULTS" ]; then
  mkdir -p "$RESULTS"
  OUTDIR=$RESULTS
  # Everything printed from here on lands in the results as well, line by line.
  exec > >(tee "$RESULTS/gpu-check.txt") 2>&1
fi
LOG="$OUTDIR/gpu-check.log"
BENCH="$OUTDIR/bench.jsonl"
: > "$LOG"
"$SPARKD" --help > "$WORK/help.txt" 2>&1 || true
has_subcommand() { grep -qE "^  $1( |$)" "$WORK/help.txt"; }
for sub in synth gpu-parity bench; do
  has_subcommand "$sub" || die "this sparkd has no '$sub' subcommand (built without the CUDA backend?)"
done

echo "== sparkd GPU check"
echo "sparkd:  $("$SPARKD" --version 2>/dev/null || echo unknown) ($SPARKD)"
if command -v nvidia-smi > /dev/null; then
  echo "device:  $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n1)"
fi
echo "nvrtc:   ${SPARKD_NVRTC_LIB:-found by the loader (or missing: sparkd says which)}"
echo "work:    $WORK (log: $LOG)"

# Writes a synthetic model once; later runs reuse it.
synth() {
  local out="$WORK/$1.gguf"; shift
  if [ ! -s "$out" ]; then
    "$SPARKD" synth --out "$out.tmp" "$@" >> "$LOG" 2>&1 || die "sparkd synth $* failed (see $LOG)"
    mv "$out.tmp" "$out"
  fi
  printf '%s' "$out"
}

failures=0
skipped=0
if [ "$DO_PARITY" = 1 ]; then
  models=()
  steps=32
  if [ "$SMOKE" = 1 ]; then
    models+=("$(synth smoke-llama-1layer --preset tiny --layers 1)")
    steps=2
  else
    for t in Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 IQ4_NL F16 BF16; do
      models+=("$(synth "tiny-llama-$t" --preset tiny --arch llama --weight-type "$t")")
    done
    models+=("$(synth tiny-qwen2 --preset tiny --arch qwen2)")
    models+=("$(synth tiny-qwen3 --preset tiny --arch qwen3)")
    models+=("$(synth tiny-mistral3 --preset tiny --arch mistral3)")
    models+=("$(synth small-q4_k_m --preset small)")
    # No preset mixes in Q2_K, Q3_K or IQ4_XS, and they need rows of 256: the small
    # shapes with every layer matrix and the head in the one format.
    for t in Q2_K Q3_K IQ4_XS; do
      models+=("$(synth "small-llama-$t" --preset small --weight-type "$t")")
    done
    # K-quants need rows of 256: real 8B shapes, one layer.
    models+=("$(synth llama3-8b-1layer --preset llama3-8b --layers 1)")
  fi
  echo
  echo "parity: GPU vs CPU reference logits, max rel err (< 1e-3 on the f32 paths, < 1e-2 on"
  echo "the tensor-core paths) and greedy steps (equal+near ties/steps), $steps steps each"
  printf '  %-24s %10s %8s %10s %8s  %s\n' model "f32 err" f32 "tc err" tc result
  # Past this, no new parity run starts: the rest of the budget is the benchmark's.
  parity_until=0
  if [ "$BUDGET" -gt 0 ]; then
    parity_until=$((BUDGET - 30))
    [ "$DO_BENCH" = 1 ] && parity_until=$((BUDGET * 55 / 100))
  fi
  for m in "${models[@]}"; do
    name=$(basename "$m" .gguf)
    if [ "$BUDGET" -gt 0 ] && [ "$(elapsed)" -ge "$parity_until" ]; then
      printf '  %-24s %10s %8s %10s %8s  %s\n' "$name" - - - - "skipped (time budget)"
      skipped=$((skipped + 1))
      continue
    fi
    run_timeout=$PARITY_TIMEOUT
    if [ "$BUDGET" -gt 0 ]; then
      # One slow model must not eat the benchmark's share.
      left=$((parity_until - $(elapsed) + 60))
      [ "$left" -lt "$run_timeout" ] && run_timeout=$left
    fi
    set +e
    line=$(timeout "$run_timeout" "$SPARKD" gpu-parity --model "$m" --steps "$steps" 2>> "$LOG" | tail -n1)
    rc=$?
    set -e
    f32_err=$(field "$line" f32_max_rel_err)
    tc_err=$(field "$line" tc_max_rel_err)
    ran=$(field "$line" steps)
    f32="$(field "$line" greedy_matched)+$(field "$line" near_tie_steps)/$ran"
    [ "$f32" = "+/" ] && f32=-
    tc="$(field "$line" tc_greedy_matched)+$(field "$line" tc_near_tie_steps)/$(field "$line" tc_steps)"
    [ "$tc" = "+/" ] && tc=-
    case $rc in
      0) verdict=ok ;;
      1) verdict=FAIL; failures=$((failures + 1)) ;;
      124) verdict="ERROR (timed out)"; failures=$((failures + 1)) ;;
      *) verdict="ERROR (exit $rc, see log)"; failures=$((failures + 1)) ;;
    esac
    f32_err=$(sci "$f32_err"); tc_err=$(sci "$tc_err")
    printf '  %-24s %10s %8s %10s %8s  %s\n' "$name" "${f32_err:--}" "$f32" "${tc_err:--}" "$tc" "$verdict"
  done
fi

if [ "$DO_BENCH" = 1 ]; then
  if [ "$SMOKE" = 1 ]; then
    m=$(synth smoke-llama-1layer --preset tiny --layers 1)
    batches=1,32; prefill=64,128; what="tiny shapes, a rehearsal"
  else
    avail_kb=$(df -Pk "$WORK" | awk 'NR == 2 {print $4}')
    [ "${avail_kb:-0}" -gt 8000000 ] || [ -s "$WORK/llama3-8b.gguf" ] \
      || die "need ~8 GB free in $WORK for the Llama-3-8B-shaped model"
    m=$(synth llama3-8b --preset llama3-8b)
    batches=1,8,32; prefill=512,2048; what="Llama-3-8B shapes, Q4_K/Q6_K mix, random weights"
  fi
  echo
  echo "benchmark: $(basename "$m") ($what)"
  bench_timeout=$BENCH_TIMEOUT
  if [ "$BUDGET" -gt 0 ]; then
    left=$((BUDGET - $(elapsed) - 10))
    [ "$left" -lt 60 ] && left=60
    [ "$left" -lt "$bench_timeout" ] && bench_timeout=$left
    echo "  (time budget: ${bench_timeout} s for the benchmark)"
  fi
  set +e
  timeout "$bench_timeout" "$SPARKD" bench --device cuda --model "$m" --batches "$batches" \
    --prefill "$prefill" --profile --json > "$BENCH" 2>> "$LOG"
  rc=$?
  set -e
  [ $rc = 0 ] || { echo "  bench failed (exit $rc, see $LOG)"; failures=$((failures + 1)); }
  # Where each phase's device time goes: its six costliest kernels.
  phase=""; shown=0
  while IFS= read -r line; do
    case "$(field "$line" kind)" in
      profile)
        p=$(field "$line" phase)
        if [ "$p" != "$phase" ]; then
          [ -n "$phase" ] || { echo; echo "  where the time goes (launch by launch, no graphs)"; }
          phase=$p; shown=0
          echo "    $phase ($(field "$line" steps) steps)"
        fi
        shown=$((shown + 1))
        if [ "$shown" -le 6 ]; then
          awk -v k="$(field "$line" kernel)" -v ms="$(field "$line" ms_per_step)" \
            -v sh="$(field "$line" share)" -v n="$(field "$line" launches)" -v st="$(field "$line" steps)" \
            'BEGIN { printf "      %-28s %9.3f ms/step %5.1f%% %6.1f launches/step\n", k, ms, 100 * sh, n / (st > 0 ? st : 1) }'
        fi ;;
      profile_error) echo "  kernel profile failed: $(field "$line" error)" ;;
    esac
  done < "$BENCH"
  echo
  copy=""
  while IFS= read -r line; do
    case "$(field "$line" kind)" in
      device) echo "  device   $(field "$line" name) ($(field "$line" sm))" ;;
      copy) copy=$(field "$line" gb_s)
            printf '  %-26s %10s %10.1f GB/s\n' "device copy" "" "$copy" ;;
    esac
  done < "$BENCH"
  # The first line is the default; "no PDL" marks the comparison line only where the
  # default has programmatic dependent launch on (sm_90+).
  pdl_default_on=$(grep -m1 '"kind":"decode"' "$BENCH" | grep -q '"pdl":true' && echo 1 || true)
  while IFS= read -r line; do
    case "$(field "$line" kind)" in
      decode)
        gb=$(field "$line" gb_s)
        pct=$(awk -v g="$gb" -v c="${copy:-0}" 'BEGIN { if (c > 0) printf "(%.0f%% of copy)", 100 * g / c }')
        label="decode batch $(field "$line" batch)"
        [ "$(field "$line" graphs)" = false ] && label="$label, no graphs"
        [ "$(field "$line" pdl)" = false ] && [ -n "$pdl_default_on" ] && label="$label, no PDL"
        # Batches past mmq_min_tokens come twice: the default (tensor-core mat-mul),
        # then the mat-vec, for the crossover.
        [ "$(field "$line" batch)" != 1 ] && [ "$(field "$line" matmul)" = mmv ] \
          && label="$label, mat-vec"
        printf '  %-26s %10.1f tok/s %7.1f GB/s %s\n' "$label" \
          "$(field "$line" tok_s)" "$gb" "$pct"
        # What the serving loop gets around those device steps.
        whole=$(field "$line" served_logits_tok_s)
        [ -n "$whole" ] && printf '    %-24s %10.1f tok/s greedy on the device, %.1f with whole logits\n' \
          "served (host clock)" "$(field "$line" served_tok_s)" "$whole" ;;
      prefill)
        printf '  %-26s %10.1f tok/s\n' "prefill $(field "$line" tokens)" "$(field "$line" tok_s)" ;;
    esac
  done < "$BENCH"
  # The issue's goals (set for an H200): reported, not failed, since the card varies.
  b1_gb=""; b1_tok=""; b32_tok=""; pf2048=""
  while IFS= read -r line; do
    case "$(field "$line" kind):$(field "$line" batch):$(field "$line" graphs):$(field "$line" tokens)" in
      # The first line of a batch is the default configuration.
      decode:1:true:*) [ -n "$b1_gb" ] || { b1_gb=$(field "$line" gb_s); b1_tok=$(field "$line" tok_s); } ;;
      decode:32:true:*) [ -n "$b32_tok" ] || b32_tok=$(field "$line" tok_s) ;;
      prefill:*:*:2048) pf2048=$(field "$line" tok_s) ;;
    esac
  done < "$BENCH"
  goal() { # label value target unit
    awk -v l="$1" -v v="$2" -v t="$3" -v u="$4" 'BEGIN {
      if (v == "") { printf "  %-30s %s\n", l, "not measured"; exit }
      printf "  %-30s %8.1f%s (goal >= %s%s) %s\n", l, v, u, t, u, (v + 0 >= t + 0 ? "met" : "NOT met") }'
  }
  echo
  echo "goals"
  goal "decode batch 1, % of copy" \
    "$(awk -v g="$b1_gb" -v c="${copy:-0}" 'BEGIN { if (g != "" && c > 0) printf "%.1f", 100 * g / c }')" 60 "%"
  goal "decode batch 32 / batch 1" \
    "$(awk -v a="$b32_tok" -v b="$b1_tok" 'BEGIN { if (a != "" && b > 0) printf "%.2f", a / b }')" 10 "x"
  goal "prefill 2048 tokens" "$pf2048" 10000 " tok/s"
fi

echo
if [ "$failures" -gt 0 ]; then
  echo "gpu-check: $failures check(s) failed"
  exit 1
fi
if [ "$skipped" -gt 0 ]; then
  echo "gpu-check: all checks that ran passed; $skipped parity model(s) skipped for the time budget"
  exit 0
fi
echo "gpu-check: all checks passed"
