// Catch2 entry point for the single-process collective suites.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
