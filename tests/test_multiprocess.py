"""Across processes: 2 processes of 4 CPU devices each, joined by jax.distributed (the multi-controller runtime that
runs one process per host), run the MXFP4 and BF16 FSDP training steps of tests/test_sharding.py on all 8 devices
(tests/multiprocess_worker.py), and give what one process gives on 8 devices (docs/training.md, "More than one
host"). test_sharding.py checks that one-process run against the unsharded step."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding

import _oracle
import multiprocess_worker
import test_sharding

pytestmark = pytest.mark.multidevice

PROCESSES = 2
WORKER = Path(multiprocess_worker.__file__).resolve()
# Both processes start, compile two steps and finish in about 30 s on 2 cores; a hang (a process that never joins,
# a collective that waits forever) fails the test at this limit instead of stalling the suite.
TIMEOUT_S = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_env() -> dict[str, str]:
    """This process's environment without the 8 virtual devices tests/conftest.py forces: a worker has its own 4."""
    env = dict(os.environ)
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", "")).strip()
    env.pop("XLA_FLAGS", None)
    if flags:
        env["XLA_FLAGS"] = flags
    return env


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> tuple[dict[str, np.ndarray], dict]:
    out = tmp_path_factory.mktemp("multiprocess")
    coordinator = f"127.0.0.1:{_free_port()}"
    logs = [out / f"process{i}.log" for i in range(PROCESSES)]
    procs = []
    for i, log in enumerate(logs):
        with log.open("w") as sink:
            procs.append(subprocess.Popen(
                [sys.executable, str(WORKER), "--coordinator", coordinator, "--processes", str(PROCESSES),
                 "--process-id", str(i), "--out", str(out)],
                cwd=WORKER.parent, env=_worker_env(), stdout=sink, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + TIMEOUT_S
    try:
        for proc in procs:
            proc.wait(timeout=max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    tails = "\n".join(f"--- process {i} (exit {p.returncode}):\n{log.read_text()[-3000:]}"
                      for i, (p, log) in enumerate(zip(procs, logs)))
    assert all(p.returncode == 0 for p in procs), f"the processes did not all exit 0 within {TIMEOUT_S} s:\n{tails}"
    with np.load(out / "results.npz") as results:
        return dict(results), json.loads((out / "collectives.json").read_text())


def _one_process(step, inputs, act_spec, weight_spec):
    """The same step on this process's 8 CPU devices (the CPU even where a GPU is the default)."""
    mesh = multiprocess_worker.fsdp_mesh(jax.devices("cpu")[:8])
    act, weight = NamedSharding(mesh, act_spec), NamedSharding(mesh, weight_spec)
    operands = [np.asarray(t) for t in inputs()]
    outputs = jax.jit(step, in_shardings=(act, weight, act), out_shardings=(act, act, weight))(*operands)
    return operands, [np.asarray(o, np.float32) for o in outputs]


def _wgrad_magnitude(run: str, a, dy) -> np.ndarray:
    """sum over tokens of |g| |x| for each weight gradient element, in float64: the operands wgrad multiplies
    (mxfp4: the dequantized columnwise copies that the recipe makes; bf16: dy and a themselves)."""
    if run == "mxfp4":
        g, x = test_sharding.wgrad_operands(a, dy)
    else:
        g, x = (_oracle.f64(t).reshape(-1, t.shape[-1]).T for t in (dy, a))
    return np.abs(g) @ np.abs(x).T


@pytest.mark.parametrize("run", ["mxfp4", "bf16"])
def test_fsdp_step_across_two_processes_equals_one_process(two_processes, run):
    if len(jax.devices("cpu")) < 8:
        pytest.skip("needs 8 CPU devices (tests/conftest.py forces 8 virtual ones)")
    results, collectives = two_processes
    (a, _, dy), (y1, da1, db1) = _one_process(*multiprocess_worker.runs()[run])
    y, da, db = (results[f"{run}.{label}"] for label in ("y", "da", "db"))

    # Forward and input gradient: every device runs the same program on the same shard as in one process, with the
    # weight gathered (bytes copied, whichever transport): the same bits.
    np.testing.assert_array_equal(y, y1)
    np.testing.assert_array_equal(da, da1)
    # Weight gradient: the same 8 float32 partial products (one per device), which the reduce-scatter may sum in
    # another order across processes. Each order is within 7 * 2^-24 * sum|partial| of the exact sum (recursive
    # summation of 8 terms), so the two float32 sums differ by at most 14 * 2^-24 * sum|partial|, and their bf16
    # roundings by that plus one bf16 spacing at the larger result. sum|partial| <= (1 + 2^-7) sum|g||x| covers
    # the partials' own roundings (mxfp4: bf16 partials, 2^-8; bf16: float32 dots over 8 tokens).
    partial_magnitude = (1 + 2.0 ** -7) * _wgrad_magnitude(run, a, dy)
    larger = np.maximum(np.abs(db), np.abs(db1))
    spacing = np.where(larger > 0, 2.0 ** (np.floor(np.log2(np.where(larger > 0, larger, 1))) - 7), 0)
    assert np.all(np.abs(_oracle.f64(db) - _oracle.f64(db1)) <= 14 * 2.0 ** -24 * partial_magnitude + spacing)

    ops = collectives[run]
    assert {op for op, _ in ops} >= {"all-gather", "reduce-scatter"}, ops
    if run == "mxfp4":
        # The weight crosses processes as FP4 bytes and scales (fprop rowwise, dgrad columnwise), never as bf16.
        n, k = test_sharding.N, test_sharding.K
        gathered = [(dtype, dims) for op, types in ops if op == "all-gather" for dtype, dims in types]
        assert all(dtype == "u8" for dtype, _ in gathered), gathered
        assert sum(int(np.prod(dims)) for _, dims in gathered) == 2 * (n * k // 2 + n * k // 32)
