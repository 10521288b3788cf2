"""Shared pieces of the property-based tests (hypothesis, `slow` tier): value strategies with the special values
kernels get wrong, a small pool of shapes (so the tens of thousands of cases compile a few dozen programs), and a
harness that runs malformed FFI calls in a child process, so a crash fails the test instead of killing pytest."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}


def values(dtype_name: str, shape: tuple[int, ...], *, special: bool = True):
    """Arrays of ``shape`` whose elements mix ordinary magnitudes with, when ``special``, zeros of both signs,
    subnormals, the largest finite values, infinities and NaN."""
    dtype = DTYPES[dtype_name]
    info = ml_dtypes.finfo(dtype)
    pool = [0.0, -0.0, float(info.smallest_subnormal), -float(info.smallest_subnormal), float(info.tiny),
            float(info.max), -float(info.max), np.inf, -np.inf, np.nan] if special else []

    @st.composite
    def array(draw):
        count = int(np.prod(shape))
        seed = draw(st.integers(0, 2 ** 32 - 1))
        rng = np.random.default_rng(seed)
        scale = 2.0 ** draw(st.integers(-20, 20))
        # Clipped to the dtype's range so the cast below rounds instead of overflowing: infinities come from the
        # pool, where the test asks for them.
        x = np.clip(rng.standard_normal(count) * scale, -float(info.max), float(info.max)).astype(np.float32)
        if pool and count:
            for _ in range(draw(st.integers(0, min(4, count)))):
                x[draw(st.integers(0, count - 1))] = draw(st.sampled_from(pool))
        return x.reshape(shape).astype(dtype)

    return array()


def malformed_calls_survive(cases: list[dict]) -> None:
    """Runs each ``{"target", "inputs": [[shape, dtype]], "outputs": [[shape, dtype]], "attrs": {}}`` FFI call in
    one child process, printing each before it runs; every call must raise a Python exception (not crash, not
    succeed), and the process must end normally."""
    code = textwrap.dedent("""
        import json, sys
        import jax, jax.numpy as jnp, numpy as np
        from jax_aiter import _native
        assert _native.load("cpu").problem is None, _native.load("cpu").problem
        outcomes = []
        for case in json.loads(sys.stdin.read()):
            print("case", json.dumps(case), flush=True)
            inputs = [jnp.ones(s, d) for s, d in case["inputs"]]
            outputs = [jax.ShapeDtypeStruct(s, d) for s, d in case["outputs"]]
            attrs = {k: (np.float32(v) if isinstance(v, float) else np.int32(v) if isinstance(v, int)
                         and not isinstance(v, bool) else v) for k, v in case["attrs"].items()}
            try:
                jax.block_until_ready(jax.ffi.ffi_call(case["target"], outputs)(*inputs, **attrs))
                outcomes.append("succeeded")
            except Exception as err:
                outcomes.append(type(err).__name__)
        print("outcomes", json.dumps(outcomes), flush=True)
    """)
    result = subprocess.run([sys.executable, "-c", code], input=json.dumps(cases), capture_output=True, text=True,
                            timeout=900)
    last = [line for line in result.stdout.splitlines() if line.startswith("case ")][-1:] or ["(none)"]
    assert result.returncode == 0, f"child ended with {result.returncode} at {last[0]}: {result.stderr[-2000:]}"
    outcomes = json.loads(result.stdout.splitlines()[-1].removeprefix("outcomes "))
    accepted = [case for case, outcome in zip(cases, outcomes) if outcome == "succeeded"]
    assert not accepted, f"malformed calls were accepted: {accepted[:3]}"


def break_one_slot(case: dict, draw, grow=None) -> dict:
    """Makes one operand or result of a well-formed FFI call ``case`` wrong: its dtype changed, or one dimension
    grown. ``grow(side, index, axis, length)`` gives the grown length (default length + 1), for slots where + 1
    would still be valid. ``draw`` is hypothesis's ``data.draw``."""
    slots = [(side, i) for side in ("inputs", "outputs") for i in range(len(case[side]))]
    side, index = draw(st.sampled_from(slots))
    shape, dtype = case[side][index]
    if draw(st.booleans()):
        others = [d for d in ("int32", "uint8", "float32", "bfloat16", "float16") if d != dtype]
        case[side][index] = [shape, draw(st.sampled_from(others))]
    else:
        grown = list(shape)
        axis = draw(st.integers(0, len(grown) - 1))
        grown[axis] = grow(side, index, axis, grown[axis]) if grow else grown[axis] + 1
        case[side][index] = [grown, dtype]
    return case


def assert_same_specials_and_close(got, want, dtype) -> None:
    """NaN and ±Inf in the same places, and the finite values within the ulp bound of ``dtype``
    (tests/_oracle.py)."""
    import _oracle

    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.where(np.isinf(want), got, 0), np.where(np.isinf(want), want, 0))
    finite = np.isfinite(want)
    if finite.any():
        _oracle.assert_close(got[finite], want[finite], dtype, factor=2)
