#!/usr/bin/env bash
# The whole GPU check in one command, run from the repository root on a machine with an
# NVIDIA GPU: the CUDA test programs, single-GPU training throughput of
# configs/bench-124m.yaml and configs/bench-1b.yaml, the same shapes in PyTorch
# (scripts/torch_gpt2_bench.py), and a short table last.
#
# Binaries: from .device-bundle/ (made by scripts/device_bundle.sh on a build machine and
# copied here); without one, the script builds build-device/ here, which needs this
# machine to have the build dependencies (yaml-cpp, CLI11, spdlog, nlohmann-json,
# OpenBLAS, MPI, GoogleTest; DEPS_PREFIX=DIR adds a prefix holding them).
# cuBLASLt and NCCL come from this machine: the CUDA toolkit, or PyTorch's nvidia wheels.
#
# Logs and metrics go to $OUT (default ./device-check-out). Exit status: 0 when every
# CUDA test passed and both pptrain runs finished; 1 otherwise (the benchmarks and the
# table run regardless).
#
# Environment: BUNDLE (default .device-bundle), WARMUP steps not counted (default 5),
# PEAK_TFLOPS (MFU denominator; default: the peak pptrain reports for this GPU),
# BUDGET_S (default 420: later stages are skipped or cut short past it),
# TEST_TIMEOUT_S (default 120 per test program), RUN_TIMEOUT_S (default 150 per run).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-device-check-out}
bundle=${BUNDLE:-.device-bundle}
warmup=${WARMUP:-5}
budget=${BUDGET_S:-420}
test_timeout=${TEST_TIMEOUT_S:-120}
run_timeout=${RUN_TIMEOUT_S:-150}
# Runs: bench-<name>.yaml; a "-fused" suffix adds train.attention=fused to that config.
models=(124m 1b 124m-fused)
base_of() { echo "${1%-fused}"; }
torch_models=(124m 1b)
mkdir -p "$out"
status=0

say() { printf '[device_check %4ds] %s\n' "$SECONDS" "$*"; }
# Seconds a stage may take: its own limit, cut to what is left of the budget (>= 10).
limit() {
  local left=$((budget - SECONDS))
  if [ "$left" -lt "$1" ]; then echo $((left > 10 ? left : 10)); else echo "$1"; fi
}
over_budget() { [ "$SECONDS" -ge "$budget" ]; }

# ---- The GPU ----------------------------------------------------------------------
nvidia-smi -L || say "nvidia-smi failed"
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader \
  2>/dev/null
# MFU's peak: PEAK_TFLOPS, else the one pptrain took from its table (lib/train/mfu.cpp),
# read off its metrics after the first run.
peak=${PEAK_TFLOPS:-0}
say "GPU: ${gpu_name:-none}"

# ---- Binaries ---------------------------------------------------------------------
bin=""
tests=()
if [ -x "$bundle/bin/pptrain" ] || [ -f "$bundle/bin/pptrain.xz" ]; then
  bundle=$(cd "$bundle" && pwd)
  while IFS= read -r -d '' f; do  # large files travel xz-compressed
    xz -d -f "$f" 2>/dev/null ||
      python3 -c 'import lzma, sys; p = sys.argv[1]
open(p[:-3], "wb").write(lzma.open(p).read())' "$f"
    rm -f "$f"
  done < <(find "$bundle" -name '*.xz' -print0)
  chmod +x "$bundle"/bin/* "$bundle"/tests/* 2>/dev/null
  bin=$bundle/bin/pptrain
  for t in "$bundle"/tests/*; do [ -f "$t" ] && tests+=("$t"); done
  export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  say "bundle: $bin and ${#tests[@]} test program(s)"
else
  say "no $bundle: building build-device here (log: $out/build.log)"
  if cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DPPTRAIN_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a ${DEPS_PREFIX:+-DCMAKE_PREFIX_PATH="$DEPS_PREFIX"} \
    >"$out/build.log" 2>&1; then
    mapfile -t targets < <(ninja -C build-device -t targets all |
      sed -n 's|^\(tests/[^:]*/test_[^/:.]*\): .*EXECUTABLE_LINKER.*|\1|p' |
      grep -E '/[^/]*(cuda|nccl|gpu)[^/]*$')
    if timeout "$(limit 300)" ninja -C build-device -j"$(nproc)" pptrain "${targets[@]}" \
      >>"$out/build.log" 2>&1; then
      bin=build-device/pptrain
      for t in "${targets[@]}"; do tests+=("build-device/$t"); done
    fi
  fi
  if [ -n "${DEPS_PREFIX:-}" ]; then
    export LD_LIBRARY_PATH="$DEPS_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  [ -n "$bin" ] || { say "build failed: $(tail -3 "$out/build.log" | tr '\n' ' ')"; status=1; }
fi

# ---- Libraries the binaries need from this machine (cuBLASLt, NCCL, ...) ------------
# Folders that may hold them: the CUDA toolkit's, then PyTorch's nvidia wheels and torch/lib.
lib_dirs() {
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    ${CUDA_HOME:+"$CUDA_HOME/lib64"}; do
    [ -d "$d" ] && echo "$d"
  done
  python3 - <<'PY' 2>/dev/null
import importlib, os
roots = []
for name in ("nvidia", "torch"):
    try:
        roots += list(importlib.import_module(name).__path__)
    except Exception:
        pass
for root in roots:
    for dirpath, _, files in os.walk(root):
        if any(".so" in f for f in files) and os.path.basename(dirpath) in ("lib", "lib64"):
            print(dirpath)
PY
}
if [ -n "$bin" ]; then
  mapfile -t candidates < <(lib_dirs)
  for exe in "$bin" "${tests[@]}"; do ldd "$exe" 2>/dev/null; done |
    awk '/=> not found/ {print $1}' | sort -u >"$out/.missing"
  while read -r name; do
    for d in "${candidates[@]}"; do
      if [ -e "$d/$name" ]; then
        case ":$LD_LIBRARY_PATH:" in *":$d:"*) ;; *) LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d" ;; esac
        say "$name: $d"
        break
      fi
    done
  done <"$out/.missing"
  rm -f "$out/.missing"
  export LD_LIBRARY_PATH
  # The bundle's libstdc++/libgcc_s only when this machine's are too old for the binaries.
  if ldd "$bin" 2>&1 | grep -qE "(GLIBCXX|CXXABI|GCC)_[0-9.]+' not found" &&
    [ -d "$bundle/lib/fallback" ]; then
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$bundle/lib/fallback"
    say "using the bundled libstdc++/libgcc_s"
  fi
  if ldd "$bin" 2>/dev/null | grep "not found"; then
    say "pptrain still misses libraries (above)"
  fi
fi

# ---- CUDA tests -------------------------------------------------------------------
: >"$out/cuda_tests.log"
failed_tests=0
for t in "${tests[@]}"; do
  name=$(basename "$t")
  tlog=$(mktemp)
  timeout "$(limit "$test_timeout")" "$t" --gtest_brief=1 >"$tlog" 2>&1
  rc=$?
  { echo "===== $name (exit $rc)"; cat "$tlog"; } >>"$out/cuda_tests.log"
  summary=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$tlog" | tr '\n' ' ')
  say "test $name: exit $rc ${summary}"
  # A GPU test that skips on a machine with a GPU means the program saw no device.
  if [ "$rc" -eq 0 ] && [ -n "$gpu_name" ] && grep -q "no CUDA device" "$tlog"; then
    say "test $name: skipped for want of a CUDA device, but nvidia-smi lists $gpu_name"
    rc=1
  fi
  if [ "$rc" -ne 0 ]; then
    failed_tests=$((failed_tests + 1))
    grep -E '^\[  FAILED  \] [A-Za-z]' "$tlog" | sed 's/ (.*//' | sort -u | head -20 |
      sed 's/^/    /'
    [ "$rc" -eq 124 ] && say "test $name: timed out"
  fi
  rm -f "$tlog"
done
[ "${#tests[@]}" -gt 0 ] || say "no CUDA test programs"
[ "$failed_tests" -eq 0 ] || status=1

# ---- pptrain training throughput ----------------------------------------------------
steps_of() { sed -n 's/^  steps: *\([0-9]*\).*/\1/p' "configs/bench-$(base_of "$1").yaml" | head -1; }
for m in "${models[@]}"; do
  [ -n "$bin" ] || break
  if over_budget; then say "pptrain $m: skipped (over the ${budget}s budget)"; continue; fi
  rm -f "$out/metrics_$m.jsonl"
  smi_log=$(mktemp)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 \
    >"$smi_log" 2>/dev/null &
  smi_pid=$!
  say "pptrain $m: $(steps_of "$m") steps"
  extra=()
  [ "$m" != "$(base_of "$m")" ] && extra=(--set train.attention=fused)
  timeout "$(limit "$run_timeout")" "$bin" --config "configs/bench-$(base_of "$m").yaml" \
    --set logging.metrics="$out/metrics_$m.jsonl" "${extra[@]}" >"$out/pptrain_$m.log" 2>&1
  rc=$?
  kill "$smi_pid" 2>/dev/null
  wait "$smi_pid" 2>/dev/null
  sort -n "$smi_log" | tail -1 >"$out/.smi_$m"
  rm -f "$smi_log"
  tail -3 "$out/pptrain_$m.log"
  if [ "$rc" -ne 0 ]; then say "pptrain $m: exit $rc"; status=1; fi
  if [ "$peak" = 0 ] && [ -f "$out/metrics_$m.jsonl" ]; then
    peak=$(python3 -c 'import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(next(("%.6g" % (r["tflops_per_rank"] / r["mfu"]) for r in rows if r.get("mfu")), 0))' \
      "$out/metrics_$m.jsonl" 2>/dev/null || echo 0)
    [ "$peak" = 0 ] || say "MFU peak (pptrain's): $peak TFLOP/s"
  fi
done

# ---- PyTorch baseline -------------------------------------------------------------
: >"$out/torch.log"
if python3 -c 'import torch' 2>/dev/null; then
  for m in "${torch_models[@]}"; do
    if over_budget; then say "torch $m: skipped (over the ${budget}s budget)"; continue; fi
    say "torch $m"
    PYTHONUNBUFFERED=1 timeout "$(limit "$run_timeout")" python3 scripts/torch_gpt2_bench.py \
      --config "configs/bench-$m.yaml" --name "$m" --steps "$(steps_of "$m")" \
      --warmup "$warmup" --peak-tflops "$peak" >>"$out/torch.log" 2>&1 ||
      say "torch $m: failed (see torch.log)"
    grep '^{' "$out/torch.log" | tail -1
  done
else
  say "no PyTorch: no baseline"
fi

# ---- Summary table (last) -----------------------------------------------------------
python3 - "$out" "$warmup" "$peak" "${models[@]}" <<'PY' | tee "$out/summary.md"
import json, os, statistics, sys

out, warmup, peak, models = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]

def med(rows, key):
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.median(vals) if vals else None

torch = {}
for line in open(os.path.join(out, "torch.log"), errors="replace"):
    if line.startswith("{"):
        try:
            rec = json.loads(line)
            torch[rec.get("name")] = rec
        except ValueError:
            pass

rows, own_mfu = [], False
for m in models:
    path = os.path.join(out, f"metrics_{m}.jsonl")
    recs = []
    if os.path.exists(path):
        recs = [json.loads(l) for l in open(path) if l.strip()]
    timed = [r for r in recs if r.get("step", 0) > warmup]
    tok = med(timed, "tokens_per_s")
    mfu = med(timed, "mfu")  # pptrain's own, from its peak table or train.peak_tflops
    own_mfu = own_mfu or bool(mfu)
    if not mfu and med(timed, "tflops_per_rank") is not None and peak > 0:
        mfu = med(timed, "tflops_per_rank") / peak
    mem = None
    if any("peak_device_mib" in r for r in timed):  # the backend's most allocated
        mem = f"{max(r.get('peak_device_mib', 0) for r in timed) / 1024:.1f} GiB"
    smi = os.path.join(out, f".smi_{m}")
    if mem is None and os.path.exists(smi) and open(smi).read().strip():
        mem = f"{float(open(smi).read()) / 1024:.1f} GiB (smi)"
    t = torch.get(m.removesuffix("-fused"), {}).get("tokens_per_s")
    ratio = f"{tok / t:.2f}" if tok and t else "-"
    rows.append((f"bench-{m}", f"{tok:,.0f}" if tok else "-", f"{100 * mfu:.1f}%" if mfu else "-",
                 mem or "-", f"{t:,.0f}" if t else "-", ratio))
    print(f"{m}: {len(timed)} timed steps of {len(recs)}; torch: "
          f"{json.dumps({k: torch.get(m.removesuffix('-fused'), {}).get(k) for k in ('mfu', 'peak_mem_gib', 'step_ms')})}")

basis = "as pptrain reports it" if own_mfu else f"against {peak:g} TFLOP/s"
print(f"\nMFU {basis} (dense bf16 peak); medians of steps > {warmup}; "
      f"ratio = pptrain / torch tokens/s")
head = ("model", "pptrain tok/s", "MFU", "peak mem", "torch tok/s", "ratio")
width = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
line = lambda r: "| " + " | ".join(str(c).rjust(w) for c, w in zip(r, width)) + " |"
print(line(head))
print("|" + "|".join("-" * (w + 2) for w in width) + "|")
for r in rows:
    print(line(r))
PY
rm -f "$out"/.smi_*
say "done: exit $status"
exit "$status"
