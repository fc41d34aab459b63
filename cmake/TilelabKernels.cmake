# Halide AOT kernels: one shared Halide runtime, explicit target feature chains, and STMT and
# ASSEMBLY listings built on demand (the first thing to read when a kernel is slow).

# Multitarget: the first target the CPU supports runs. Feature flags do not imply their subsets,
# so each chain is spelled out. Zen 4 / Sapphire Rapids class, then Haswell class, then baseline.
set(TILELAB_HALIDE_TARGETS
    x86-64-linux-avx-avx2-f16c-fma-sse41-avx512-avx512_skylake-avx512_cannonlake-avx512_zen4
    x86-64-linux-avx-avx2-f16c-fma-sse41
    x86-64-linux
    CACHE STRING "Halide targets of the AOT kernels, best first")

# The generators/ directory of another build of the same sources: the kernels are linked from its
# lib<name>.a and <name>.h instead of generated, and the generators are not built. A second build
# of one source tree (the packaging test's wheel, wheels for several Pythons) then skips the
# Halide work, most of the build's time.
set(TILELAB_PREBUILT_KERNELS "" CACHE PATH
    "generators/ directory of a build of these sources whose kernels to link instead of generating")
# Where the kernels' headers, archives and generator side files (footprints) are.
if (TILELAB_PREBUILT_KERNELS)
  set(TILELAB_KERNEL_DIR "${TILELAB_PREBUILT_KERNELS}")
else ()
  set(TILELAB_KERNEL_DIR "${PROJECT_BINARY_DIR}/generators")
endif ()

add_halide_runtime(tilelab_halide_runtime TARGETS x86-64-linux)
add_library(tilelab_kernels INTERFACE)
target_link_libraries(tilelab_kernels INTERFACE tilelab_halide_runtime)
target_include_directories(tilelab_kernels INTERFACE "${PROJECT_BINARY_DIR}/kernels")
# The listings cost one more generator run per kernel, about a quarter of the kernels' generator
# time, and no test reads them: they are built on demand, all with `ninja kernel_listings`, one
# kernel's with `ninja <name>_listings`.
add_custom_target(kernel_listings)

# The targets of TILELAB_HALIDE_TARGETS with bf16 dot products (target_has_bf16_dot_products in
# schedules/flash/x86.hpp), and the last one, the fallback every multitarget library ends with.
set(_tilelab_bf16_dot_targets "")
foreach (target IN LISTS TILELAB_HALIDE_TARGETS)
  if (target MATCHES "avx512_(zen4|zen5|sapphirerapids)")
    list(APPEND _tilelab_bf16_dot_targets "${target}")
  endif ()
endforeach ()
list(GET TILELAB_HALIDE_TARGETS -1 _tilelab_last_target)
list(APPEND _tilelab_bf16_dot_targets "${_tilelab_last_target}")
list(REMOVE_DUPLICATES _tilelab_bf16_dot_targets)

# tilelab_add_kernel(<name> GENERATOR <generator> FROM <generator target> [BF16_DOT_PRODUCTS]
#                    [PARAMS k=v ...])
# adds the kernel <name> (function of the same name, header <name>.h) to tilelab_kernels, and its
# lowered statement and assembly for the first (best) target as listings/<name>.{stmt,s} (target
# <name>_listings, not built by default).
# BF16_DOT_PRODUCTS: the runtime calls the kernel only on CPUs whose bf16 dot products it prefers
# (rounds_bf16_probabilities), so it is generated for the targets that have them and the fallback
# alone. On any other target its products would be fp32 FMAs: another kernel's code, compiled
# again for nothing.
function(tilelab_add_kernel name)
  cmake_parse_arguments(ARG "BF16_DOT_PRODUCTS" "GENERATOR;FROM" "PARAMS" ${ARGN})
  set(targets ${TILELAB_HALIDE_TARGETS})
  if (ARG_BF16_DOT_PRODUCTS)
    set(targets ${_tilelab_bf16_dot_targets})
  endif ()
  if (TILELAB_PREBUILT_KERNELS)
    set(archive "${TILELAB_PREBUILT_KERNELS}/lib${name}.a")
    if (NOT EXISTS "${archive}" OR NOT EXISTS "${TILELAB_PREBUILT_KERNELS}/${name}.h")
      message(FATAL_ERROR "TILELAB_PREBUILT_KERNELS is ${TILELAB_PREBUILT_KERNELS}, which lacks "
                          "lib${name}.a or ${name}.h: expected the generators/ directory of a "
                          "build of these sources")
    endif ()
    # GLOBAL: tilelab_kernels is linked from other directories.
    add_library(${name} STATIC IMPORTED GLOBAL)
    set_target_properties(${name} PROPERTIES IMPORTED_LOCATION "${archive}")
    target_include_directories(${name} INTERFACE "${TILELAB_PREBUILT_KERNELS}")
    target_link_libraries(${name} INTERFACE tilelab_halide_runtime)
    target_link_libraries(tilelab_kernels INTERFACE ${name})
    return()
  endif ()
  add_halide_library(${name} FROM ${ARG_FROM}
                     GENERATOR ${ARG_GENERATOR}
                     FUNCTION_NAME ${name}
                     TARGETS ${targets}
                     PARAMS ${ARG_PARAMS}
                     USE_RUNTIME tilelab_halide_runtime)
  target_link_libraries(tilelab_kernels INTERFACE ${name})

  # For a multitarget library Halide writes one STMT/ASSEMBLY file per target but declares a
  # single one, which would re-run the generator on every build; the listings get their own rule.
  list(GET targets 0 best_target)
  set(listings "${CMAKE_CURRENT_BINARY_DIR}/listings")
  add_custom_command(
    OUTPUT "${listings}/${name}.stmt" "${listings}/${name}.s"
    COMMAND ${CMAKE_COMMAND} -E make_directory "${listings}"
    COMMAND $<TARGET_FILE:${ARG_FROM}> -g ${ARG_GENERATOR} -f ${name} -e stmt,assembly
            -o "${listings}" target=${best_target}-no_runtime ${ARG_PARAMS}
    DEPENDS ${ARG_FROM}
    COMMENT "Listings of ${name} for ${best_target}"
    VERBATIM)
  add_custom_target(${name}_listings DEPENDS "${listings}/${name}.stmt" "${listings}/${name}.s")
  add_dependencies(kernel_listings ${name}_listings)
endfunction()
