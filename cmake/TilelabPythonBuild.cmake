# Python-build mode (pip install ., scikit-build-core): finds the build requirements Halide and
# pybind11 in the build environment's Python when the prefix path does not have them. Included
# after project() through CMAKE_PROJECT_INCLUDE (set in pyproject.toml), so the bootstrap
# configure (scripts/bootstrap.sh, which passes the prefixes itself) never runs it.
if (NOT SKBUILD)
  return()
endif ()

if (Python3_EXECUTABLE)
  set(tilelab_build_python "${Python3_EXECUTABLE}")
elseif (Python_EXECUTABLE)
  set(tilelab_build_python "${Python_EXECUTABLE}")
else ()
  message(FATAL_ERROR "tilelab: python build without Python_EXECUTABLE (scikit-build-core sets it)")
endif ()

# Prints `expression`'s value, evaluated by the build environment's Python, into `variable`
# (empty when the import fails).
function(tilelab_python_query variable expression)
  execute_process(COMMAND "${tilelab_build_python}" -c "${expression}"
                  OUTPUT_VARIABLE value OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE status ERROR_QUIET)
  if (NOT status EQUAL 0)
    set(value "")
  endif ()
  set(${variable} "${value}" PARENT_SCOPE)
endfunction()

# Halide 21 comes from the halide==21.0.0 wheel in build-system.requires. Its data-dir forwarder
# (share/cmake/Halide) looks in the *target* Python's site-packages, which does not have Halide
# under build isolation, so point Halide_DIR at the wheel's own package config instead.
if (NOT Halide_DIR OR NOT EXISTS "${Halide_DIR}/HalideConfig.cmake")
  tilelab_python_query(tilelab_halide_prefix "import halide; print(halide.install_dir())")
  if (tilelab_halide_prefix)
    file(GLOB tilelab_halide_config "${tilelab_halide_prefix}/lib*/cmake/Halide/HalideConfig.cmake")
    if (tilelab_halide_config)
      list(GET tilelab_halide_config 0 tilelab_halide_config)
      get_filename_component(tilelab_halide_dir "${tilelab_halide_config}" DIRECTORY)
      message(STATUS "tilelab: Halide from the build environment: ${tilelab_halide_dir}")
      set(Halide_DIR "${tilelab_halide_dir}" CACHE PATH "Halide's CMake package" FORCE)
      list(PREPEND CMAKE_PREFIX_PATH "${tilelab_halide_prefix}")
    endif ()
  endif ()
endif ()

if (NOT pybind11_DIR)
  tilelab_python_query(tilelab_pybind11_dir "import pybind11; print(pybind11.get_cmake_dir())")
  if (tilelab_pybind11_dir)
    set(pybind11_DIR "${tilelab_pybind11_dir}" CACHE PATH "pybind11's CMake package" FORCE)
  endif ()
endif ()
