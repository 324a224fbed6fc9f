// exit_code: prints its arguments and exits with the code given as the first
// one, for the tests of exit status propagation and unchanged output.
//
//   exit_code CODE [WORDS...]

#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
  const int code = argc > 1 ? std::atoi(argv[1]) : 0;
  char* buffer = static_cast<char*>(std::malloc(1000));
  std::strcpy(buffer, "exit_code:");
  for (int i = 2; i < argc; ++i) std::printf("%s %s\n", buffer, argv[i]);
  std::free(buffer);
  std::fprintf(stderr, "exit_code: leaving with %d\n", code);
  return code;
}
