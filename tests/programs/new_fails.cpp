// An operator new that cannot be served: the nothrow form must return NULL
// and the throwing form must throw std::bad_alloc to the program's handler,
// traced as untraced (the exception passes through memledger's hook frames).
#include <cstddef>
#include <cstdio>
#include <new>

int main() {
  const size_t huge = size_t{1} << 62;
  void* p = ::operator new(huge, std::nothrow);
  std::printf("nothrow: %s\n", p == nullptr ? "null" : "served");
  try {
    void* q = ::operator new[](huge);
    std::printf("throwing: served %p\n", q);
  } catch (const std::bad_alloc&) {
    std::printf("throwing: bad_alloc caught\n");
  }
  return 3;
}
