"""``jax-aiter bench``: every op this project ships next to plain JAX, in one process (docs/performance.md).

Sections, all on the default device and in one process (so clocks, driver and the jax build are the same for
every number):

* **ceilings**: the device-to-device copy (x -> -x over a large buffer, bytes read + written) and the bf16
  matrix rate (``jnp.dot`` of 8192^3);
* **kernels**: each memory-bound op and direction three ways: plain XLA (``use_backend("xla")``), this
  project's kernel, and the default selection (what a call without overrides runs). Outputs are checked
  against XLA's before timing (casts byte-exact, the rest within ~1 ulp). Fraction of the copy ceiling and the
  ratio to XLA are reported;
* **linear**: ``gemm_fp4_bf16`` (MXFP4 forward and both backward GEMMs) against the bf16 ``jnp.dot`` linear,
  forward alone and forward + backward, and ``gemm_fp8`` (FP8, current scaling) forward + backward at
  16384x4096 -> 14336 (GPUs only);
* **attention**: ``flash_attn_func`` / ``flash_attn_varlen`` with default arguments, with
  ``deterministic=True``, and ``jax.nn.dot_product_attention`` with cuDNN (also compiled under XLA's
  determinism flag) and with XLA, forward + backward;
* **block**: one Llama-style decoder block training step (forward + gradients of all weights) built from this
  project's ops (bf16 linears, and MXFP4 linears) against the same block in plain JAX;
* **train**: one training step (forward, gradients, clipping, Adam) of the convergence benchmark's ``75m``
  decoder (74.7 M parameters, 16 x 1024 tokens; ``cpu-tiny`` with ``--quick``) under the BF16, FP8 and default
  MXFP4 precision policies (docs/convergence.md), each against the BF16 step;
* **fsdp** (two or more devices): the ``gemm_fp4_bf16`` and ``gemm`` training steps with FSDP sharding against
  one device.

Times are medians over batches of back-to-back calls with one synchronization per batch, after a warm-up call.
Memory-bound kernels run on at least four copies of their inputs inside one call (more while the copies span
under twice the L2 cache), so neither the cache nor the host's dispatch of a call bounds a kernel of tens of µs.
Writes a JSON file and, when matplotlib is installed, a plot next to it.

    jax-aiter bench [--out DIR] [--quick] [--only SECTION ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

BF16 = jnp.bfloat16
L2_BYTES = 60 * 2 ** 20  # H200; rotated inputs span at least twice this
# Input copies per call of a memory-bound kernel at least: on the H200 the rowwise cast of 16384 x 4096 measured
# 78-92 µs per cast with one copy per call and 66 µs with four, the host's dispatch setting the first.
MIN_COPIES = 4
STEADY_STATE_S = 0.5  # untimed seconds of a compute-bound program before each timed batch (timed_together)
LARGE_BYTES = 64 * 2 ** 20  # kernel cases moving fewer bytes are reported but not held to targets
SECTIONS = ("kernels", "linear", "attention", "block", "train", "fsdp")

# Targets (docs/performance.md): kernels as (fraction of the copy ceiling, speed-up of the kernel over XLA);
# every default must reach DEFAULT_VS_XLA of plain XLA's speed.
KERNEL_TARGETS = {
    "cast_mxfp4_dual": (0.80, 6.0),
    "cast_mxfp4_rowwise": (0.85, 2.0),
    "cast_mxfp4_dual_h16_shuffled": (0.50, None),
    "cast_mxfp4_dual_sr": (0.50, None),
    "rms_norm_fwd": (0.90, None),
    "add_rms_norm_fwd": (0.90, 1.15),
    "silu_and_mul_fwd": (0.90, None),
    "rms_norm_bwd": (0.80, None),
    "add_rms_norm_bwd": (0.80, None),
    "silu_and_mul_bwd": (0.80, None),
}
DEFAULT_VS_XLA = 0.98
LINEAR_TARGETS = {"fwd": 1.2, "fwd+bwd": 1.3}  # gemm_fp4_bf16 time / bf16 jnp.dot linear time, at most
FP8_LINEAR_TARGETS = {"fwd+bwd": 0.7}  # gemm_fp8 time / bf16 jnp.dot linear time, at most (issue 18)
ATTENTION_DEFAULT_VS_CUDNN = 0.95  # cuDNN time / default time, at least
ATTENTION_DETERMINISTIC_VS_CUDNN = 2.0  # cuDNN's deterministic backward: its time / cuDNN's time, at most
REFERENCE_ATTENTION_VS_XLA = 1.5  # deterministic=True without XLA's flag (the reference): its time / XLA's, at most
BLOCK_VS_CUDNN = {"ours": 1.0, "ours_mxfp4": 0.95}  # plain JAX with cuDNN attention / the block's time, at least
TRAIN_MXFP4_VS_BF16 = 1.2  # the 75m model's step with every block MXFP4 / its BF16 step, at most
# Arms of jax_aiter.examples.convergence. The target is the every-block arm's: the cost of the MXFP4 kernels, which
# the default policy's BF16 blocks would hide; the weights-once arm is the same step with its weights quantized once
# per step (the same bits); the stochastic-gradient arm times the stochastic casts.
TRAIN_ARMS = ("bf16", "fp8", "mxfp4-every-block", "mxfp4-every-block-weights-once", "mxfp4", "mxfp4-sr-grad")
TRAIN_TARGET_ARM = "mxfp4-every-block"


# --- measuring -----------------------------------------------------------------------------------------------


def timed(fn: Callable, args: Any, batches: int, calls: int, per_call: int = 1) -> float:
    """Seconds per op: ``fn(args)`` runs ``per_call`` ops; ``calls`` launches back to back, one sync per batch."""
    jax.block_until_ready(fn(args))
    samples = []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) / (calls * per_call))
    return statistics.median(samples)


def timed_together(fns: dict[str, Callable], args: Any, batches: int, calls: int, per_call: int = 1,
                   settle_s: float = 0.0) -> dict[str, float]:
    """:func:`timed` for several programs on the same inputs, their batches interleaved (a, b, c, a, b, c, ...),
    so clock and thermal drift during the measurement affects all of them alike.

    ``settle_s``: each batch follows at least that many seconds of untimed calls of its own program. A GPU held at
    its power limit runs a program that follows another at the clock the other left: on an H200 one decoder-block
    step measured 18.2 to 19.7 ms by its position among the others alone (docs/performance.md, "Method"). Settled,
    each program is timed at its own steady clock, the one it keeps when a training loop runs it step after step."""
    for fn in fns.values():
        jax.block_until_ready(fn(args))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(batches):
        for name, fn in fns.items():
            settled = time.perf_counter() + settle_s
            while time.perf_counter() < settled:
                jax.block_until_ready(fn(args))
            start = time.perf_counter()
            for _ in range(calls):
                out = fn(args)
            jax.block_until_ready(out)
            samples[name].append((time.perf_counter() - start) / (calls * per_call))
    return {name: statistics.median(values) for name, values in samples.items()}


def compile_fn(fn: Callable, *args, compiler_options: dict | None = None):
    """jit + compile, with XLA compiler options for this program alone (e.g. its determinism flag)."""
    return jax.jit(fn).lower(*args).compile(compiler_options=compiler_options)


def check_close(got, want, exact: bool, what: str) -> None:
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if exact:
            if not np.array_equal(a, b):
                raise AssertionError(f"{what}: bytes differ from XLA's")
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        scale = np.sqrt(np.mean(b64 ** 2)) + 1e-30
        tol = {2: 2 ** -7, 4: 1e-5}[a.dtype.itemsize] * 2
        if not np.all(np.abs(a64 - b64) <= tol * (np.abs(b64) + scale)):
            raise AssertionError(f"{what}: differs from XLA by more than ~1 ulp")


def normal(key, shape, scale=1.0, dtype=BF16):
    return (scale * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


class Progress:
    """A progress bar on stderr: ``[####......] 12/40  attention default  63.2s``."""

    def __init__(self, total: int, width: int = 30):
        self.total, self.width, self.done = max(total, 1), width, 0
        self.start = time.perf_counter()
        self.tty = sys.stderr.isatty()

    def step(self, label: str) -> None:
        self.done += 1
        filled = int(self.width * self.done / self.total)
        text = (f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total}  {label[:48]:<48} "
                f"{time.perf_counter() - self.start:6.1f}s")
        sys.stderr.write(("\r" + text) if self.tty else (text + "\n"))
        if self.tty and self.done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


@dataclasses.dataclass
class Context:
    quick: bool
    batches: int
    progress: Progress | None = None
    rows: list[dict] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    on_row: Callable[[], None] | None = None  # called after each row: main rewrites the JSON file

    @property
    def settle_s(self) -> float:
        """Untimed seconds of a compute-bound program before each of its batches (``timed_together``)."""
        return 0.0 if self.quick else STEADY_STATE_S

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if self.on_row is not None:
            self.on_row()
        if self.progress is not None:
            self.progress.step(f"{row['section']} {row['name']} {row.get('shape', '')}")


# --- ceilings --------------------------------------------------------------------------------------------------


def copy_ceiling(ctx: Context) -> float:
    """Bytes per second of the elementwise copy x -> -x (read + write)."""
    n = 2 ** 24 if ctx.quick else 2 ** 30
    x = jax.random.normal(jax.random.key(0), (n,), BF16)
    negate = jax.jit(lambda x: -x)
    return 2 * x.nbytes / timed(negate, x, ctx.batches, calls=10)


def matmul_rate(ctx: Context) -> float:
    """FLOP per second of a bf16 ``jnp.dot`` on random data (8192^3; 512^3 with --quick)."""
    n = 512 if ctx.quick else 8192
    a, b = normal(jax.random.key(1), (n, n)), normal(jax.random.key(2), (n, n))
    dot = jax.jit(jnp.dot)
    return 2 * n ** 3 / timed(lambda ab: dot(*ab), (a, b), ctx.batches, calls=5)


# --- kernels --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class KernelCase:
    op: str
    shape: tuple[int, ...]
    bytes: int  # fewest bytes moved: every input read once, every output written once
    make: Callable[[jax.Array], tuple]  # key -> inputs
    xla: Callable  # the op (traced under use_backend("xla"))
    kernel: Callable  # this project's kernel, called directly
    default: Callable  # the public op, default selection
    backward: bool = False  # time the vjp of the functions on the inputs' cotangent (the last input)
    exact: bool = False


def kernel_cases(quick: bool) -> list[KernelCase]:
    from jax_aiter import _native, activation, gemm_fp4, native, rmsnorm
    from jax_aiter.native import activation as native_activation
    from jax_aiter.native import rmsnorm as native_rmsnorm

    def forced(fn, backend):
        def run(*args):
            import jax_aiter

            with jax_aiter.use_backend(backend):
                return fn(*args)
        return run

    for platform in _native.present_platforms():  # the kernels are called directly below: register them
        _native.load(native.LIBRARY[platform])
    norm_shapes = [(256, 512)] if quick else [(16384, 4096), (8192, 8192)]
    silu_shapes = [(256, 512)] if quick else [(16384, 14336), (8192, 14336)]
    cast_shapes = [(256, 512)] if quick else [(16384, 4096), (8192, 8192), (16384, 14336)]
    variant_shapes = cast_shapes[:1]
    out: list[KernelCase] = []
    for m, k in norm_shapes:
        n = m * k * 2
        norm_in = lambda key, s=(m, k): (normal(key, s), normal(jax.random.fold_in(key, 1), s[-1:], 0.5) + 1)  # noqa
        add_in = lambda key, s=(m, k): (normal(key, s), normal(jax.random.fold_in(key, 2), s),  # noqa: E731
                                        normal(jax.random.fold_in(key, 1), s[-1:], 0.5) + 1)
        norm = lambda x, g: rmsnorm.rms_norm(x, g, 1e-6)  # noqa: E731
        norm_kernel = lambda x, g: native_rmsnorm.rms_norm(x, g, epsilon=1e-6)  # noqa: E731
        add = lambda x, r, g: rmsnorm.rms_norm_with_add(x, r, g, 1e-6)  # noqa: E731
        add_kernel = lambda x, r, g: native_rmsnorm.rms_norm_with_add(x, r, g, epsilon=1e-6)  # noqa: E731
        out.append(KernelCase("rms_norm_fwd", (m, k), 2 * n + m * 4, norm_in, forced(norm, "xla"), norm_kernel, norm))
        out.append(KernelCase("add_rms_norm_fwd", (m, k), 4 * n + m * 4, add_in, forced(add, "xla"), add_kernel, add))
        with_dy = lambda key, s=(m, k), f=norm_in: (*f(key), normal(jax.random.fold_in(key, 3), s))  # noqa: E731
        with_dys = lambda key, s=(m, k), f=add_in: (*f(key), (normal(jax.random.fold_in(key, 3), s),  # noqa: E731
                                                                normal(jax.random.fold_in(key, 4), s)))
        out.append(KernelCase("rms_norm_bwd", (m, k), 3 * n + m * 4, with_dy, forced(norm, "xla"), norm_kernel, norm,
                              backward=True))
        out.append(KernelCase("add_rms_norm_bwd", (m, k), 4 * n + m * 4, with_dys, forced(add, "xla"), add_kernel,
                              add, backward=True))
    for m, h in silu_shapes:
        n = m * h * 2
        silu_in = lambda key, s=(m, 2 * h): (normal(key, s, 2.0),)  # noqa: E731
        out.append(KernelCase("silu_and_mul_fwd", (m, 2 * h), 3 * n, silu_in, forced(activation.silu_and_mul, "xla"),
                              native_activation.silu_and_mul, activation.silu_and_mul))
        with_dy = lambda key, s=(m, h), f=silu_in: (*f(key), normal(jax.random.fold_in(key, 3), s))  # noqa: E731
        out.append(KernelCase("silu_and_mul_bwd", (m, 2 * h), 5 * n, with_dy, forced(activation.silu_and_mul, "xla"),
                              native_activation.silu_and_mul, activation.silu_and_mul, backward=True))
    casts = {
        "cast_mxfp4_rowwise": (lambda x: gemm_fp4.cast_mxfp4(x), 1),
        "cast_mxfp4_dual": (lambda x: gemm_fp4.cast_mxfp4_dual(x), 2),
        "cast_mxfp4_dual_h16_shuffled": (lambda x: gemm_fp4.cast_mxfp4_dual(
            x, hadamard_columnwise=16, layout_rowwise="gemm_a", layout_columnwise="gemm_b"), 2),
        "cast_mxfp4_dual_sr": (lambda x: gemm_fp4.cast_mxfp4_dual(x, sr_key=1234), 2),
    }
    for op, (fn, copies) in casts.items():
        for m, k in (cast_shapes if op in ("cast_mxfp4_rowwise", "cast_mxfp4_dual") else variant_shapes):
            n = m * k
            out.append(KernelCase(op, (m, k), 2 * n + copies * (n // 2 + n // 32),
                                  lambda key, s=(m, k): (normal(key, s),), forced(fn, "xla"), forced(fn, "native"), fn,
                                  exact=True))
    return out


def _kernel_inputs(case: KernelCase, fn: Callable, count: int) -> list:
    """Per replica: the op's inputs, or for a backward (vjp function, cotangent): the vjp function holds the
    forward's residuals, so timing vjp(ct) times the backward pass alone."""
    inputs = [case.make(jax.random.key(i)) for i in range(count)]
    if not case.backward:
        return inputs
    return [(jax.vjp(fn, *primals)[1], ct) for *primals, ct in inputs]


def _kernel_program(case: KernelCase, fn: Callable) -> Callable:
    if not case.backward:
        return lambda args_list: [fn(*args) for args in args_list]
    return lambda args_list: [vjp(ct) for vjp, ct in args_list]


def run_kernels(ctx: Context, copy_bw: float) -> None:
    for case in kernel_cases(ctx.quick):
        count = 1 if ctx.quick else max(MIN_COPIES, min(16, -(-2 * L2_BYTES // case.bytes)))
        row = dict(section="kernels", name=case.op, shape=list(case.shape), bytes=case.bytes)
        try:
            programs, inputs, outputs = {}, {}, {}
            for impl in ("xla", "kernel", "default"):
                inputs[impl] = _kernel_inputs(case, getattr(case, impl), count)
                programs[impl] = compile_fn(_kernel_program(case, getattr(case, impl)), inputs[impl])
                outputs[impl] = programs[impl](inputs[impl])[0]
                if impl != "xla":
                    check_close(outputs[impl], outputs["xla"], case.exact, f"{case.op} {case.shape} {impl}")
            # each program on its own inputs (a backward's residuals are its implementation's own)
            times = timed_together({impl: functools.partial(lambda a, p, impl: p(a[impl]), p=p, impl=impl)
                                    for impl, p in programs.items()}, inputs, ctx.batches,
                                   calls=max(2, 20 // count), per_call=count)
            del inputs, outputs
        except Exception as err:  # noqa: BLE001  (a failing case is reported, the others still run)
            row["error"] = f"{type(err).__name__}: {err}"
            ctx.add(row)
            continue
        fraction = case.bytes / times["kernel"] / copy_bw
        target = KERNEL_TARGETS.get(case.op) if case.bytes >= LARGE_BYTES and not ctx.quick else None
        row.update(xla_s=times["xla"], kernel_s=times["kernel"], default_s=times["default"],
                   kernel_fraction_of_copy=fraction, default_fraction_of_copy=case.bytes / times["default"] / copy_bw,
                   xla_fraction_of_copy=case.bytes / times["xla"] / copy_bw,
                   kernel_vs_xla=times["xla"] / times["kernel"], default_vs_xla=times["xla"] / times["default"])
        if target is not None:
            row["target"] = dict(kernel_fraction_of_copy=target[0], kernel_vs_xla=target[1],
                                 default_vs_xla=DEFAULT_VS_XLA)
            row["met"] = dict(kernel_fraction_of_copy=fraction >= target[0],
                              kernel_vs_xla=None if target[1] is None else row["kernel_vs_xla"] >= target[1],
                              default_vs_xla=row["default_vs_xla"] >= DEFAULT_VS_XLA)
        ctx.add(row)


# --- the MXFP4 and FP8 linears ----------------------------------------------------------------------------


def _time_linears(ctx: Context, fns: dict[str, Callable], x, w, dy, direction: str) -> tuple[dict, dict]:
    """Compiled ``fns`` (``fn(x, w)``), forward alone or forward + backward, timed together; (times, outputs)."""
    programs, outs = {}, {}
    for name, fn in fns.items():
        if direction == "fwd":
            program = lambda a, fn=fn: fn(a[0], a[1])  # noqa: E731
        else:
            def program(a, fn=fn):
                y, vjp = jax.vjp(fn, a[0], a[1])
                return (y, *vjp(a[2]))
        programs[name] = compile_fn(program, (x, w, dy))
        outs[name] = programs[name]((x, w, dy))
    return timed_together(programs, (x, w, dy), ctx.batches, calls=3, settle_s=ctx.settle_s), outs


def _check_against_bf16(got, want, what: str) -> None:
    """A low-precision linear changes the values: only a loose relative error against the bf16 product."""
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        rel = float(np.linalg.norm(a - b) / np.linalg.norm(b))
        if not rel < 0.25:
            raise AssertionError(f"{what} result off by {rel:.3f} relative to bf16")


def run_linear(ctx: Context, matmul_flops: float) -> None:
    from jax_aiter.gemm_fp4 import gemm_fp4_bf16
    from jax_aiter.gemm_fp8 import gemm_fp8

    shapes = [(256, 512, 256)] if ctx.quick else [(16384, 14336, 4096), (8192, 8192, 8192)]
    bf16 = lambda x, w: jnp.dot(x, w.T)  # noqa: E731
    # (name, key, function, shapes, directions, targets)
    cases = [("gemm_fp4_bf16", "mxfp4", lambda x, w: gemm_fp4_bf16(x, w), shapes, ("fwd", "fwd+bwd"),
              LINEAR_TARGETS)]
    if jax.default_backend() == "cpu":
        ctx.notes.append("linear: gemm_fp8 skipped on the CPU (its dot is the exact float32 reference there)")
    else:
        cases.append(("gemm_fp8", "fp8", gemm_fp8, shapes[:1], ("fwd+bwd",), FP8_LINEAR_TARGETS))
    for op, key, fn, op_shapes, directions, targets in cases:
        for m, n, k in op_shapes:
            x, w, dy = normal(jax.random.key(0), (m, k)), normal(jax.random.key(1), (n, k), 0.05), \
                normal(jax.random.key(2), (m, n))
            for direction in directions:
                row = dict(section="linear", name=f"{op} {direction}", shape=[m, n, k])
                try:
                    times, outs = _time_linears(ctx, {key: fn, "bf16": bf16}, x, w, dy, direction)
                    _check_against_bf16(outs[key], outs["bf16"], op)
                except Exception as err:  # noqa: BLE001
                    row["error"] = f"{type(err).__name__}: {err}"
                    ctx.add(row)
                    continue
                flops = 2 * m * n * k * (1 if direction == "fwd" else 3)
                ratio = times[key] / times["bf16"]
                row.update({f"{key}_s": times[key], "bf16_s": times["bf16"], f"{key}_over_bf16": ratio,
                            f"{key}_tflops": flops / times[key] / 1e12, "bf16_tflops": flops / times["bf16"] / 1e12,
                            f"{key}_fraction_of_peak": flops / times[key] / matmul_flops,
                            "bf16_fraction_of_peak": flops / times["bf16"] / matmul_flops})
                if direction in targets:
                    row.update(target={f"{key}_over_bf16": targets[direction]},
                               met={f"{key}_over_bf16": ratio <= targets[direction]})
                ctx.add(row)


# --- attention -------------------------------------------------------------------------------------------------


def _cudnn_available() -> bool:
    from jax_aiter.mha import _cudnn

    return _cudnn._availability_problem() is None


def _unguarded_cudnn(q, k, v):
    """Our cuDNN adapter without the handling that keeps masked non-finite keys/values out (attention.py,
    ``_non_finite_kept_out``): that handling's cost is the difference to the default row."""
    from jax_aiter.mha import _cudnn, attention

    operands, params = attention.flash_attn_call(q, k, v, dropout_p=0.0, softmax_scale=None, causal=True,
                                                 window_size=(-1, -1), bias=None, alibi_slopes=None,
                                                 deterministic=False, return_lse=False, dropout_key=None)
    return _cudnn.flash_attn(*operands, **params)


def run_attention(ctx: Context, matmul_flops: float) -> None:
    from jax_aiter.mha import flash_attn_func, flash_attn_varlen

    batch, seq, heads, dim = (2, 256, 4, 64) if ctx.quick else (4, 4096, 32, 128)
    cudnn = _cudnn_available()
    determinism = {"xla_gpu_exclude_nondeterministic_ops": True}
    for kv_heads in (heads, heads // 4):
        q = normal(jax.random.key(0), (batch, seq, heads, dim))
        k = normal(jax.random.key(1), (batch, seq, kv_heads, dim))
        v = normal(jax.random.key(2), (batch, seq, kv_heads, dim))
        do = normal(jax.random.key(3), (batch, seq, heads, dim))
        cu = jnp.arange(batch + 1, dtype=jnp.int32) * seq
        flat = lambda t: t.reshape(batch * seq, *t.shape[2:])  # noqa: E731
        variants: dict[str, tuple[Callable, dict | None]] = {
            "default": (lambda q, k, v: flash_attn_func(q, k, v, causal=True), None),
            "varlen default": (lambda q, k, v: flash_attn_varlen(
                flat(q), flat(k), flat(v), cu, cu, seq, seq, causal=True).reshape(q.shape), None),
            "deterministic": (lambda q, k, v: flash_attn_func(q, k, v, causal=True, deterministic=True), None),
            "xla": (lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla"),
                    None),
        }
        if cudnn:
            cudnn_fn = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,  # noqa: E731
                                                                   implementation="cudnn")
            variants["cudnn"] = (cudnn_fn, None)
            variants["cudnn deterministic"] = (cudnn_fn, determinism)
            variants["default, no finite guard"] = (_unguarded_cudnn, None)
        shape = [batch, seq, heads, kv_heads, dim]
        times = {}
        for name, (fn, options) in variants.items():
            def program(a, fn=fn):
                out, vjp = jax.vjp(fn, *a[:3])
                return (out, *vjp(a[3]))
            row = dict(section="attention", name=name, shape=shape)
            try:
                compiled = compile_fn(program, (q, k, v, do), compiler_options=options)
                compiled((q, k, v, do))
                times[name] = timed(compiled, (q, k, v, do), ctx.batches, calls=3)
            except Exception as err:  # noqa: BLE001
                row["error"] = f"{type(err).__name__}: {err}"
                ctx.add(row)
                continue
            # causal: half the logits; fwd 2 GEMMs, bwd 5 (with the recomputed logits)
            flops = 4 * batch * heads * seq * seq * dim * 7 / 2 / 2
            row.update(time_s=times[name], tflops=flops / times[name] / 1e12,
                       fraction_of_peak=flops / times[name] / matmul_flops)
            ctx.add(row)
        for row in ctx.rows:
            if row["section"] != "attention" or row.get("shape") != shape or "time_s" not in row:
                continue
            if "cudnn" in times:
                row["cudnn_over_this"] = times["cudnn"] / row["time_s"]
            if "xla" in times:
                row["xla_over_this"] = times["xla"] / row["time_s"]
            if row["name"] in ("default", "varlen default") and "cudnn" in times:
                row["target"] = dict(cudnn_over_this=ATTENTION_DEFAULT_VS_CUDNN)
                row["met"] = dict(cudnn_over_this=row["cudnn_over_this"] >= ATTENTION_DEFAULT_VS_CUDNN)
            if row["name"] == "cudnn deterministic" and "cudnn" in times:
                row["target"] = dict(this_over_cudnn=ATTENTION_DETERMINISTIC_VS_CUDNN)
                row["met"] = dict(this_over_cudnn=row["time_s"] / times["cudnn"] <= ATTENTION_DETERMINISTIC_VS_CUDNN)
            if row["name"] == "deterministic" and "cudnn" in times and "xla" in times:
                row["target"] = dict(xla_over_this=1 / REFERENCE_ATTENTION_VS_XLA)
                row["met"] = dict(xla_over_this=row["xla_over_this"] >= 1 / REFERENCE_ATTENTION_VS_XLA)


# --- one decoder block ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    batch: int = 2
    seq: int = 4096
    dim: int = 4096
    heads: int = 32
    kv_heads: int = 8
    ffn: int = 14336


def block_params(cfg: BlockConfig, key) -> dict:
    head_dim = cfg.dim // cfg.heads
    keys = jax.random.split(key, 5)
    return dict(
        norm1=jnp.ones((cfg.dim,), BF16), norm2=jnp.ones((cfg.dim,), BF16),
        qkv=normal(keys[0], ((cfg.heads + 2 * cfg.kv_heads) * head_dim, cfg.dim), cfg.dim ** -0.5),
        o=normal(keys[1], (cfg.dim, cfg.dim), cfg.dim ** -0.5),
        gate_up=normal(keys[2], (2 * cfg.ffn, cfg.dim), cfg.dim ** -0.5),
        down=normal(keys[3], (cfg.dim, cfg.ffn), cfg.ffn ** -0.5))


def block(params: dict, x: jax.Array, cfg: BlockConfig, impl: str) -> jax.Array:
    """A pre-norm Llama block ``[B, S, D] -> [B, S, D]``: x + attn(norm(x)), then + mlp(norm(.)). ``impl``:
    "plain" (jnp and jax.nn only, attention by ``jax.nn.dot_product_attention``'s default implementation),
    "plain_cudnn" (the same with ``implementation="cudnn"``), "ours" (this project's ops, bf16 linears through
    ``gemm``), "ours_mxfp4"
    (MXFP4 linears through ``gemm_fp4_bf16``)."""
    from jax_aiter import activation, gemm, rmsnorm
    from jax_aiter.gemm_fp4 import gemm_fp4_bf16
    from jax_aiter.mha import flash_attn_func

    head_dim = cfg.dim // cfg.heads
    b, s, d = x.shape

    def linear(t, w):
        if impl == "ours_mxfp4":
            return gemm_fp4_bf16(t, w)
        if impl.startswith("ours"):
            return gemm.gemm(t.reshape(-1, t.shape[-1]), w).reshape(*t.shape[:-1], w.shape[0])
        return jnp.dot(t, w.T)

    def norm(t, g):
        if impl.startswith("plain"):
            t32 = t.astype(jnp.float32)
            return (t32 * jax.lax.rsqrt(jnp.mean(t32 * t32, -1, keepdims=True) + 1e-6) * g).astype(t.dtype)
        return rmsnorm.rms_norm(t, g, 1e-6)

    h = norm(x, params["norm1"])
    qkv = linear(h, params["qkv"])
    q, k, v = jnp.split(qkv, [cfg.heads * head_dim, (cfg.heads + cfg.kv_heads) * head_dim], axis=-1)
    q = q.reshape(b, s, cfg.heads, head_dim)
    k = k.reshape(b, s, cfg.kv_heads, head_dim)
    v = v.reshape(b, s, cfg.kv_heads, head_dim)
    if impl == "plain":
        attn = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    elif impl == "plain_cudnn":
        attn = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
    else:
        attn = flash_attn_func(q, k, v, causal=True)
    x = x + linear(attn.reshape(b, s, d), params["o"])
    if impl.startswith("plain"):
        h = norm(x, params["norm2"])
        gate, up = jnp.split(linear(h, params["gate_up"]), 2, axis=-1)
        mlp = (jax.nn.silu(gate.astype(jnp.float32)) * up.astype(jnp.float32)).astype(x.dtype)
    else:
        h = norm(x, params["norm2"])
        mlp = activation.silu_and_mul(linear(h, params["gate_up"]))
    return x + linear(mlp, params["down"])


def run_block(ctx: Context, matmul_flops: float) -> None:
    cfg = BlockConfig(batch=2, seq=256, dim=512, heads=4, kv_heads=2, ffn=1024) if ctx.quick else BlockConfig()
    params = block_params(cfg, jax.random.key(0))
    x = normal(jax.random.key(1), (cfg.batch, cfg.seq, cfg.dim))
    dy = normal(jax.random.key(2), x.shape)
    impls = ("plain", "plain_cudnn", "ours", "ours_mxfp4") if _cudnn_available() else ("plain", "ours", "ours_mxfp4")
    shape = [cfg.batch, cfg.seq, cfg.dim, cfg.heads, cfg.kv_heads, cfg.ffn]
    compiled = {}
    for impl in impls:
        def step(a, impl=impl):
            params, x, dy = a
            out, vjp = jax.vjp(lambda p, x: block(p, x, cfg, impl), params, x)
            return out, vjp(dy)
        try:
            compiled[impl] = compile_fn(step, (params, x, dy))
            compiled[impl]((params, x, dy))
        except Exception as err:  # noqa: BLE001
            compiled.pop(impl, None)
            ctx.add(dict(section="block", name=impl, shape=shape, error=f"{type(err).__name__}: {err}"))
    times = timed_together(compiled, (params, x, dy), ctx.batches, calls=3, settle_s=ctx.settle_s)
    for impl in compiled:
        row = dict(section="block", name=impl, shape=shape)
        tokens = cfg.batch * cfg.seq
        linear_flops = 6 * tokens * sum(math.prod(p.shape) for name, p in params.items() if p.ndim == 2)
        attn_flops = 4 * cfg.batch * cfg.heads * cfg.seq ** 2 * (cfg.dim // cfg.heads) * 7 / 2 / 2
        row.update(time_s=times[impl], tflops=(linear_flops + attn_flops) / times[impl] / 1e12,
                   fraction_of_peak=(linear_flops + attn_flops) / times[impl] / matmul_flops)
        if "plain" in times:
            row["plain_over_this"] = times["plain"] / times[impl]
        if "plain_cudnn" in times:
            row["plain_cudnn_over_this"] = times["plain_cudnn"] / times[impl]
        targets = {}
        if impl == "ours" and "plain" in times:
            row["best_plain_over_this"] = min(t for name, t in times.items() if name.startswith("plain")) / times[impl]
            targets["best_plain_over_this"] = DEFAULT_VS_XLA
        if "plain_cudnn" in times and impl in BLOCK_VS_CUDNN:
            targets["plain_cudnn_over_this"] = BLOCK_VS_CUDNN[impl]
        if targets:
            row["target"] = targets
            row["met"] = {key: row[key] >= target for key, target in targets.items()}
        ctx.add(row)


# --- a model's training step ------------------------------------------------------------------------------


def run_train(ctx: Context, matmul_flops: float) -> None:
    from jax_aiter.examples import convergence, models, tiny_llama

    model = "cpu-tiny" if ctx.quick else "75m"
    setup = convergence.Setup.for_model(model)
    cfg = setup.config
    params = tiny_llama.init_params(cfg, jax.random.key(0))
    opt_state = tiny_llama.adam_init(params)
    tokens = jax.random.randint(jax.random.key(1), (cfg.batch, cfg.seq_len + 1), 0, cfg.vocab, jnp.int32)
    args = (params, opt_state, tokens)
    # Model FLOPs: 6 per parameter and token (forward and both gradients) plus causal attention's
    # 4 * S * dim per token and layer, halved by the mask, three times over for the backward pass.
    token_count = cfg.batch * cfg.seq_len
    flops = token_count * (6 * models.parameter_count(cfg) + 3 * 2 * cfg.seq_len * cfg.dim * cfg.layers)
    def train_row(name: str, **fields) -> dict:
        return dict(section="train", name=name, model=model, policy=convergence.ARMS[name].description,
                    shape=[cfg.batch, cfg.seq_len, cfg.dim, cfg.layers], **fields)

    steps = {}
    for name in TRAIN_ARMS:
        try:
            step = compile_fn(convergence.make_step(setup, convergence.ARMS[name].policy, jax.random.key(2)), *args)
            steps[name] = lambda a, step=step: step(*a)
            steps[name](args)  # a program that fails at run time is reported here, not inside the timing
        except Exception as err:  # noqa: BLE001
            steps.pop(name, None)
            ctx.add(train_row(name, error=f"{type(err).__name__}: {err}"))
    times = timed_together(steps, args, ctx.batches, calls=3, settle_s=ctx.settle_s)
    for name in steps:
        row = train_row(name)
        row.update(time_s=times[name], tokens_per_s=token_count / times[name], tflops=flops / times[name] / 1e12,
                   fraction_of_peak=flops / times[name] / matmul_flops)
        if name != "bf16" and "bf16" in times:
            row["bf16_over_this"] = times["bf16"] / times[name]
            if name == TRAIN_TARGET_ARM:
                row["target"] = dict(this_over_bf16=TRAIN_MXFP4_VS_BF16)
                row["met"] = dict(this_over_bf16=times[name] / times["bf16"] <= TRAIN_MXFP4_VS_BF16)
        ctx.add(row)


# --- FSDP on several devices --------------------------------------------------------------------------------


def run_fsdp(ctx: Context) -> None:
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    from jax_aiter import gemm
    from jax_aiter.gemm_fp4 import gemm_fp4_bf16

    devices = jax.devices()
    if len(devices) < 2:
        ctx.notes.append("fsdp: skipped, one device")
        return
    count = len(devices)
    m, n, k = (64 * count, 256, 512) if ctx.quick else (16384, 14336, 4096)
    x, w, dy = normal(jax.random.key(0), (m, k)), normal(jax.random.key(1), (n, k), 0.05), \
        normal(jax.random.key(2), (m, n))
    mesh = jax.make_mesh((count,), ("fsdp",), axis_types=(AxisType.Auto,))
    act, weight = NamedSharding(mesh, P("fsdp", None)), NamedSharding(mesh, P("fsdp", None))
    fns = {"gemm_fp4_bf16": lambda x, w: gemm_fp4_bf16(x, w), "gemm": lambda x, w: gemm.gemm(x, w)}
    for name, fn in fns.items():
        def step(x, w, dy, fn=fn):
            y, vjp = jax.vjp(fn, x, w)
            return (y, *vjp(dy))
        row = dict(section="fsdp", name=name, shape=[m, n, k], devices=count)
        try:
            one = jax.jit(step).lower(x, w, dy).compile()
            many = jax.jit(step, in_shardings=(act, weight, act), out_shardings=(act, act, weight))
            args = [jax.device_put(t, s) for t, s in ((x, act), (w, weight), (dy, act))]
            many = many.lower(*args).compile()
            want, got = one(x, w, dy), many(*args)
            for a, b in zip(got, want, strict=True):
                a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
                if not np.linalg.norm(a - b) <= 2 ** -7 * np.linalg.norm(b):
                    raise AssertionError(f"{name}: sharded differs from one device")
            t1 = timed(lambda a: one(*a), (x, w, dy), ctx.batches, calls=3)
            tn = timed(lambda a: many(*a), args, ctx.batches, calls=3)
        except Exception as err:  # noqa: BLE001
            row["error"] = f"{type(err).__name__}: {err}"
            ctx.add(row)
            continue
        row.update(one_device_s=t1, sharded_s=tn, speedup=t1 / tn)
        ctx.add(row)


# --- reporting -------------------------------------------------------------------------------------------------


def _fmt_shape(shape) -> str:
    return "x".join(str(s) for s in shape)


def summary(result: dict) -> str:
    lines = [f"{result['device']} ({result['platform']}), jax {result['jax']}; copy ceiling "
             f"{result['copy_ceiling_tb_s']:.2f} TB/s, bf16 matmul {result['matmul_tflops']:.0f} TFLOP/s"]

    def mark(row):
        met = row.get("met")
        if not met or result.get("quick"):
            return ""
        values = [v for v in met.values() if v is not None]
        return "met" if all(values) else "MISSED " + ",".join(k for k, v in met.items() if v is False)

    rows = result["rows"]

    def table(section, header, label_width, shape_width, numbers, label=lambda r: r["name"]):
        """One section's rows under ``header``: label, shape, ``numbers(row)`` and the target mark."""
        chosen = [r for r in rows if r["section"] == section]
        if not chosen:
            return
        lines.append(f"\n{header}")
        for r in chosen:
            start = f"{label(r):<{label_width}} {_fmt_shape(r['shape']):>{shape_width}}"
            lines.append(f"{start} FAILED: {r['error'][:200]}" if "error" in r else f"{start} {numbers(r)}  {mark(r)}")

    def linear_numbers(r):
        key = _linear_key(r)
        return (f"{r[f'{key}_s'] * 1e3:9.2f} {r['bf16_s'] * 1e3:9.2f} {r[f'{key}_over_bf16']:5.2f}x "
                f"{r[f'{key}_fraction_of_peak']:7.2f}")

    def timed_numbers(r):
        vs_cudnn = f"{r['cudnn_over_this']:8.2f}x" if "cudnn_over_this" in r else f"{'-':>9}"
        vs_xla = r.get("xla_over_this", r.get("plain_over_this"))
        vs_xla = f"{vs_xla:6.2f}x" if vs_xla is not None else f"{'-':>7}"
        return f"{r['time_s'] * 1e3:8.2f} {r['tflops']:8.1f} {vs_cudnn} {vs_xla}"

    def train_numbers(r):
        vs_bf16 = f"{r['bf16_over_this']:7.2f}x" if "bf16_over_this" in r else f"{'-':>8}"
        return f"{r['time_s'] * 1e3:8.2f} {r['tokens_per_s']:10.0f} {vs_bf16}"

    table("kernels", f"{'kernel':<30} {'shape':>12} {'xla us':>8} {'kernel':>8} {'default':>8} {'of copy':>7} "
          f"{'k/xla':>6} {'dflt/xla':>8}", 30, 12,
          lambda r: f"{r['xla_s'] * 1e6:8.1f} {r['kernel_s'] * 1e6:8.1f} {r['default_s'] * 1e6:8.1f} "
                    f"{r['kernel_fraction_of_copy']:7.2f} {r['kernel_vs_xla']:5.2f}x {r['default_vs_xla']:7.2f}x")
    table("linear", f"{'linear (MxN, K)':<30} {'shape':>18} {'ours ms':>9} {'bf16 ms':>9} {'ratio':>6} "
          f"{'of peak':>7}", 30, 18, linear_numbers)
    for section, title in (("attention", "attention fwd+bwd (B,S,Hq,Hk,D)"), ("block", "decoder block step")):
        table(section, f"{title:<34} {'shape':>22} {'ms':>8} {'TFLOP/s':>8} {'vs cuDNN':>9} {'vs XLA':>7}", 34, 22,
              timed_numbers)
    table("train", f"{'training step (B,S,dim,layers)':<34} {'shape':>22} {'ms':>8} {'tokens/s':>10} {'vs BF16':>8}",
          34, 22, train_numbers, label=lambda r: f"{r['model']} {r['name']}")
    fsdp = [r for r in rows if r["section"] == "fsdp"]
    for r in fsdp:
        if "error" in r:
            lines.append(f"fsdp {r['name']}: FAILED: {r['error']}")
        else:
            lines.append(f"fsdp {r['name']} on {r['devices']} devices: {r['sharded_s'] * 1e3:.2f} ms vs one device "
                         f"{r['one_device_s'] * 1e3:.2f} ms: {r['speedup']:.2f}x")
    lines += [f"note: {n}" for n in result.get("notes", [])]
    if result.get("quick"):
        lines.append("note: --quick (small shapes): a smoke test, not a measurement; targets are not judged")
    return "\n".join(lines)


def _linear_key(row: dict) -> str:
    """The prefix of a linear row's own numbers: ``mxfp4`` or ``fp8``."""
    return "mxfp4" if "mxfp4_s" in row else "fp8"


def plot(result: dict, path: str) -> str | None:
    """Bars per row: speed relative to plain XLA (kernels, block), cuDNN (attention) and bf16 (linear), and the
    fraction of the copy ceiling or matrix peak. None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [r for r in result["rows"] if "error" not in r and r["section"] != "fsdp"]
    labels, speed, speed_names, fraction, fraction_names = [], [], [], [], []
    for r in rows:
        shape = _fmt_shape(r["shape"])
        if r["section"] == "kernels":
            labels.append(f"{r['name']} {shape}")
            speed.append({"kernel": r["kernel_vs_xla"], "default": r["default_vs_xla"]})
            fraction.append({"kernel": r["kernel_fraction_of_copy"], "xla": r["xla_fraction_of_copy"]})
        elif r["section"] == "linear":
            labels.append(f"{r['name']} {shape}")
            key = _linear_key(r)
            speed.append({f"ours ({key.upper()})": 1 / r[f"{key}_over_bf16"]})
            fraction.append({f"ours ({key.upper()})": r[f"{key}_fraction_of_peak"],
                             "bf16 dot": r["bf16_fraction_of_peak"]})
        elif r["section"] == "attention":
            labels.append(f"attention {r['name']} {shape}")
            speed.append({k: v for k, v in (("vs cuDNN", r.get("cudnn_over_this")),
                                            ("vs XLA", r.get("xla_over_this"))) if v is not None})
            fraction.append({"ours": r["fraction_of_peak"]})
        elif r["section"] == "train":
            labels.append(f"train {r['model']} {r['name']} {shape}")
            speed.append({"vs BF16 step": r.get("bf16_over_this", 1.0)})
            fraction.append({"ours": r["fraction_of_peak"]})
        else:
            labels.append(f"block {r['name']} {shape}")
            speed.append({"vs plain JAX": r.get("plain_over_this", 1.0)})
            fraction.append({"ours": r["fraction_of_peak"]})
    if not rows:
        return None
    keys_speed = sorted({k for s in speed for k in s})
    keys_frac = sorted({k for f in fraction for k in f})
    height = max(4.0, 0.28 * len(rows) + 1.5)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(16, height), sharey=True)
    y = np.arange(len(rows))
    for axis, data, keys, title in ((ax1, speed, keys_speed, "speed relative to the reference (>1: ours faster)\n"
                                     "kernels: vs plain XLA; linear: vs bf16 jnp.dot; attention: vs cuDNN/XLA; "
                                     "train: vs the BF16 step"),
                                    (ax2, fraction, keys_frac, "fraction of the copy ceiling (kernels) or of the "
                                     "bf16 matmul rate (rest)")):
        width = 0.8 / max(len(keys), 1)
        for i, key in enumerate(keys):
            values = [d.get(key, np.nan) for d in data]
            axis.barh(y + (i - (len(keys) - 1) / 2) * width, values, height=width, label=key)
        axis.axvline(1.0, color="black", linewidth=0.8)
        axis.set_title(title, fontsize=9)
        axis.legend(fontsize=7, loc="lower right")
        axis.grid(axis="x", alpha=0.3)
    ax1.set_yticks(y)
    ax1.set_yticklabels(labels, fontsize=7)
    ax1.invert_yaxis()
    fig.suptitle(f"jax-aiter bench: {result['device']}, jax {result['jax']}, {result['date']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jax-aiter bench", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="jax-aiter-bench", help="directory for bench.json and bench.png")
    parser.add_argument("--quick", action="store_true", help="small shapes (a smoke test, not a measurement)")
    parser.add_argument("--batches", type=int, default=None, help="timed batches per case (default 7; 2 quick)")
    parser.add_argument("--only", nargs="*", choices=SECTIONS, help="sections to run (default: all)")
    args = parser.parse_args(argv)
    sections = args.only or list(SECTIONS)
    batches = args.batches or (2 if args.quick else 7)
    ctx = Context(quick=args.quick, batches=batches)
    device = jax.devices()[0]
    print(f"jax-aiter bench on {device.device_kind} ({device.platform}), jax {jax.__version__}; sections "
          f"{', '.join(sections)}", flush=True)
    copy_bw, matmul = copy_ceiling(ctx), matmul_rate(ctx)
    expected = {"kernels": len(kernel_cases(args.quick)),
                "linear": (4 if not args.quick else 2) + (jax.default_backend() != "cpu"),
                "attention": 14 if _cudnn_available() else 8, "block": 4 if _cudnn_available() else 3,
                "train": len(TRAIN_ARMS),
                "fsdp": 2 if len(jax.devices()) > 1 else 0}
    ctx.progress = Progress(sum(expected[s] for s in sections))
    runners = {"kernels": lambda: run_kernels(ctx, copy_bw), "linear": lambda: run_linear(ctx, matmul),
               "attention": lambda: run_attention(ctx, matmul), "block": lambda: run_block(ctx, matmul),
               "train": lambda: run_train(ctx, matmul),
               "fsdp": lambda: run_fsdp(ctx)}
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "bench.json")
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

    def write(complete: bool) -> dict:
        """The JSON file, rewritten after every row, so a run stopped early still leaves its numbers."""
        result = dict(date=date, device=device.device_kind, platform=device.platform,
                      device_count=len(jax.devices()), jax=jax.__version__,
                      commit=os.environ.get("JA_COMMIT", "unknown"), quick=args.quick, batches=batches,
                      complete=complete, sections=sections, copy_ceiling_tb_s=copy_bw / 1e12,
                      matmul_tflops=matmul / 1e12, selection=_selection(), rows=ctx.rows, notes=ctx.notes)
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
        return result

    ctx.on_row = lambda: write(complete=False)
    for section in sections:
        runners[section]()
    result = write(complete=True)
    print(summary(result), flush=True)
    print(f"wrote {json_path}")
    png = plot(result, os.path.join(args.out, "bench.png"))
    print(f"wrote {png}" if png else "no plot (matplotlib is not installed)")
    failed = [r for r in ctx.rows if "error" in r]
    return 1 if failed else 0


@functools.cache
def _selection() -> list[str]:
    """``jax_aiter.info()``'s lines for the platforms present: what each default above ran, and why."""
    import jax_aiter

    return jax_aiter.info().splitlines()


if __name__ == "__main__":
    sys.exit(main())
