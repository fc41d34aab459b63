// Catch2 main for the cross-checks between generated kernels and the simulator.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
