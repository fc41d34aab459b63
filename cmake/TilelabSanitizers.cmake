# Sanitized builds. TILELAB_SANITIZE is a -fsanitize= list (e.g. "address,undefined") applied to
# every target of the project; undefined behaviour then aborts instead of printing and going on,
# so a test that triggers it fails. TILELAB_BUILD_FUZZERS (clang only) also instruments every
# target for libFuzzer's coverage feedback and adds the fuzz/ targets.
set(TILELAB_SANITIZE "" CACHE STRING
    "Sanitizers for every target, as for -fsanitize= (e.g. address,undefined); empty for none")
option(TILELAB_BUILD_FUZZERS "Build the libFuzzer targets of fuzz/ (needs clang)" OFF)

set(tilelab_sanitizers "${TILELAB_SANITIZE}")
if (TILELAB_BUILD_FUZZERS)
  if (NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "TILELAB_BUILD_FUZZERS needs clang (libFuzzer); got "
                        "${CMAKE_CXX_COMPILER_ID}: configure with -DCMAKE_CXX_COMPILER=clang++")
  endif ()
  # Coverage instrumentation without libFuzzer's main(); fuzz targets link -fsanitize=fuzzer.
  if (tilelab_sanitizers)
    string(PREPEND tilelab_sanitizers "fuzzer-no-link,")
  else ()
    set(tilelab_sanitizers "fuzzer-no-link")
  endif ()
endif ()

if (tilelab_sanitizers)
  add_compile_options(-fsanitize=${tilelab_sanitizers} -fno-omit-frame-pointer
                      -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${tilelab_sanitizers})
  # GCC's -Wmaybe-uninitialized gives false positives in libstdc++ (<regex>, <functional>) under
  # the sanitizers' instrumentation; the unsanitized build keeps the warning.
  if (CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    add_compile_options(-Wno-maybe-uninitialized)
  endif ()
  message(STATUS "tilelab: sanitizers ${tilelab_sanitizers}")
endif ()
