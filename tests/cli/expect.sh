#!/usr/bin/env bash
# Runs a command and checks its exit code and that its output (stdout+stderr) matches
# an extended regex. Usage: expect.sh EXIT_CODE REGEX COMMAND [ARGS...]
code=$1 regex=$2
shift 2
out=$("$@" 2>&1)
rc=$?
if [ "$rc" -ne "$code" ]; then
  printf 'expected exit %s, got %s from: %s\n%s\n' "$code" "$rc" "$*" "$out"
  exit 1
fi
if ! grep -Eq -- "$regex" <<<"$out"; then
  printf 'output of "%s" does not match /%s/:\n%s\n' "$*" "$regex" "$out"
  exit 1
fi
echo "ok: exit $rc, matched /$regex/"
