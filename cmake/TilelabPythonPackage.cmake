# The wheel's layout (pip install ., scikit-build-core installs only the "python" component):
#   tilelab/_core*.so            the extension, RPATH $ORIGIN
#   tilelab/libtilelab.so        the runtime it links (unversioned: it is private to the package)
#   tilelab/*.py, *.pyi, py.typed, _version.py   the package, as assembled in the build tree
# The C++ headers, CMake package and tools are not part of the wheel.
set_property(TARGET tilelab_runtime PROPERTY VERSION)
set_property(TARGET tilelab_runtime PROPERTY SOVERSION)
set_target_properties(tilelab_runtime PROPERTIES INSTALL_RPATH "$ORIGIN")
set_target_properties(tilelab_core_module PROPERTIES INSTALL_RPATH "$ORIGIN")

install(TARGETS tilelab_runtime LIBRARY DESTINATION tilelab COMPONENT python NAMELINK_SKIP)
install(TARGETS tilelab_core_module LIBRARY DESTINATION tilelab COMPONENT python)
install(DIRECTORY "${PROJECT_BINARY_DIR}/python/tilelab/" DESTINATION tilelab COMPONENT python
        FILES_MATCHING PATTERN "*.py" PATTERN "*.pyi" PATTERN "py.typed"
        PATTERN "__pycache__" EXCLUDE)

# A portable wheel (scripts/build_wheel.sh, docs/packaging.md) may need only the symbol versions
# a manylinux policy lists. GCC 12 calls libgcc_s's GCC_12.0.0 helpers (the _Float16
# conversions, __truncsfhf2), which only manylinux_2_35 allows. Linking libgcc.a ahead of the
# driver's -lgcc_s resolves those helpers statically (hidden, not re-exported), while the unwinder
# stays libgcc_s's: -static-libgcc would also bring in the static unwinder, whose
# _dl_find_object needs GLIBC_2.35 and so lands on manylinux_2_35 all the same.
option(TILELAB_STATIC_LIBGCC_HELPERS "Link libgcc.a's helper functions into the wheel's objects" OFF)
if (TILELAB_STATIC_LIBGCC_HELPERS)
  execute_process(COMMAND "${CMAKE_CXX_COMPILER}" -print-libgcc-file-name
                  OUTPUT_VARIABLE tilelab_libgcc_archive OUTPUT_STRIP_TRAILING_WHITESPACE
                  COMMAND_ERROR_IS_FATAL ANY)
  target_link_libraries(tilelab_runtime PRIVATE "${tilelab_libgcc_archive}")
  target_link_libraries(tilelab_core_module PRIVATE "${tilelab_libgcc_archive}")
endif ()
