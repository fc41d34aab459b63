// The Catch2 main of every C++ test executable. Catch2 v2's implementation is one large header:
// compiled once here rather than once per executable (about 20 s each, 80 s under ASan).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
