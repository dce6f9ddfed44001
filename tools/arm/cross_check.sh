#!/usr/bin/env bash
# The aarch64 build (JUPITER's Grace CPUs, ARMv8 + NEON), made and tested on this x86 Debian 12
# machine (issue 36): Debian's cross compiler and arm64 libraries build the CPU code (no CUDA, MPI
# or HDF5), and the kernel, core and io unit tests run under qemu-aarch64.
#   tools/arm/cross_check.sh [build dir (build-arm64)]
# Installs what it needs (as root or through sudo): dpkg's arm64 architecture, the cross compiler,
# qemu-user and the arm64 libraries that install beside the host's (Multi-Arch: same). yaml-cpp's
# arm64 -dev package would replace the host's, so it is unpacked into BUILD/sysroot instead.
# The tests run under qemu-aarch64 with the arm64 multiarch loader and C library (-L /, in
# aarch64-linux-gnu.cmake): with the cross toolchain's own copies, the first thread creation hung.
# Measured (2 cores, packages installed): the build from scratch 234 s (unity libraries; the test
# binaries link every library), the 195 kernel/core/io tests under qemu 53 s, all passing. Not in
# CI: with the cross toolchain's installation that is ~7 minutes more than a CI run has room for;
# run it after changing CPU kernels.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$root/build-arm64}"
packages=(g++-aarch64-linux-gnu qemu-user libgomp1:arm64 libopenblas-openmp-dev:arm64
  libopenblas-dev:arm64 libjpeg62-turbo-dev:arm64 libpng-dev:arm64 libpcre2-dev:arm64
  libtomlplusplus-dev:arm64 libyaml-cpp0.7:arm64)
sudo=()
((EUID == 0)) || sudo=(sudo -n)
missing=()
for p in "${packages[@]}"; do
  [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true) == "install ok installed" ]] ||
    missing+=("$p")
done
sysroot="$build/sysroot"
if ((${#missing[@]})) || [[ ! -d $sysroot/usr/include/yaml-cpp ]]; then
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    "${sudo[@]}" dpkg --add-architecture arm64
  fi
  "${sudo[@]}" apt-get update -qq </dev/null
fi
if ((${#missing[@]})); then
  echo "cross_check: installing ${missing[*]}"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" </dev/null
fi
if [[ ! -d $sysroot/usr/include/yaml-cpp ]]; then
  mkdir -p "$sysroot/debs"
  (cd "$sysroot/debs" && apt-get download -qq libyaml-cpp-dev:arm64 libyaml-cpp0.7:arm64)
  for deb in "$sysroot"/debs/*.deb; do dpkg -x "$deb" "$sysroot"; done
fi
export PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig
start=$(date +%s)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$root/tools/arm/aarch64-linux-gnu.cmake" \
  -Dyaml-cpp_DIR="$sysroot/usr/lib/aarch64-linux-gnu/cmake/yaml-cpp" \
  -DVLM_CUDA=OFF -DVLM_WITH_MPI=OFF -DVLM_BUILD_BENCH=OFF
cmake --build "$build" -j "$(nproc)" --target test_kernels test_core test_io
built=$(date +%s)
(cd "$build" && ctest --output-on-failure -j "$(nproc)" --timeout 600 -R "^(kernels|core|io):")
echo "cross_check: aarch64 build $((built - start)) s, its kernel/core/io tests under qemu" \
  "$(($(date +%s) - built)) s"
