// Configure-time probe: does clang++ link a libFuzzer target here?
extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }
