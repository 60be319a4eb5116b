#!/usr/bin/env bash
# Installs the Debian 12 packages offsim builds with, if any are missing. Uses sudo when not root.
# CUDA and NCCL are not Debian packages: they are used when the CUDA Toolkit is installed.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config clang-format clang-14 clang-tidy-14 libclang-rt-14-dev
  libboost-graph-dev libfmt-dev nlohmann-json3-dev libyaml-cpp-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev librapidcheck-dev
  qt6-base-dev qt6-charts-dev libqt6opengl6-dev qt6-qpa-plugins libopenmpi-dev openmpi-bin
  libtomlplusplus-dev pybind11-dev python3-dev python3-pytest python3-pandas python3-matplotlib
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-deps: these packages are missing and apt-get is not available: ${missing[*]}" >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "install-deps: not root and no sudo; install these packages: ${missing[*]}" >&2
    exit 1
  fi
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
