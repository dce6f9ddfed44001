# CMake toolchain for the aarch64 (ARM: JUPITER's Grace) build made on an x86 Debian 12 machine
# (tools/arm/cross_check.sh): Debian's cross compiler and its arm64 (multiarch) libraries; the
# built programs, the tests included, run under qemu-aarch64.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# The loader and C library of the arm64 multiarch packages (libc6:arm64, under /), not the cross
# toolchain's copies under /usr/aarch64-linux-gnu: the libraries the tests link (libgomp,
# libstdc++, OpenBLAS) come from the multiarch packages, and the cross ld.so with the multiarch
# libc (two builds of glibc 2.36) hangs in the first pthread_create.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /)
