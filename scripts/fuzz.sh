#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ (clang, AddressSanitizer, UBSan) into their own
# build dir and fuzzes each for a bounded time, starting from fuzz/corpus/<target> and
# fuzz/regressions/<target>. Exits non-zero if any target crashes, hangs or runs out of
# memory, and prints where the offending input was saved.
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET (default 60)] [TARGET ...]
#   targets: config safetensors token_file (default: all)
#   env PPTRAIN_FUZZ_BUILD: build dir (default build-fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
[ $# -gt 0 ] && shift
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(config safetensors token_file)
build="${PPTRAIN_FUZZ_BUILD:-build-fuzz}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET ...]" >&2
  exit 2
fi
for t in "${targets[@]}"; do
  [ -f "fuzz/${t}_fuzzer.cpp" ] || { echo "unknown fuzz target '$t'" >&2; exit 2; }
done

# clang and its runtime libraries (libFuzzer, sanitizers), and the parsers' libraries,
# installed only when missing: this runs before scripts/setup.sh on a fresh machine.
# (the runtime's package is named after clang's major version, known once clang is there).
scripts/install_packages.sh clang cmake ninja-build libyaml-cpp-dev nlohmann-json3-dev
scripts/install_packages.sh "libclang-rt-$(clang++ -dumpversion | cut -d. -f1)-dev"

cmake -S fuzz -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build "$build" -j"$(nproc)" --target "${targets[@]/%/_fuzzer}"

export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_stack_use_after_return=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
failed=()
for t in "${targets[@]}"; do
  work="$build/corpus/$t"        # inputs found by earlier runs (kept between local runs)
  artifacts="$build/artifacts/$t"
  log="$build/logs/$t.log"
  mkdir -p "$work" "$artifacts" "$(dirname "$log")"
  dirs=("$work" "fuzz/corpus/$t")
  [ -d "fuzz/regressions/$t" ] && dirs+=("fuzz/regressions/$t")
  opts=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$artifacts/")
  [ -f "fuzz/$t.dict" ] && opts+=(-dict="fuzz/$t.dict")
  echo "== fuzzing $t for ${seconds}s (log: $log)"
  # The outer timeout only guards against libFuzzer itself wedging.
  if timeout --kill-after=10 $((seconds + 120)) "$build/${t}_fuzzer" "${opts[@]}" "${dirs[@]}" \
      >"$log" 2>&1; then
    grep -E "^(Done [0-9]+ runs|stat::new_units_added|stat::peak_rss_mb)" "$log" || true
  else
    failed+=("$t")
    echo "!! $t FAILED; the last lines of its log:"
    tail -n 60 "$log"
    saved="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)"
    if [ -n "$saved" ]; then
      echo "!! $t: offending input saved to $saved"
      echo "!! reproduce: $build/${t}_fuzzer $saved"
      echo "!! once fixed, keep it as a regression: cp $saved fuzz/regressions/$t/"
    else
      echo "!! $t: no input was saved (see $log)"
    fi
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzzing found problems in: ${failed[*]}"
  exit 1
fi
echo "fuzzing: no findings in ${targets[*]}"
