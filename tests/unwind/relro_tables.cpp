// A library whose .eh_frame lies in its RELRO part, as in NVIDIA's
// libnvrtc: the build marks the section writable (objcopy), so the linker
// puts it in the writable segment, which the loader relocates and then
// makes read-only. 2048 functions give it some 12 pages of unwind tables,
// and a table of their addresses after it (in .data.rel.ro) pages the
// loader wrote to.
using Callback = int (*)(void*);

#define RELRO_FUNCTION(n)                                                                       \
  extern "C" __attribute__((visibility("default"), noinline)) int relro_function_##n(Callback f, \
                                                                                      void* arg) { \
    const int r = f(arg) + n;                                                                   \
    asm volatile("" ::: "memory");                                                              \
    return r;                                                                                   \
  }
#define RELRO_8(n) RELRO_FUNCTION(n##0) RELRO_FUNCTION(n##1) RELRO_FUNCTION(n##2) RELRO_FUNCTION(n##3) \
  RELRO_FUNCTION(n##4) RELRO_FUNCTION(n##5) RELRO_FUNCTION(n##6) RELRO_FUNCTION(n##7)
#define RELRO_64(n) RELRO_8(n##0) RELRO_8(n##1) RELRO_8(n##2) RELRO_8(n##3) RELRO_8(n##4) RELRO_8(n##5) \
  RELRO_8(n##6) RELRO_8(n##7)
#define RELRO_512(n) RELRO_64(n##0) RELRO_64(n##1) RELRO_64(n##2) RELRO_64(n##3) RELRO_64(n##4) \
  RELRO_64(n##5) RELRO_64(n##6) RELRO_64(n##7)
RELRO_512(1) RELRO_512(2) RELRO_512(3) RELRO_512(4)

#define RELRO_ADDRESS(n) reinterpret_cast<const void*>(&relro_function_##n),
#define RELRO_ADDRESS_8(n) RELRO_ADDRESS(n##0) RELRO_ADDRESS(n##1) RELRO_ADDRESS(n##2) RELRO_ADDRESS(n##3) \
  RELRO_ADDRESS(n##4) RELRO_ADDRESS(n##5) RELRO_ADDRESS(n##6) RELRO_ADDRESS(n##7)
#define RELRO_ADDRESS_64(n) RELRO_ADDRESS_8(n##0) RELRO_ADDRESS_8(n##1) RELRO_ADDRESS_8(n##2) \
  RELRO_ADDRESS_8(n##3) RELRO_ADDRESS_8(n##4) RELRO_ADDRESS_8(n##5) RELRO_ADDRESS_8(n##6) RELRO_ADDRESS_8(n##7)
#define RELRO_ADDRESS_512(n) RELRO_ADDRESS_64(n##0) RELRO_ADDRESS_64(n##1) RELRO_ADDRESS_64(n##2) \
  RELRO_ADDRESS_64(n##3) RELRO_ADDRESS_64(n##4) RELRO_ADDRESS_64(n##5) RELRO_ADDRESS_64(n##6) \
  RELRO_ADDRESS_64(n##7)

// Every function, in the order above (octal digits after the first).
extern "C" __attribute__((visibility("default"))) const void* const relro_functions[] = {
    RELRO_ADDRESS_512(1) RELRO_ADDRESS_512(2) RELRO_ADDRESS_512(3) RELRO_ADDRESS_512(4)};
extern "C" __attribute__((visibility("default"))) const int relro_function_count =
    sizeof relro_functions / sizeof relro_functions[0];
