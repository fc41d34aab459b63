# cmake -P script behind the downstream test: install the tilelab build into a fresh prefix,
# configure and build tests/downstream/project against it with the same CMake and generator, run
# the consumer. Any failing step fails the test.
foreach (variable TILELAB_BINARY_DIR CONSUMER_SOURCE_DIR WORK_DIR INSTALL_PREFIX GENERATOR)
  if (NOT DEFINED ${variable} OR "${${variable}}" STREQUAL "")
    message(FATAL_ERROR "run_downstream.cmake: ${variable} must be set")
  endif ()
endforeach ()

# Runs one step, echoing its output only when it fails.
function(run_step description)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE output
                  ERROR_VARIABLE output)
  if (NOT result EQUAL 0)
    message(FATAL_ERROR "downstream: ${description} failed (${result}):\n${output}")
  endif ()
  message(STATUS "downstream: ${description}: ok")
endfunction()

# A fresh prefix and consumer build each time, so nothing stale is found.
file(REMOVE_RECURSE "${WORK_DIR}")

# Installing needs every installed target built: run after a full build of the project.
run_step("install into ${INSTALL_PREFIX} (needs a full build of ${TILELAB_BINARY_DIR})"
         "${CMAKE_COMMAND}" --install "${TILELAB_BINARY_DIR}" --prefix "${INSTALL_PREFIX}")

set(configure_arguments
    -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
    -DCMAKE_BUILD_TYPE=Release
    "-DCMAKE_PREFIX_PATH=${INSTALL_PREFIX}"
    # Only the install tree may satisfy find_package, never a registry entry for a build tree.
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
foreach (tool MAKE_PROGRAM CXX_COMPILER C_COMPILER)
  if (DEFINED ${tool} AND NOT "${${tool}}" STREQUAL "")
    list(APPEND configure_arguments "-DCMAKE_${tool}=${${tool}}")
  endif ()
endforeach ()
run_step("configure the consumer" "${CMAKE_COMMAND}" ${configure_arguments})
run_step("build the consumer" "${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
run_step("run the consumer" "${WORK_DIR}/build/tilelab_downstream")
