"""Differentiation helpers shared by implementations whose kernels compute only a forward pass."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax


def kernel_forward_reference_backward(kernel: Callable[..., Any], reference: Callable[..., Any]) -> Callable[..., Any]:
    """A function that computes ``kernel(*arrays, **params)`` and whose VJP is JAX's autodiff of
    ``reference(*arrays, **params)`` at the saved inputs. ``params`` are static (hashable) keyword arguments.

    For kernels without a backward of their own: the gradient is the reference's, so it agrees with every other
    implementation's to rounding.
    """

    @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
    def op(params, *arrays):
        return kernel(*arrays, **dict(params))

    def forward(params, *arrays):
        return kernel(*arrays, **dict(params)), arrays

    def backward(params, arrays, cotangent):
        return jax.vjp(functools.partial(reference, **dict(params)), *arrays)[1](cotangent)

    op.defvjp(forward, backward)

    @functools.wraps(kernel)
    def call(*arrays, **params):
        return op(tuple(sorted(params.items())), *arrays)

    return call


def reverse_mode(reference: Callable[..., Any]) -> Callable[..., Any]:
    """``reference`` differentiated in reverse mode only (forward mode raises JAX's custom_vjp error), so an op
    behaves the same under every kind of differentiation whichever implementation runs."""
    return kernel_forward_reference_backward(reference, reference)
