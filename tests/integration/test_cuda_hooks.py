"""The CUDA hooks against the simulated driver and runtime (tests/sim_cuda):
every way a program reaches the driver, each with a planted per-step device
leak and a planted out-of-memory.

    cuda_runtime_dynamic   runtime API through the shared runtime (runtime hooks)
    cuda_runtime_static    runtime linked statically: only cuGetProcAddress shows the driver calls
    cuda_driver_dlopen     dlopen(libcuda) + dlsym of each function (TensorFlow/XLA style), pools, VMM
    cuda_driver_linked     linked against libcuda (exported symbols)
    libcuda_plugin.so      a library linked against the shared runtime, loaded RTLD_LOCAL by ctypes
"""
import ctypes  # noqa: F401  (used by the child script below)
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

from mltest import BUILD_DIR, MEMLEDGER, LIBRARY, TIMEOUT, clean_env, parse_kv

SIM_DIR = BUILD_DIR / "tests" / "sim_cuda"
DRIVER_DIR = SIM_DIR / "driver"
PLUGIN = SIM_DIR / "programs" / "libcuda_plugin.so"
STEPS = 12
LEAK = 3 << 20  # not a multiple of the 2 MiB granularity: rounding shows as fragmentation


def sim_program(name):
    return str(SIM_DIR / "programs" / name)


def sim_env(**extra):
    return clean_env(LD_LIBRARY_PATH=str(DRIVER_DIR), SIMCUDA_DEVICES="2", SIMCUDA_MEMORY_MB="512", **extra)


def two_device_script(body, runtime=False):
    """A script on the simulated CUDA: the driver as `cuda` (and the runtime as
    `cudart`), `step` (memledger_step), the primary contexts of devices 0 and 1
    retained as `p0` and `p1`, none current; then `body`."""
    prologue = textwrap.dedent(f"""
        import ctypes
        cuda = ctypes.CDLL({str(DRIVER_DIR / 'libcuda.so.1')!r})
        step = ctypes.CDLL(None).memledger_step
        assert cuda.cuInit(0) == 0
        p0, p1 = ctypes.c_void_p(), ctypes.c_void_p()
        assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(p0), 0) == 0
        assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(p1), 1) == 0
    """)
    if runtime:
        prologue += f"cudart = ctypes.CDLL({str(SIM_DIR / 'runtime' / 'libcudart.so.13')!r}, mode=ctypes.RTLD_GLOBAL)\n"
    return prologue + textwrap.dedent(body)


@unittest.skipUnless((DRIVER_DIR / "libcuda.so.1").exists(), "the simulated CUDA is not built (no CUDA 13 headers)")
class CudaHooks(unittest.TestCase):
    def trace(self, program, mode, steps=STEPS, leak=LEAK, *extra):
        run_dir = tempfile.mkdtemp(prefix="memledger-cuda-")
        self.addCleanup(shutil.rmtree, run_dir, ignore_errors=True)
        proc = subprocess.run([MEMLEDGER, "run", "-q", "--host", "off", "-o", run_dir, *extra, "--",
                               sim_program(program), str(steps), str(leak), mode],
                              capture_output=True, text=True, timeout=TIMEOUT, env=sim_env())
        with open(os.path.join(run_dir, "report.json")) as f:
            report = json.load(f)
        return proc, parse_kv(proc.stdout), report

    def trace_script(self, script, **env):
        """A Python script (ctypes on the simulated CUDA) traced by memledger:
        the process, its report and the run folder."""
        run_dir = tempfile.mkdtemp(prefix="memledger-script-")
        self.addCleanup(shutil.rmtree, run_dir, ignore_errors=True)
        proc = subprocess.run([MEMLEDGER, "run", "-q", "--host", "off", "-o", run_dir, "--", sys.executable, "-c",
                               script], capture_output=True, text=True, timeout=TIMEOUT, env=sim_env(**env))
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        with open(os.path.join(run_dir, "report.json")) as f:
            return proc, json.load(f), run_dir

    def check_leak(self, program, mode, kind="device", allocations_per_step=1.0):
        proc, out, report = self.trace(program, mode)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(out.get("SIM_DRIVER"), "1")
        per_step = int(out["LEAK_PER_STEP"])
        self.assertEqual(len(report["steps"]), STEPS)
        suspects = [s for s in report["leak_suspects"] if s["kind"] == kind]
        self.assertTrue(suspects, f"no {kind} suspect; notes: {report['notes']}")
        top = suspects[0]
        self.assertEqual(top["bytes_per_step"], per_step)
        self.assertEqual(top["allocations_per_step"], allocations_per_step)
        self.assertIn("plant_device_leak", top["site"])
        self.assertTrue(top["site"].endswith(f"{out['LEAK_FILE']}:{out['LEAK_LINE']}"), top["site"])
        # One user call is one event: live device bytes grow by exactly the leak.
        lives = [s["live"].get(kind, 0) for s in report["steps"]]
        for a, b in zip(lives[1:], lives[2:]):
            self.assertEqual(b - a, per_step, lives)
        return report, out

    def test_peak_counts_device_memory_in_every_host_mode(self):
        # Only host allocations are sampled: the device's exact bytes, at the
        # moment of each device allocation, make the peak in sampled mode as
        # in full mode (the program's largest moment is a transient device
        # buffer inside a step, between the writer's samples).
        peaks = {}
        for host in ("full", "sampled"):
            proc, _, report = self.trace("cuda_runtime_dynamic", "normal", STEPS, LEAK, "--host", host)
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
            peaks[host] = report["peak"]
            device_ends = max(s["live"].get("device", 0) for s in report["steps"])
            self.assertGreater(report["peak"]["bytes"], device_ends, (host, report["peak"]))
        self.assertEqual(peaks["sampled"]["step"], peaks["full"]["step"], peaks)
        self.assertAlmostEqual(peaks["sampled"]["bytes"], peaks["full"]["bytes"], delta=512 << 10, msg=peaks)

    # -- every path to the driver, each with its planted leak -----------------
    def test_runtime_dynamic(self):
        report, _ = self.check_leak("cuda_runtime_dynamic", "normal")
        self.assertEqual(report["verdict"]["kind"], "exit")

    def test_runtime_dynamic_async(self):
        self.check_leak("cuda_runtime_dynamic", "async")

    def test_runtime_dynamic_pool(self):
        report, _ = self.check_leak("cuda_runtime_dynamic", "pool")
        holders = [h for s in report["steps"] for h in s["fragmentation"]["device"]["holders"]]
        self.assertTrue(any(h["name"].startswith("memory pool") for h in holders), holders)

    def test_runtime_dynamic_managed(self):
        self.check_leak("cuda_runtime_dynamic", "managed", kind="managed")

    def test_runtime_static_through_cuGetProcAddress(self):
        self.check_leak("cuda_runtime_static", "normal")

    def test_runtime_static_async(self):
        self.check_leak("cuda_runtime_static", "async")

    def test_driver_dlopen_dlsym(self):
        self.check_leak("cuda_driver_dlopen", "normal")

    def test_driver_dlopen_pool(self):
        report, _ = self.check_leak("cuda_driver_dlopen", "pool")
        last = report["steps"][-1]
        frag = last["fragmentation"]["device"]
        self.assertGreaterEqual(last["held"]["device"], last["live"]["device"])
        self.assertGreaterEqual(frag["bytes"], 0)

    def test_driver_dlopen_vmm(self):
        # Whole 2 MiB physical chunks: the 3 MiB leak takes two per step.
        report, out = self.check_leak("cuda_driver_dlopen", "vmm", allocations_per_step=2.0)
        # Reserved address space is shown apart and never counted as memory.
        last = report["steps"][-1]
        self.assertGreater(last.get("reserved_address_space", 0), 0)
        self.assertLess(last["held"]["device"], last["reserved_address_space"])

    def test_driver_dlopen_vmm_handle_references(self):
        # NCCL's VMM sequence, handles released while mapped, a retain and an
        # import: memory is freed by the last release of a handle *and* the
        # last unmap, never by the first release.
        report, _ = self.check_leak("cuda_driver_dlopen", "nccl", allocations_per_step=2.0)
        self.assertEqual(report["stats"].get("unknown_frees", 0), 0, report["stats"])

    def test_driver_linked(self):
        self.check_leak("cuda_driver_linked", "normal")

    def test_driver_linked_async(self):
        self.check_leak("cuda_driver_linked", "async")

    def test_device_memory_sampled_at_every_step(self):
        proc, out, report = self.trace("cuda_runtime_dynamic", "normal")
        total = int(out["TOTAL"])
        for s in report["steps"]:
            self.assertEqual(s["device_memory"]["total"], total)
        frees = [s["device_memory"]["free"] for s in report["steps"]]
        self.assertLess(frees[-1], frees[0])

    # -- a runtime outside the global scope ------------------------------------
    def run_plugin(self, body, traced):
        """Python loads the plugin RTLD_LOCAL (ctypes' default, as the JAX CUDA
        plugin loads its runtime) and runs `body`; its printed lines."""
        script = textwrap.dedent(f"""
            import ctypes, os
            plugin = ctypes.CDLL({str(PLUGIN)!r}, mode=os.RTLD_LOCAL)
            step = getattr(ctypes.CDLL(None), "memledger_step", None)
        """) + textwrap.dedent(body)
        if traced:
            proc, report, _ = self.trace_script(script)
            return proc.stdout.split(), report
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT,
                              env=sim_env())
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        return proc.stdout.split(), None

    def test_runtime_loaded_rtld_local(self):
        # The runtime hooks' real functions are not in the global scope: they
        # come from the runtime the calling library linked, never an error
        # the runtime would not return.
        codes, report = self.run_plugin(f"""
            for i in range(8):
                print(plugin.plugin_leak(ctypes.c_size_t({LEAK})), plugin.plugin_alloc_free(ctypes.c_size_t(1 << 20)))
                step(b"train")
        """, traced=True)
        self.assertEqual(set(codes), {"0"}, codes)
        self.assertEqual(len(report["steps"]), 8)
        suspects = [s for s in report["leak_suspects"] if s["kind"] == "device"]
        self.assertTrue(suspects, report["notes"])
        self.assertEqual(suspects[0]["bytes_per_step"], LEAK)
        lives = [s["live"].get("device", 0) for s in report["steps"]]
        self.assertEqual(lives[-1] - lives[0], 7 * LEAK, lives)

    def test_default_lookup_from_rtld_local_library(self):
        # dlsym(RTLD_DEFAULT) made by a library loaded RTLD_LOCAL searches its
        # own scope too, as without memledger.
        body = """
            print(plugin.plugin_default_lookup())
        """
        plain, _ = self.run_plugin(body, traced=False)
        traced, _ = self.run_plugin(body, traced=True)
        self.assertEqual(plain, ["2"])
        self.assertEqual(traced, plain)

    # -- out of memory ---------------------------------------------------------
    def check_oom(self, program):
        proc, out, report = self.trace(program, "oom", 4)
        self.assertEqual(proc.returncode, 3, proc.stdout + proc.stderr)
        verdict = report["verdict"]
        self.assertEqual(verdict["kind"], "cuda_oom", verdict["summary"])
        oom = report["ooms"][-1]
        self.assertEqual(oom["requested"], int(out["OOM_REQUESTED"]))
        self.assertEqual(oom["error"], 2)
        self.assertEqual(oom["device_total"], int(out["TOTAL"]))
        self.assertTrue(oom["live_by_site"])
        self.assertTrue(any("plant_device_leak" in s["site"] for s in oom["live_by_site"]), oom["live_by_site"])
        # The same live set by role: every byte of it (a C++ program: no rule knows its stacks).
        self.assertEqual(sum(oom["live_by_role"].values()), oom["device_live"], oom["live_by_role"])
        self.assertEqual(oom["live_by_role"]["other"], oom["device_live"])
        self.assertIn("CUDA out of memory", verdict["summary"])

    def test_oom_runtime(self):
        self.check_oom("cuda_runtime_dynamic")

    def test_oom_static_runtime(self):
        self.check_oom("cuda_runtime_static")

    def test_oom_driver_dlopen(self):
        self.check_oom("cuda_driver_dlopen")

    def test_oom_driver_linked(self):
        self.check_oom("cuda_driver_linked")

    # -- untouched behaviour ---------------------------------------------------
    def test_invalid_arguments_return_what_the_driver_returns(self):
        script = textwrap.dedent(f"""
            import ctypes
            cuda = ctypes.CDLL({str(DRIVER_DIR / 'libcuda.so.1')!r})
            out = []
            out.append(cuda.cuInit(0))
            p = ctypes.c_ulonglong(0)
            out.append(cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(0)))
            out.append(cuda.cuMemAlloc_v2(None, ctypes.c_size_t(16)))
            out.append(cuda.cuMemFree_v2(ctypes.c_ulonglong(0x1234)))
            dev = ctypes.c_int(0)
            ctx = ctypes.c_void_p()
            cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
            cuda.cuCtxSetCurrent(ctx)
            out.append(cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(1 << 40)))
            out.append(cuda.cuMemFree_v2(ctypes.c_ulonglong(0x1234)))
            print(out)
        """)
        plain = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=sim_env(),
                               timeout=TIMEOUT)
        run_dir = tempfile.mkdtemp(prefix="memledger-inv-")
        self.addCleanup(shutil.rmtree, run_dir, ignore_errors=True)
        traced = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT,
                                env=sim_env(LD_PRELOAD=LIBRARY, MEMLEDGER_DIR=run_dir))
        self.assertEqual(plain.returncode, 0, plain.stderr)
        self.assertEqual(traced.stdout, plain.stdout, traced.stderr)

    def test_failed_free_keeps_the_allocation_live(self):
        # A free the driver refuses (a stream-ordered free on a stream that
        # does not exist) frees nothing: the live set keeps the block.
        script = textwrap.dedent(f"""
            import ctypes
            cuda = ctypes.CDLL({str(DRIVER_DIR / 'libcuda.so.1')!r})
            step = ctypes.CDLL(None).memledger_step
            cuda.cuInit(0)
            ctx = ctypes.c_void_p()
            cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
            cuda.cuCtxSetCurrent(ctx)
            p = ctypes.c_ulonglong(0)
            assert cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(4 << 20)) == 0
            print(cuda.cuMemFreeAsync(p, ctypes.c_void_p(0x5eed)))
            step(b"train")
            print(cuda.cuMemFree_v2(p))
            step(b"train")
        """)
        proc, report, _ = self.trace_script(script)
        codes = proc.stdout.split()
        self.assertNotEqual(codes[0], "0")
        self.assertEqual(codes[1], "0")
        self.assertEqual([s["live"].get("device", 0) for s in report["steps"]], [4 << 20, 0])

    def test_pool_allocations_labelled_by_the_pool(self):
        # Pools on a host location, managed pools without a location and a
        # pool on device 1 used while device 0 is current: each allocation
        # is labelled by its pool, and only device pools count as held
        # device memory.
        mib = 1 << 20
        script = textwrap.dedent(f"""
            import ctypes
            cuda = ctypes.CDLL({str(DRIVER_DIR / 'libcuda.so.1')!r})
            step = ctypes.CDLL(None).memledger_step
            assert cuda.cuInit(0) == 0
            ctx = ctypes.c_void_p()
            cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
            cuda.cuCtxSetCurrent(ctx)

            def create(alloc_type, location_type, location_id):
                props = (ctypes.c_int * 32)()  # CUmemPoolProps, zeroed
                props[0], props[2], props[3] = alloc_type, location_type, location_id
                pool = ctypes.c_void_p()
                assert cuda.cuMemPoolCreate(ctypes.byref(pool), props) == 0
                return pool

            def allocate(pool, size):
                p = ctypes.c_ulonglong(0)
                assert cuda.cuMemAllocFromPoolAsync(ctypes.byref(p), ctypes.c_size_t(size), pool, None) == 0

            PINNED, MANAGED, NONE, DEVICE, HOST = 1, 2, 0, 1, 2
            host_default = ctypes.c_void_p()
            location = (ctypes.c_int * 2)(HOST, 0)
            assert cuda.cuMemGetDefaultMemPool(ctypes.byref(host_default), location, PINNED) == 0
            allocate(create(PINNED, HOST, 0), 3 * {mib})
            allocate(host_default, 1 * {mib})
            allocate(create(MANAGED, NONE, 0), 5 * {mib})
            allocate(create(PINNED, DEVICE, 1), 7 * {mib})
            step(b"train")
        """)
        _, report, _ = self.trace_script(script)
        step = report["steps"][0]
        self.assertEqual(step["live"].get("pinned_host"), 4 * mib, step["live"])
        self.assertEqual(step["live"].get("managed"), 5 * mib, step["live"])
        self.assertEqual(step["live"].get("device"), 7 * mib, step["live"])
        self.assertEqual(step["live_by_device"], [0, 7 * mib])
        # The device 1 pool's one 32 MiB chunk; the host pools' are not device memory.
        self.assertEqual(step["held"]["device"], 32 * mib)

    def test_async_allocations_labelled_by_the_streams_device(self):
        # Device 0 current, streams made on device 1 (driver and runtime):
        # cuMemAllocAsync/cudaMallocAsync draw from the pool current to the
        # stream's device (here one set with cuDeviceSetMemPool), not the
        # current device's; the default streams stay the current device's.
        mib = 1 << 20
        script = two_device_script(f"""
            props = (ctypes.c_int * 32)()  # CUmemPoolProps: pinned, on device 1
            props[0], props[2], props[3] = 1, 1, 1
            pool = ctypes.c_void_p()
            assert cuda.cuMemPoolCreate(ctypes.byref(pool), props) == 0
            assert cuda.cuDeviceSetMemPool(1, pool) == 0
            cuda.cuCtxSetCurrent(p1)
            stream = ctypes.c_void_p()
            assert cuda.cuStreamCreate(ctypes.byref(stream), 0) == 0
            cuda.cuCtxSetCurrent(p0)
            p = ctypes.c_ulonglong(0)
            assert cuda.cuMemAllocAsync(ctypes.byref(p), ctypes.c_size_t(6 * {mib}), stream) == 0
            assert cuda.cuMemAllocAsync(ctypes.byref(p), ctypes.c_size_t(2 * {mib}), None) == 0
            assert cudart.cudaSetDevice(1) == 0
            rt_stream = ctypes.c_void_p()
            assert cudart.cudaStreamCreate(ctypes.byref(rt_stream)) == 0
            assert cudart.cudaSetDevice(0) == 0
            q = ctypes.c_void_p()
            assert cudart.cudaMallocAsync(ctypes.byref(q), ctypes.c_size_t(5 * {mib}), rt_stream) == 0
            assert cudart.cudaMallocAsync(ctypes.byref(q), ctypes.c_size_t(1 * {mib}), None) == 0
            step(b"train")
        """, runtime=True)
        _, report, _ = self.trace_script(script)
        step = report["steps"][0]
        self.assertEqual(step["live_by_device"], [3 * mib, 11 * mib])

    def test_stream_handles_reused_on_another_device(self):
        # A stream's device is kept after the first allocation on it; a
        # destroyed stream's handle comes back for a stream of the other
        # device (through the driver's export, through cuGetProcAddress as
        # cudart reaches it, and with its context destroyed), and each
        # allocation is still labelled by its own stream's device.
        mib = 1 << 20
        script = two_device_script(f"""
            found = ctypes.c_void_p()
            status = ctypes.c_int()
            assert cuda.cuGetProcAddress_v2(b"cuStreamDestroy", ctypes.byref(found), 12000,
                                            ctypes.c_ulonglong(0), ctypes.byref(status)) == 0
            destroy_found = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(found.value)
            destroys = [cuda.cuStreamDestroy_v2, cuda.cuStreamDestroy, destroy_found]
            handles = set()
            reused = 0
            for i in range(6):
                ctx = p1 if i % 2 else p0
                own = None
                if i == 4:  # a context of its own, destroyed with its stream in it
                    own = ctypes.c_void_p()
                    assert cuda.cuCtxCreate_v2(ctypes.byref(own), 0, 0) == 0
                    ctx = own
                cuda.cuCtxSetCurrent(ctx)
                stream = ctypes.c_void_p()
                assert cuda.cuStreamCreate(ctypes.byref(stream), 0) == 0
                reused += stream.value in handles
                handles.add(stream.value)
                cuda.cuCtxSetCurrent(p0)
                p = ctypes.c_ulonglong(0)
                assert cuda.cuMemAllocAsync(ctypes.byref(p), ctypes.c_size_t((i + 1) * {mib}), stream) == 0
                if own is not None:
                    assert cuda.cuCtxDestroy_v2(own) == 0
                else:
                    assert destroys[i % 3](stream) == 0
            print("REUSED", reused)
            step(b"train")
        """)
        proc, report, _ = self.trace_script(script)
        self.assertGreater(int(proc.stdout.split("REUSED")[1].split()[0]), 2, proc.stdout)
        step = report["steps"][0]
        # Device 0: allocations 1, 3, 5 MiB (rounds 0, 2, 4); device 1: 2, 4, 6 MiB.
        self.assertEqual(step["live_by_device"], [9 * mib, 12 * mib])

    def test_graph_memory_counted_at_launches(self):
        # A captured step: a scratch buffer allocated and freed inside the
        # graph, and two kept (one by the runtime, one by the driver).
        # Capture allocates nothing; each launch does, so live bytes follow
        # the launches. Then each step captures a new graph, launches it and
        # destroys it: destroying a graph frees none of its allocations, so
        # the kept ones grow by a launch per step, at their capture site,
        # and the report says they are graph-owned.
        mib = 1 << 20
        script = textwrap.dedent(f"""
            import ctypes
            cuda = ctypes.CDLL({str(DRIVER_DIR / 'libcuda.so.1')!r})
            cudart = ctypes.CDLL({str(SIM_DIR / 'runtime' / 'libcudart.so.13')!r}, mode=ctypes.RTLD_GLOBAL)
            step = ctypes.CDLL(None).memledger_step
            MIB = {mib}
            assert cuda.cuInit(0) == 0
            ctx = ctypes.c_void_p()
            assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
            cuda.cuCtxSetCurrent(ctx)
            stream = ctypes.c_void_p()
            assert cuda.cuStreamCreate(ctypes.byref(stream), 0) == 0

            def capture():
                assert cuda.cuStreamBeginCapture_v2(stream, 0) == 0
                scratch, kept_drv = ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)
                kept_rt = ctypes.c_void_p()
                assert cuda.cuMemAllocAsync(ctypes.byref(scratch), ctypes.c_size_t(3 * MIB), stream) == 0
                assert cudart.cudaMallocAsync(ctypes.byref(kept_rt), ctypes.c_size_t(1 * MIB), stream) == 0  # KEPT_RT
                assert cuda.cuMemAllocAsync(ctypes.byref(kept_drv), ctypes.c_size_t(2 * MIB), stream) == 0  # KEPT_DRV
                assert cuda.cuMemFreeAsync(scratch, stream) == 0
                graph = ctypes.c_void_p()
                assert cuda.cuStreamEndCapture(stream, ctypes.byref(graph)) == 0
                return graph, kept_rt, kept_drv

            graph, kept_rt, kept_drv = capture()
            step(b"train")
            exec_ = ctypes.c_void_p()
            assert cuda.cuGraphInstantiateWithFlags(ctypes.byref(exec_), graph, ctypes.c_ulonglong(1)) == 0
            for i in range(4):
                assert cuda.cuGraphLaunch(exec_, stream) == 0
                step(b"train")
            assert cuda.cuGraphExecDestroy(exec_) == 0
            assert cuda.cuGraphDestroy(graph) == 0
            assert cudart.cudaFreeAsync(kept_rt, stream) == 0
            assert cuda.cuMemFreeAsync(kept_drv, stream) == 0
            step(b"train")
            for i in range(10):
                graph, _, _ = capture()
                assert cuda.cuGraphInstantiateWithParams(ctypes.byref(exec_), graph,
                                                         (ctypes.c_ulonglong * 4)(0, 0, 0, 0)) == 0
                assert cuda.cuGraphLaunch(exec_, stream) == 0
                assert cuda.cuGraphExecDestroy(exec_) == 0
                assert cuda.cuGraphDestroy(graph) == 0
                step(b"train")
        """)
        _, report, run_dir = self.trace_script(script)
        lives = [s["live"].get("device", 0) for s in report["steps"]]
        self.assertEqual(lives, [0] + [3 * mib] * 4 + [0] + [3 * mib * k for k in range(1, 11)])
        # Held by the device's graph memory (its 2 MiB granules), which the
        # hooks now account for: nothing is left unexplained.
        launched = report["steps"][1]
        holders = {h["name"]: h["held"] for h in launched["fragmentation"]["device"]["holders"]}
        self.assertEqual(holders["CUDA graph memory on device 0"], 4 * mib, holders)
        self.assertEqual(launched["held"]["device"], 4 * mib)
        self.assertEqual(launched["not_hooked_by_device"], {"0": 0})
        # Each relaunch (auto-free) freed the previous launch's allocations
        # first; every free matched an allocation.
        self.assertEqual(report["stats"].get("double_allocations"), 0, report["stats"])
        self.assertEqual(report["stats"].get("unknown_frees"), 0, report["stats"])
        lines = {i + 1: n for i, line in enumerate(script.splitlines()) for n in ("KEPT_RT", "KEPT_DRV")
                 if "# " + n in line}
        suspects = {lines.get(int(s["site"].rsplit(":", 1)[1])): s for s in report["leak_suspects"]
                    if s["kind"] == "device"}
        self.assertEqual(sorted(suspects, key=str), ["KEPT_DRV", "KEPT_RT"], report["leak_suspects"])
        for name, size in (("KEPT_RT", 1 * mib), ("KEPT_DRV", 2 * mib)):
            s = suspects[name]
            self.assertTrue(s.get("graph_owned"), s["site"])
            self.assertEqual(s["series"], [0] * 6 + [size * k for k in range(1, 11)])
        text = subprocess.run([MEMLEDGER, "report", run_dir], capture_output=True, text=True, timeout=TIMEOUT).stdout
        self.assertIn("CUDA graph-owned", text)

    def test_captures_begun_every_way_are_seen(self):
        # Allocations ask the driver whether their stream is being captured
        # only while a capture is under way, so every way a capture begins
        # must be seen: the exported v1, v2 and per-thread entry points, a
        # pointer from cuGetProcAddress (as cudart finds it) and capture
        # into an existing graph. An end that fails (a stream that is not
        # capturing) must not count as one. Allocations captured are graph
        # nodes, live nowhere; only the last, uncaptured one is live.
        mib = 1 << 20
        script = two_device_script(f"""
            import threading
            MIB = {mib}
            cuda.cuCtxSetCurrent(p0)
            a, b = ctypes.c_void_p(), ctypes.c_void_p()
            assert cuda.cuStreamCreate(ctypes.byref(a), 0) == 0
            assert cuda.cuStreamCreate(ctypes.byref(b), 0) == 0
            begin_fn = ctypes.c_void_p()
            status = ctypes.c_int()
            assert cuda.cuGetProcAddress_v2(b"cuStreamBeginCapture", ctypes.byref(begin_fn), 12000,
                                            ctypes.c_ulonglong(0), ctypes.byref(status)) == 0
            begin_found = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int)(begin_fn.value)
            graphs = []

            def alloc(stream, size):
                p = ctypes.c_ulonglong(0)
                assert cuda.cuMemAllocAsync(ctypes.byref(p), ctypes.c_size_t(size), stream) == 0
                return p

            def end(stream, ptsz=False):
                graph = ctypes.c_void_p()
                fn = cuda.cuStreamEndCapture_ptsz if ptsz else cuda.cuStreamEndCapture
                assert fn(stream, ctypes.byref(graph)) == 0
                graphs.append(graph)

            assert begin_found(a, 0) == 0
            alloc(a, 3 * MIB)
            assert cuda.cuStreamEndCapture(b, ctypes.byref(ctypes.c_void_p())) != 0  # b is not capturing
            other = []
            t = threading.Thread(target=lambda: other.append(cuda.cuStreamEndCapture(a, ctypes.byref(ctypes.c_void_p()))))
            t.start()
            t.join()
            assert other == [908], other  # CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: the capture goes on
            alloc(a, 2 * MIB)
            end(a)
            assert cuda.cuStreamBeginCapture(a) == 0
            alloc(a, 1 * MIB)
            end(a)
            assert cuda.cuStreamBeginCapture_ptsz(b) == 0
            alloc(b, 1 * MIB)
            end(b, ptsz=True)
            assert cuda.cuStreamBeginCapture_v2_ptsz(b, 2) == 0
            alloc(b, 1 * MIB)
            end(b, ptsz=True)
            into = ctypes.c_void_p()
            assert cuda.cuGraphCreate(ctypes.byref(into), 0) == 0
            assert cuda.cuStreamBeginCaptureToGraph(a, into, None, None, ctypes.c_size_t(0), 0) == 0
            alloc(a, 4 * MIB)
            end(a)
            assert graphs[-1].value == into.value
            assert cuda.cuStreamBeginCapture_v2(ctypes.c_void_p(1), 0) != 0  # the legacy stream: refused
            alloc(a, 5 * MIB)
            step(b"train")
        """)
        _, report, _ = self.trace_script(script)
        self.assertEqual(report["steps"][0]["live"].get("device", 0), 5 * mib, report["steps"][0])

    def test_every_device_sampled_without_a_current_context(self):
        # Each step leaks a context on device 1 (SIMCUDA_CONTEXT_MB of device
        # memory that no allocation call shows) and ends on a thread with no
        # current context: every device with an active primary context is
        # still sampled, device 1's free memory falls by a context per step.
        script = two_device_script(f"""
            cuda.cuCtxSetCurrent(p0)
            p = ctypes.c_ulonglong(0)
            assert cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(8 << 20)) == 0
            for i in range(8):
                c = ctypes.c_void_p()
                assert cuda.cuCtxCreate_v2(ctypes.byref(c), 0, 1) == 0
                assert cuda.cuCtxPopCurrent_v2(ctypes.byref(c)) == 0
                cuda.cuCtxSetCurrent(None)
                step(b"train")
                cuda.cuCtxSetCurrent(p0)
        """)
        _, report, run_dir = self.trace_script(script, SIMCUDA_CONTEXT_MB="4")
        trace = [f for f in os.listdir(run_dir) if f.startswith("trace.")]
        dump = subprocess.run([MEMLEDGER, "dump", os.path.join(run_dir, trace[0])], capture_output=True, text=True,
                              timeout=TIMEOUT).stdout
        free = {0: [], 1: []}
        for line in dump.splitlines():
            if line.startswith("device_sample "):
                fields = dict(f.split("=", 1) for f in line.split()[1:])
                free[int(fields["device"])].append(int(fields["free"]))
        self.assertEqual(len(free[0]), 8, dump[-2000:])
        self.assertEqual(len(free[1]), 8)
        self.assertEqual({a - b for a, b in zip(free[1], free[1][1:])}, {4 << 20})
        self.assertEqual(len(set(free[0])), 1)
        # The report: device 1's memory that no hooked call allocated grows
        # by a context per step, judged like a site; device 0's does not.
        series = [s["not_hooked_by_device"] for s in report["steps"]]
        self.assertEqual({b["1"] - a["1"] for a, b in zip(series, series[1:])}, {4 << 20}, series)
        self.assertEqual({s["0"] for s in series}, {series[0]["0"]})
        suspects = [s for s in report["leak_suspects"] if s["site"].startswith("device memory not allocated")]
        self.assertEqual([s["site"] for s in suspects],
                         ["device memory not allocated through hooked calls (device 1)"], report["leak_suspects"])
        self.assertEqual(suspects[0]["bytes_per_step"], 4 << 20)

    def test_unknown_free_is_counted_not_fatal(self):
        proc, out, report = self.trace("cuda_driver_linked", "normal")
        self.assertEqual(proc.returncode, 0)
        self.assertIn("unknown_frees", report["stats"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
