#!/bin/sh
# A/B of a variant of src/backend/cpu/kernels_x86.c against the built library
# (bench/kernel_ab.c): compiles VARIANT with the kernels' flags (-O3), renames
# its entry points to td_mm_avx2_B / td_mm_avx512_B, links bench/kernel_ab.c
# and runs it.
#   usage: [KAB_ISA=avx2|avx512] [KAB_DTYPE=bf16|q8] [KAB_TUNE=default|amd] sh bench/kernel_ab.sh VARIANT.c [REPS]
#          (after `make`; BUILD=dir as make; a variant dir may hold its own backend/cpu/kernels_x86.h)
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
[ $# -ge 1 ] || { echo "usage: sh bench/kernel_ab.sh VARIANT.c [REPS]" >&2; exit 2; }
[ -f "$BUILD/libtandem.a" ] || { echo "kernel_ab: run make first ($BUILD/libtandem.a missing)" >&2; exit 1; }
mkdir -p "$BUILD/kernel_ab"
# -iquote: a variant kept elsewhere still finds the original's neighbours
${CC:-cc} -O3 -g -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -pthread -Iinclude -Isrc -iquote src/backend/cpu \
  -c "$1" -o "$BUILD/kernel_ab/variant.o"
objcopy --redefine-sym td_mm_avx2=td_mm_avx2_B --redefine-sym td_mm_avx512=td_mm_avx512_B \
  "$BUILD/kernel_ab/variant.o" "$BUILD/kernel_ab/variant_b.o"
# a CUDA=1 library needs the CUDA runtime (found as the Makefile does: next to nvcc)
CUDA_LIBS=""
if nm "$BUILD/libtandem.a" 2>/dev/null | grep -q " U cuda"; then
  NVCC_DIR=$(dirname "$(command -v "${NVCC:-nvcc}")")
  CUDA_LIBS="-L${CUDA_HOME:-$NVCC_DIR/..}/lib64 -lcudart_static -ldl -lrt -lstdc++"
fi
${CC:-cc} -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -o "$BUILD/kernel_ab/kernel_ab" bench/kernel_ab.c \
  "$BUILD/kernel_ab/variant_b.o" "$BUILD/libtandem.a" -ljansson -lpcre2-8 -lutf8proc -lxxhash -lmicrohttpd -lm -pthread $CUDA_LIBS
"$BUILD/kernel_ab/kernel_ab" "${2:-15}"
