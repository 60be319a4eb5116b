#!/usr/bin/env bash
# Builds offsim with CUDA here (release preset) and gathers what scripts/gpu-check.sh needs on an
# offline GPU machine into .bundle/ (git-ignored): the offsim CLI, the GPU module
# liboffsim_gpu.so (next to the binaries, where offsim looks for it), the GPU test binaries, the
# calibration benchmark, and the non-system shared libraries they load (found with ldd).
#
#   scripts/bundle-gpu-check.sh            # then carry .bundle to the GPU machine
#   JOBS=2 BUILD_DIR=build/gpu-bundle scripts/bundle-gpu-check.sh
#
# .bundle/ is git-ignored: copy it beside the checkout on the GPU machine (see
# docs/validation-gpu.md). A dirty tree is marked "-dirty" in MANIFEST.
#
# Left out on purpose: the C library and loader, libgcc_s, the driver (libcuda, libnvidia-*) and
# the CUDA 13 libraries (cudart, cuBLAS/cuBLASLt, NCCL: hundreds of MiB, and present on a GPU
# machine with the same CUDA; gpu-check.sh finds them). Debian 12's libstdc++ goes into
# lib-compat/, used only where the target's libstdc++ is older. The bundle must stay under 64 MiB.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build/gpu-bundle}
jobs=${JOBS:-2}
bundle=$root/.bundle
limit_mib=64

targets=(offsim backends_cuda_replay_test calibrate_gpu_test calibrate_gpu_benchmark)

cd "$root"
cmake --preset release -B "$build" -DOFFSIM_WITH_CUDA=ON -DOFFSIM_WITH_NCCL=ON \
  -DOFFSIM_WITH_QT=OFF -DOFFSIM_WITH_MPI=OFF -DOFFSIM_BUILD_TESTS=ON -DOFFSIM_BUILD_BENCHMARKS=ON >/dev/null
cmake --build "$build" --target "${targets[@]}" offsim_gpu -j"$jobs"

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/lib-compat"

binaries=()
for t in "${targets[@]}"; do
  path=$(find "$build" -type f -name "$t" -perm -u+x | head -n1)
  if [[ -z "$path" ]]; then
    echo "bundle-gpu-check: target $t was not built under $build" >&2
    exit 1
  fi
  cp "$path" "$bundle/bin/$t"
  strip --strip-unneeded "$bundle/bin/$t"
  binaries+=("$bundle/bin/$t")
done
cp "$build/lib/liboffsim_gpu.so" "$bundle/bin/liboffsim_gpu.so"
strip --strip-unneeded "$bundle/bin/liboffsim_gpu.so"
binaries+=("$bundle/bin/liboffsim_gpu.so")

# Libraries that every Linux has, or that come with the driver or the CUDA toolkit there.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libgcc_s\.so|libcuda\.so|libnvidia-|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so)'
declare -A seen=()
for b in "${binaries[@]}"; do
  while read -r name _ path _; do
    [[ -z "${path:-}" || "$path" == "not" ]] && continue
    [[ "$name" =~ $skip ]] && continue
    [[ -n "${seen[$name]:-}" ]] && continue
    seen[$name]=1
    if [[ "$name" == libstdc++.so* ]]; then
      cp -L "$path" "$bundle/lib-compat/$name"
    else
      cp -L "$path" "$bundle/lib/$name"
    fi
  done < <(ldd "$b" | awk '/=>/ {print $1, $2, $3, $4}')
done

{
  echo "offsim GPU check bundle"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git -C "$root" describe --always --dirty 2>/dev/null || echo '?')"
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -n1)"
  echo "binaries: ${targets[*]} liboffsim_gpu.so"
  echo "libraries:"; ls -1 "$bundle/lib" "$bundle/lib-compat"
} >"$bundle/MANIFEST"

size_mib=$(du -sm "$bundle" | cut -f1)
echo "bundle-gpu-check: $bundle is ${size_mib} MiB"
if (( size_mib >= limit_mib )); then
  echo "bundle-gpu-check: over the ${limit_mib} MiB limit; look at $bundle/MANIFEST" >&2
  exit 1
fi
