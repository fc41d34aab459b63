// Catch2 main for the schedule description tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
