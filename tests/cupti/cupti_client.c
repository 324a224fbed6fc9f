/* A CUPTI client library, as PyTorch's profiler (Kineto, in libtorch_cuda.so)
 * is one: linked against libcupti (here the stand-in), it reaches CUPTI
 * through its own dependencies. Python loads such a library RTLD_LOCAL, so
 * libcupti stays out of the global scope that a preloaded library searches
 * with dlsym(RTLD_NEXT). */
int cuptiSubscribe(void** subscriber, void* callback, void* userdata);
int cuptiUnsubscribe(void* subscriber);

__attribute__((visibility("default"))) int cupti_client_subscribe(void** subscriber) {
  return cuptiSubscribe(subscriber, 0, 0);
}

__attribute__((visibility("default"))) int cupti_client_unsubscribe(void* subscriber) {
  return cuptiUnsubscribe(subscriber);
}
