/* static_exit: a statically linked program (no dynamic loader, so no
 * LD_PRELOAD) that exits with the code given, for the test that a run which
 * traced nothing says why.
 *
 *   static_exit CODE */

#include <stdlib.h>

int main(int argc, char** argv) { return argc > 1 ? atoi(argv[1]) : 0; }
