#!/usr/bin/env bash
# Builds a Release pptrain with the CUDA backend for Hopper (sm_90a) and its CUDA test
# programs, and gathers them with the shared libraries they need into .device-bundle/,
# ready to be copied to a GPU machine that lacks this machine's packages
# (scripts/device_check.sh runs them there).
#
# Layout: bin/pptrain, tests/<CUDA test programs>, lib/<libraries>, lib/fallback/
# (libstdc++ and libgcc_s, used only where the target's own are too old), configs/.
# Not bundled: the C library and loader, and the CUDA driver, cuBLASLt, NCCL and CUDA
# runtime libraries, which the GPU machine's CUDA toolkit or PyTorch wheels provide.
# Large files are compressed (.xz) when the bundle would exceed BUNDLE_LIMIT_MIB;
# device_check.sh unpacks them.
#
# Usage: scripts/device_bundle.sh
#   JOBS=N             parallel build jobs (default 1)
#   BUILD_DIR=DIR      build directory (default build-device)
#   TEST_PATTERN=RE    extended regex on test program names to bundle
#                      (default: names with cuda, nccl or gpu in them)
#   BUNDLE_LIMIT_MIB=N size above which files are compressed (default 32)
#   CMAKE=PATH         the cmake to use (default: cmake on the PATH)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-1}
build=${BUILD_DIR:-build-device}
pattern=${TEST_PATTERN:-cuda|nccl|gpu}
limit_mib=${BUNDLE_LIMIT_MIB:-32}
cmake_bin=${CMAKE:-cmake}
bundle=.device-bundle

echo "== configure $build (Release, CUDA, sm_90a)"
mkdir -p "$build"
log=$build/configure.log
if ! "$cmake_bin" -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPPTRAIN_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DPPTRAIN_BUILD_TESTS=ON >"$log" 2>&1; then
  grep -A4 "CMake Error" "$log" | head -30
  if grep -q 'language dialect "CUDA20"' "$log"; then
    echo "$("$cmake_bin" --version | head -1) cannot compile CUDA 20 with this nvcc; use a" \
      "newer one: python3 -m venv /tmp/cm && /tmp/cm/bin/pip install cmake &&" \
      "CMAKE=/tmp/cm/bin/cmake $0 (then rm -rf $build)" >&2
  fi
  echo "configure failed (log: $log)" >&2
  exit 1
fi

# Test executables are the linked targets tests/<dir>/test_*; keep the CUDA ones.
mapfile -t test_targets < <(ninja -C "$build" -t targets all |
  sed -n 's|^\(tests/[^:]*/test_[^/:.]*\): .*EXECUTABLE_LINKER.*|\1|p' |
  grep -E "/[^/]*($pattern)[^/]*$" || true)
echo "== build pptrain and ${#test_targets[@]} CUDA test program(s): ${test_targets[*]:-none}"
ninja -C "$build" -j"$jobs" pptrain "${test_targets[@]}"

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/tests" "$bundle/lib/fallback" "$bundle/configs"
cp "$build/pptrain" "$bundle/bin/"
for t in "${test_targets[@]}"; do
  cp "$build/$t" "$bundle/tests/"
done
strip --strip-unneeded "$bundle/bin/"* "$bundle"/tests/* 2>/dev/null || true
cp configs/bench-124m.yaml configs/bench-1b.yaml "$bundle/configs/"

# Shared libraries from ldd, minus those the GPU machine has (or must use) its own of.
system='linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so'
cuda='libcuda\.so|libcudart\.so|libcublas|libnccl|libnvidia|libnvrtc|libnvJitLink'
skip="^($system|$cuda)"
fallback='^(libstdc\+\+\.so|libgcc_s\.so)'
for exe in "$bundle/bin/pptrain" "$bundle"/tests/*; do
  [ -f "$exe" ] || continue
  ldd "$exe" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ $name =~ $skip ]]; then continue; fi
  dest="$bundle/lib"
  if [[ $name =~ $fallback ]]; then dest="$bundle/lib/fallback"; fi
  cp -L "$path" "$dest/$name"
  strip --strip-unneeded "$dest/$name" 2>/dev/null || true
done
chmod -R u+w "$bundle"

size_mib() { du -sm --apparent-size "$bundle" | cut -f1; }
if [ "$(size_mib)" -gt "$limit_mib" ]; then
  echo "== $(size_mib) MiB is over $limit_mib MiB: compressing files over 4 MiB"
  find "$bundle" -type f -size +4M -print0 | xargs -0 -r xz -9 -T0
fi

echo "== $bundle:"
(cd "$bundle" && find . -type f -printf '%s\t%p\n' | sort -k2 |
  awk -F'\t' '{printf "  %8.1f MiB  %s\n", $1 / 1048576, $2}')
echo "total: $(du -sh --apparent-size "$bundle" | cut -f1)" \
  "(the carry limit is 64 MiB for everything carried)"
echo "not bundled, expected on the GPU machine:"
for exe in "$bundle/bin/pptrain" "$bundle"/tests/*; do
  [ -f "$exe" ] && [[ $exe != *.xz ]] && ldd "$exe"
done | awk '{print $1}' | sort -u | grep -E "$skip" |
  grep -vE "^($system)" |
  sed 's/^/  /' || true
