// Catch2's main for the simulated-CUDA tests, alone so that it compiles once.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
