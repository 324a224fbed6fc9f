"""Runs pytest_suite/test_gates.py under `pytest --memledger` and checks the
outcome: shared by test_pytest_plugin.py (build tree) and test_wheel.py
(the installed wheel). Not a test by itself."""

import os
import re
import shutil

import mltest

SUITE = mltest.SOURCE_DIR / "tests" / "integration" / "pytest_suite" / "test_gates.py"


def line_of(marker):
    for number, text in enumerate(SUITE.read_text().splitlines(), 1):
        if "# " + marker in text:
            return number
    raise AssertionError("no line marked %s in %s" % (marker, SUITE))


def copy_suite(case):
    folder = case.tmpdir()
    shutil.copy(SUITE, os.path.join(folder, "test_gates.py"))
    with open(os.path.join(folder, "pytest.ini"), "w") as f:
        f.write("[pytest]\n")  # the folder is the rootdir: test ids are test_gates.py::NAME
    return folder


def outcomes(stdout):
    """{test name: PASSED/FAILED/SKIPPED} from pytest -v output."""
    found = {}
    for m in re.finditer(r"test_gates\.py::(\w+) (PASSED|FAILED|SKIPPED|ERROR)", stdout):
        found[m.group(1)] = m.group(2)
    return found


def check_gates(case, proc):
    """The gates failed, passed and skipped the suite's tests as they must,
    naming the suite's own lines."""
    out = proc.stdout + proc.stderr
    case.assertEqual(proc.returncode, 1, case.describe(proc))
    case.assertEqual(outcomes(proc.stdout), {
        "test_leaks_a_tensor_per_call": "FAILED",
        "test_clean": "PASSED",
        "test_device_kind": "SKIPPED",
        "test_peak_over": "FAILED",
        "test_peak_under": "PASSED",
        "test_unmarked": "PASSED",
    }, out)
    case.assertRegex(out, r"memledger_limit_growth\(64\.0 KiB, kind='total'\): total live bytes grew by 1\.0 MiB")
    case.assertRegex(out, r"top growing site: leak_one at test_gates\.py:%d \(\+1\.0 MiB host, 4 allocations\)"
                     % line_of("LEAK"))
    case.assertRegex(out, r"memledger_limit_peak\(2\.0 MiB, kind='host'\): host live bytes rose to 8\.\d MiB")
    case.assertRegex(out, r"top live-at-peak site: burst\S* at test_gates\.py:%d \(8\.0 MiB host" % line_of("PEAK"))
    case.assertNotIn("/pluggy/", out)  # the stacks stop at the test's own frames
    case.assertRegex(out, r"SKIPPED \[1\] .*memledger_limit_growth\(kind='device'\) needs a GPU, and none is present")
