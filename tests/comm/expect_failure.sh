#!/usr/bin/env bash
# Runs a command that must fail: checks a non-zero exit within MAX_SECONDS (whole) and that its
# output (stdout+stderr) matches an extended regex.
# Usage: expect_failure.sh MAX_SECONDS REGEX COMMAND [ARGS...]
max=$1 regex=$2
shift 2
start=$(date +%s%N)
out=$("$@" 2>&1)
rc=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
elapsed=$((elapsed_ms / 1000)).$(printf %03d $((elapsed_ms % 1000)))
if [ "$rc" -eq 0 ]; then
  printf 'expected a failure, got exit 0 from: %s\n%s\n' "$*" "$out"
  exit 1
fi
if [ "$elapsed_ms" -gt $((max * 1000)) ]; then
  printf 'took %s s, more than %s s: %s\n%s\n' "$elapsed" "$max" "$*" "$out"
  exit 1
fi
if ! grep -Eq -- "$regex" <<<"$out"; then
  printf 'output of "%s" does not match /%s/:\n%s\n' "$*" "$regex" "$out"
  exit 1
fi
echo "ok: exit $rc after ${elapsed} s, matched /$regex/"
