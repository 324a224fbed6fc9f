// An operator new that cannot be served: the nothrow form must return NULL
// and the throwing form must throw std::bad_alloc to the program's handler,
// traced as untraced (the exception passes through memledger's hook frames).
// A new-handler is called once per failed attempt, as without memledger:
// this one counts its calls and gives up on the third.
#include <cstddef>
#include <cstdio>
#include <new>

namespace {
int g_handler_calls = 0;
void count_then_give_up() {
  if (++g_handler_calls == 3) std::set_new_handler(nullptr);
}
}  // namespace

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
  std::set_new_handler(count_then_give_up);
  try {
    void* q = ::operator new(huge);
    std::printf("handler: served %p\n", q);
  } catch (const std::bad_alloc&) {
    std::printf("handler: called %d times, then bad_alloc\n", g_handler_calls);
  }
  return 3;
}
