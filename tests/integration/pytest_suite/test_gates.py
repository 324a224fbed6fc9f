"""A small memory-gated suite for test_pytest_plugin.py and test_wheel.py
(`pytest --memledger`; not part of the project's suite by itself). The
lines marked LEAK and PEAK are what the failures must name."""

import pytest
import torch

kept = []


def leak_one():
    kept.append(torch.ones(64, 1024))  # LEAK: 256 KiB kept per call


@pytest.mark.memledger_limit_growth("64 KiB")
def test_leaks_a_tensor_per_call():
    for _ in range(4):
        leak_one()


@pytest.mark.memledger_limit_growth("64 KiB", kind="host")
def test_clean():
    for _ in range(4):
        t = torch.ones(64, 1024)
        del t


@pytest.mark.memledger_limit_growth("64 KiB", kind="device")
def test_device_kind():
    pass


def burst():
    return [torch.ones(256, 1024) for _ in range(8)]  # PEAK: 8 MiB at once


@pytest.mark.memledger_limit_peak("2 MiB", kind="host")
def test_peak_over():
    assert len(burst()) == 8


@pytest.mark.memledger_limit_peak("64 MiB")
def test_peak_under():
    assert len(burst()) == 8


def test_unmarked():
    kept.append(torch.ones(16, 1024))
