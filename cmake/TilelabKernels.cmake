# Halide AOT kernels: one shared Halide runtime, explicit target feature chains, STMT and ASSEMBLY
# always emitted (cheap, and the first thing to read when a kernel is slow).

# Multitarget: the first target the CPU supports runs. Feature flags do not imply their subsets,
# so each chain is spelled out. Zen 4 / Sapphire Rapids class, then Haswell class, then baseline.
set(TILELAB_HALIDE_TARGETS
    x86-64-linux-avx-avx2-f16c-fma-sse41-avx512-avx512_skylake-avx512_cannonlake-avx512_zen4
    x86-64-linux-avx-avx2-f16c-fma-sse41
    x86-64-linux
    CACHE STRING "Halide targets of the AOT kernels, best first")

add_halide_runtime(tilelab_halide_runtime TARGETS x86-64-linux)
add_library(tilelab_kernels INTERFACE)
target_link_libraries(tilelab_kernels INTERFACE tilelab_halide_runtime)
target_include_directories(tilelab_kernels INTERFACE "${PROJECT_BINARY_DIR}/kernels")

# tilelab_add_kernel(<name> GENERATOR <generator> FROM <generator target> [PARAMS k=v ...])
# adds the kernel <name> (function of the same name, header <name>.h) to tilelab_kernels.
function(tilelab_add_kernel name)
  cmake_parse_arguments(ARG "" "GENERATOR;FROM" "PARAMS" ${ARGN})
  add_halide_library(${name} FROM ${ARG_FROM}
                     GENERATOR ${ARG_GENERATOR}
                     FUNCTION_NAME ${name}
                     TARGETS ${TILELAB_HALIDE_TARGETS}
                     PARAMS ${ARG_PARAMS}
                     USE_RUNTIME tilelab_halide_runtime
                     STMT ${name}_stmt
                     ASSEMBLY ${name}_assembly)
  target_link_libraries(tilelab_kernels INTERFACE ${name})
endfunction()
