// A library the object index test loads and unloads while it runs.
extern "C" __attribute__((visibility("default"))) int unwind_loadable_value(int x) { return x * 3 + 1; }
