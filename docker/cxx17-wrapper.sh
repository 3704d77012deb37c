#!/usr/bin/env bash
# C++ compiler wrapper used as CXX (and therefore, through Horovod's CMakeLists, also
# as nvcc's host compiler, CMAKE_CUDA_HOST_COMPILER) when building Horovod 0.28.1
# against torch >= 2.1.
#
# Why: Horovod 0.28.1 compiles its PyTorch extension with CMAKE_CXX_STANDARD 14
# (`-std=c++14`), but torch >= 2.1 headers refuse anything older than C++17.
#
# What it does: `-std=c++14` / `-std=gnu++14` become `-std=c++17` / `-std=gnu++17`;
# every other argument is passed through unchanged to the real compiler
# ($HOROVOD_GRAVAC_REAL_CXX, default g++).
#
# What it deliberately leaves alone: `-std=c++11`. Horovod builds its only CUDA
# source (horovod/common/ops/cuda/cuda_kernels.cu, no torch headers in it) with
# CMAKE_CUDA_STANDARD 11, so nvcc calls its host compiler with `-std=c++11` while
# nvcc's own front end also parses in C++11 mode. Rewriting that flag would give the
# host preprocessor a different language level from the one nvcc's front end uses.
# Left alone, the CUDA compile is byte-for-byte what stock Horovod does.
set -euo pipefail

real="${HOROVOD_GRAVAC_REAL_CXX:-g++}"
args=()
for a in "$@"; do
  case "$a" in
    -std=c++14) args+=("-std=c++17") ;;
    -std=gnu++14) args+=("-std=gnu++17") ;;
    *) args+=("$a") ;;
  esac
done
exec "$real" "${args[@]}"
