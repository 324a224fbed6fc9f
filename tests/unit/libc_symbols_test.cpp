#include <catch2/catch.hpp>

#include "../../interposer/libc_symbols.h"

using memledger::interposer::is_library_file;

TEST_CASE("a library's own file is told apart from its sub-libraries and longer names", "[libc_symbols]") {
  CHECK(is_library_file("/usr/lib/x86_64-linux-gnu/libcudnn.so.9", "libcudnn"));
  CHECK(is_library_file("libcudnn.so", "libcudnn"));
  // pip wheels' copies carry a hex hash (auditwheel).
  CHECK(is_library_file("/site-packages/torch/lib/libcudart-1b201d85.so.11.0", "libcudart"));
  CHECK(is_library_file("/site-packages/nvidia/cudnn/lib/libcudnn-1a2b.so", "libcudnn"));
  // cuDNN 9's sub-library, nvrtc's builtins: libraries of their own.
  CHECK_FALSE(is_library_file("/site-packages/nvidia/cudnn/lib/libcudnn_graph.so.9", "libcudnn"));
  CHECK_FALSE(is_library_file("/site-packages/nvidia/cu13/lib/libnvrtc-builtins.so.13.2", "libnvrtc"));
  // Longer names that start with the library's.
  CHECK_FALSE(is_library_file("/usr/local/cuda/lib64/libcudart.so.13", "libcuda"));
  CHECK_FALSE(is_library_file("libcublasLt.so.13", "libcublas"));
  // A hash that is not one, a name with no ".so".
  CHECK_FALSE(is_library_file("libcudart-.so", "libcudart"));
  CHECK_FALSE(is_library_file("libcudart-1b2c", "libcudart"));
  CHECK_FALSE(is_library_file("libcuda", "libcuda"));
}
