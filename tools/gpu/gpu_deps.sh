#!/usr/bin/env bash
# Build dependencies for a GPU machine that has the CUDA toolkit, cmake and a compiler but no
# package registry (the lent H100/H200 of tools/gpu/gpu_check.sh): the Debian 12 packages the CUDA
# build and its tests need are downloaded here, carried over, and unpacked there into a prefix —
# never into / — whose env.sh points CMake, pkg-config, the compiler and the loader at it.
#
#   tools/gpu/gpu_deps.sh download [DIR]      here: apt-get download the .debs into DIR
#                                             (default .gpu-deps/, gitignored; 22 packages, ~16 MB)
#   tools/gpu/gpu_deps.sh install DIR PREFIX  there: dpkg -x every DIR/*.deb into PREFIX, rewrite
#                                             the pkg-config files to PREFIX, write PREFIX/env.sh
#   source PREFIX/env.sh                      CMAKE_PREFIX_PATH, PKG_CONFIG_PATH, CPATH, PATH;
#                                             LD_LIBRARY_PATH gets only OpenBLAS's libgfortran
#                                             and libquadmath (appended). No LIBRARY_PATH: CMake
#                                             would drop those folders from the binaries' RUNPATH.
#
# .gpu-deps/ is gitignored, so the device tool sends it only when its call carries it, with
# .deps/ (the cuDNN frontend headers of tools/deps/fetch_cudnn_frontend.sh, also gitignored); the
# two stay far below the tool's 64 MiB with the tree (`tools/gpu/gpu_check.sh --dry-run` adds
# them up). The call:
#   run(command="bash tools/gpu/gpu_check.sh", carry=[".gpu-deps", ".deps"], timeout_s=600)
# `tools/gpu/gpu_check.sh --prepare` runs the download (and fetches .deps/); tools/gpu/gpu_check.sh
# runs `install .gpu-deps BUILD_DIR/deps` itself (BUILD_DIR is build-gpu/, gitignored), and refuses
# to start when .gpu-deps/ holds no .deb files. MPI and HDF5 are left out: without MPI the build
# uses parallel/comm/mpi.h's one-rank stand-in (every GPU test runs on one rank), and without HDF5 the
# checkpoints are safetensors (the GPU tests pick that format then).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

# Headers, CMake/pkg-config files and the shared libraries they link, with the runtime libraries
# a machine without them lacks (libgfortran and libquadmath for OpenBLAS).
packages=(
  libopenblas-dev libopenblas-openmp-dev libopenblas0-openmp libopenblas0 libgfortran5 libquadmath0
  catch2 libcli11-dev nlohmann-json3-dev libtomlplusplus-dev libtomlplusplus3 libyaml-cpp-dev libyaml-cpp0.7
  libjpeg62-turbo-dev libjpeg62-turbo libpng-dev libpng16-16 zlib1g-dev
  ninja-build pkgconf pkgconf-bin libpkgconf3
)

usage() {
  sed -n '/^#   tools\/gpu\/gpu_deps.sh download/,/^#  *would drop/p' "${BASH_SOURCE[0]}" |
    sed 's/^# \{0,1\}//' >&2
  exit 2
}

download() {
  local dir=${1:-$root/.gpu-deps}
  mkdir -p "$dir"
  cd "$dir"
  rm -f ./*.deb
  # _apt cannot write into a root-owned folder; the download itself is what matters here.
  apt-get download "${packages[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true
  local n
  n=$(find . -maxdepth 1 -name '*.deb' | wc -l)
  ((n == ${#packages[@]})) || {
    echo "gpu_deps: expected ${#packages[@]} packages in $dir, got $n" >&2
    exit 1
  }
  echo "gpu_deps: $n packages, $(du -sh . | cut -f1) in $dir"
}

install_into() {
  local dir=$1 prefix=$2
  compgen -G "$dir/*.deb" >/dev/null || {
    echo "gpu_deps: no .deb files in $dir (run 'tools/gpu/gpu_deps.sh download' where apt works)" >&2
    exit 1
  }
  mkdir -p "$prefix"
  prefix=$(cd "$prefix" && pwd)
  local deb
  for deb in "$dir"/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$deb" "$prefix"
    else # a .deb is an ar archive holding data.tar.*
      local tmp
      tmp=$(mktemp -d)
      (cd "$tmp" && ar x "$deb" && tar -xf data.tar.* -C "$prefix")
      rm -rf "$tmp"
    fi
  done
  local arch
  arch=$(gcc -print-multiarch 2>/dev/null || true)
  [[ -n $arch ]] || arch="$(uname -m)-linux-gnu"
  # Debian's pkgconf needs libpkgconf.so.3, which a machine without the package lacks: the
  # command becomes a wrapper that hands the real binary the unpacked library (pkg-config and
  # the triplet names are symlinks to it). Re-run safe: dpkg -x restores the binary each time.
  mkdir -p "$prefix/usr/libexec/vlm"
  mv -f "$prefix/usr/bin/pkgconf" "$prefix/usr/libexec/vlm/pkgconf"
  cat >"$prefix/usr/bin/pkgconf" <<EOF
#!/bin/sh
# Written by tools/gpu/gpu_deps.sh: Debian's pkgconf with the libpkgconf.so.3 unpacked next to it.
LD_LIBRARY_PATH="$prefix/usr/lib/$arch\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" \\
  exec "$prefix/usr/libexec/vlm/pkgconf" "\$@"
EOF
  chmod +x "$prefix/usr/bin/pkgconf"
  local tool
  for tool in pkg-config ninja; do
    "$prefix/usr/bin/$tool" --version >/dev/null 2>&1 || {
      echo "gpu_deps: the unpacked $tool does not start:" >&2
      "$prefix/usr/bin/$tool" --version >&2
      exit 1
    }
  done
  # pkg-config files name /usr absolutely; CMake's package files are relocatable already.
  find "$prefix" -name '*.pc' -exec sed -i "s|^prefix=/usr|prefix=$prefix/usr|;s|=/usr/|=$prefix/usr/|g" {} +
  # The loader path gets only what a binary cannot find through its RUNPATH (OpenBLAS's own
  # dependencies): the whole lib folder would put Debian's libz/libpng before the machine's own
  # for every program, Python and torch included.
  mkdir -p "$prefix/runtime"
  ln -sf "$prefix"/usr/lib/"$arch"/libgfortran.so.* "$prefix"/usr/lib/"$arch"/libquadmath.so.* \
    "$prefix/runtime/"
  cat >"$prefix/env.sh" <<EOF
# Written by tools/gpu/gpu_deps.sh: use the packages unpacked in $prefix.
export CMAKE_PREFIX_PATH="$prefix/usr\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}"
export PKG_CONFIG_PATH="$prefix/usr/lib/$arch/pkgconfig:$prefix/usr/lib/$arch/openblas-openmp/pkgconfig:$prefix/usr/share/pkgconfig\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}"
export CPATH="$prefix/usr/include:$prefix/usr/include/$arch\${CPATH:+:\$CPATH}"
export LD_LIBRARY_PATH="\${LD_LIBRARY_PATH:+\$LD_LIBRARY_PATH:}$prefix/runtime"
export PATH="\$PATH:$prefix/usr/bin"
# For a compiler without Debian's multiarch search paths:
export CMAKE_LIBRARY_PATH="$prefix/usr/lib/$arch\${CMAKE_LIBRARY_PATH:+:\$CMAKE_LIBRARY_PATH}"
export CMAKE_INCLUDE_PATH="$prefix/usr/include/$arch\${CMAKE_INCLUDE_PATH:+:\$CMAKE_INCLUDE_PATH}"
export VLM_DEPS_PREFIX="$prefix/usr"
EOF
  echo "gpu_deps: $(find "$dir" -maxdepth 1 -name '*.deb' | wc -l) packages unpacked into $prefix" \
    "(source $prefix/env.sh)"
}

case "${1:-}" in
download) download "${2:-}" ;;
install)
  (($# == 3)) || usage
  install_into "$2" "$3"
  ;;
*) usage ;;
esac
