"""Live counters in process (memledger_live, memledger.live()): exact host
live bytes in every host mode, device bytes per GPU and held bytes from the
simulated CUDA driver, the step count, and "tracing is off" outside
`memledger run`."""

import json
import os
import sys
import textwrap

import mltest

PACKAGE_DIR = os.environ.get("MLTEST_PYTHON_PACKAGE", str(mltest.SOURCE_DIR / "tools" / "python"))
DRIVER_DIR = mltest.BUILD_DIR / "tests" / "sim_cuda" / "driver"

HOST_SCRIPT = textwrap.dedent('''
    import json, memledger
    before = memledger.live()
    block = bytearray(10 << 20)
    during = memledger.live()
    del block
    after = memledger.live()
    memledger.step("one")
    memledger.step("two")
    steps = memledger.live()
    print(json.dumps({"before": before.live, "during": during.live, "after": after.live,
                      "tracing": during.tracing, "tracked": during.host_tracked,
                      "sampled": during.host_sampled, "exact": during.host_exact,
                      "held": during.held, "steps": steps.steps - before.steps,
                      "seq_grows": steps.seq > before.seq}))
''')

DEVICE_SCRIPT = textwrap.dedent('''
    import ctypes, json, memledger
    cuda = ctypes.CDLL(%r)
    assert cuda.cuInit(0) == 0
    ctx = ctypes.c_void_p()
    cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 1)
    cuda.cuCtxSetCurrent(ctx)
    out = {"base": memledger.live().live}
    dev, managed = ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)
    assert cuda.cuMemAlloc_v2(ctypes.byref(dev), ctypes.c_size_t(3 << 20)) == 0
    assert cuda.cuMemAllocManaged(ctypes.byref(managed), ctypes.c_size_t(1 << 20), 1) == 0
    now = memledger.live()
    out.update(live=now.live, held=now.held, device_live=now.device_live, device_held=now.device_held)
    cuda.cuMemFree_v2(dev)
    cuda.cuMemFree_v2(managed)
    out["freed"] = memledger.live().live
    print(json.dumps(out))
''')


class LiveCounters(mltest.TestCase):
    def run_script(self, script, options=(), env=None, traced=True):
        path = os.path.join(self.tmpdir(), "script.py")
        with open(path, "w") as f:
            f.write(script)
        if not traced:
            env = mltest.clean_env(PYTHONPATH=PACKAGE_DIR)
            proc = self.run_cmd(["/usr/bin/python3", path], env=env)
        else:
            proc = self.traced(self.tmpdir(), ["/usr/bin/python3", path], options=("--no-report", *options),
                               env=env)
        self.assertExit(proc, 0)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def test_host_bytes_are_exact_in_each_mode(self):
        for mode in ("full", "sampled"):
            with self.subTest(mode=mode):
                out = self.run_script(HOST_SCRIPT, ("--host", mode))
                self.assertTrue(out["tracing"])
                self.assertTrue(out["tracked"] and out["exact"])
                self.assertEqual(out["sampled"], mode == "sampled")
                grown = out["during"]["host"] - out["before"]["host"]
                self.assertGreaterEqual(grown, 10 << 20)
                self.assertLess(grown, (10 << 20) + (256 << 10))
                self.assertLess(abs(out["after"]["host"] - out["before"]["host"]), 256 << 10)
                self.assertGreaterEqual(out["held"]["host"], 10 << 20)
                self.assertEqual(out["steps"], 2)
                self.assertTrue(out["seq_grows"])

    def test_host_off_is_said(self):
        out = self.run_script(HOST_SCRIPT, ("--host", "off"))
        self.assertTrue(out["tracing"])
        self.assertFalse(out["tracked"])
        self.assertEqual(out["during"]["host"], 0)

    def test_untraced_says_tracing_is_off(self):
        out = self.run_script(HOST_SCRIPT, traced=False)
        self.assertFalse(out["tracing"])
        self.assertEqual(out["during"], {"host": 0, "device": 0, "managed": 0, "pinned": 0})
        self.assertEqual(out["steps"], 0)

    @mltest.unittest.skipUnless((DRIVER_DIR / "libcuda.so.1").exists(), "the simulated CUDA is not built")
    def test_device_bytes_per_gpu_and_held(self):
        env = mltest.clean_env(LD_LIBRARY_PATH=str(DRIVER_DIR), SIMCUDA_DEVICES="2", SIMCUDA_MEMORY_MB="512")
        out = self.run_script(DEVICE_SCRIPT % str(DRIVER_DIR / "libcuda.so.1"), ("--cupti", "off"), env=env)
        self.assertEqual(out["base"]["device"], 0)
        self.assertEqual(out["live"]["device"], 3 << 20)
        self.assertEqual(out["live"]["managed"], 1 << 20)
        self.assertEqual(out["device_live"], [0, 3 << 20])
        self.assertEqual(out["held"]["device"], 4 << 20)  # rounded to the 2 MiB granularity
        self.assertEqual(out["device_held"], [0, 4 << 20])
        self.assertEqual(out["freed"]["device"], 0)
        self.assertEqual(out["freed"]["managed"], 0)


if __name__ == "__main__":
    mltest.main()
