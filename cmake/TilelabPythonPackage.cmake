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
