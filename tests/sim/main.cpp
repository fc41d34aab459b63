// Catch2 main for the simulator tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
