"""jax_aiter.mha against a float64 numpy oracle written from the flash-attn definition (docs/attention.md).

The oracle loops over (batch, head) with plain numpy: logits = scale·q·kᵀ + bias − slope·|i + Sk − Sq − j|,
bottom-right-aligned window, softmax, dropout as a given keep mask, and the textbook softmax backward.
"""

import functools

import _oracle
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jax_aiter import _backend, use_backend
from jax_aiter.mha import (_cudnn, attention, flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                           flash_attn_varlen, flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                           flash_attn_varlen_qkvpacked_func)
from jax_aiter.mha._contract import FLASH_ATTN, FLASH_ATTN_VARLEN

# Float32 attention against the float64 oracle, for these N(0,1) inputs (D <= 16, Sk <= 16, |logit| <~ 10 with
# bias and ALiBi). Bounded term by term (each logit: the D-term dot, the scale, softcap, bias and ALiBi roundings;
# then the max subtraction, exp, the Sk-term row sum, the quotient and the Sk-term sum of w v), the worst case
# reaches 0.76 of this bound on out (0.88 with softcap on 4 q) and 0.32 on lse; realized errors stay near 1%.
F32_TOL = dict(rtol=2e-5, atol=2e-5)
# Two float32 evaluations of attention (chunked, packed, jitted, masked another way, summed in other orders):
# each within F32_TOL of the exact value, so within twice it of each other.
F32_PAIR_TOL = {name: 2 * value for name, value in F32_TOL.items()}


def rand(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# --- oracle ----------------------------------------------------------------------------------------------


def window_allowed(sq, sk, window):
    """[Sq, Sk]: which keys each query may see under a bottom-right-aligned window."""
    i = np.arange(sq)[:, None] + sk - sq
    j = np.arange(sk)[None, :]
    allowed = np.ones((sq, sk), bool)
    if window[0] >= 0:
        allowed &= j >= i - window[0]
    if window[1] >= 0:
        allowed &= j <= i + window[1]
    return allowed


def oracle(q, k, v, *, scale=None, window=(-1, -1), bias=None, alibi=None, keep=None, dropout_p=0.0, softcap=0.0):
    """Returns (out [B,Sq,Hq,Dv], lse [B,Hq,Sq], probs [B,Hq,Sq,Sk]) in float64."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    batch, sq, hq, dim = q.shape
    sk, hk, dv = k.shape[1], k.shape[2], v.shape[3]
    groups = hq // hk
    scale = dim ** -0.5 if scale is None else scale
    i = np.arange(sq)[:, None] + sk - sq
    j = np.arange(sk)[None, :]
    allowed = window_allowed(sq, sk, window)
    bias = np.zeros((1,)) if bias is None else np.asarray(bias, np.float64)
    bias = np.broadcast_to(bias, (batch, hq, sq, sk))
    alibi = np.zeros((hq,)) if alibi is None else np.asarray(alibi, np.float64)
    alibi = np.broadcast_to(alibi, (batch, hq))
    out = np.zeros((batch, sq, hq, dv))
    lse = np.full((batch, hq, sq), -np.inf)
    probs = np.zeros((batch, hq, sq, sk))
    for b in range(batch):
        for h in range(hq):
            s = scale * q[b, :, h] @ k[b, :, h // groups].T
            if softcap:
                s = softcap * np.tanh(s / softcap)
            s = s + bias[b, h] - alibi[b, h] * np.abs(i - j)
            s = np.where(allowed, s, -np.inf)
            for r in range(sq):
                if np.isneginf(s[r]).all():
                    continue
                m = s[r].max()
                e = np.exp(s[r] - m)
                lse[b, h, r] = m + np.log(e.sum())
                probs[b, h, r] = e / e.sum()
            w = probs[b, h] if keep is None else probs[b, h] * keep[b, h] / (1 - dropout_p)
            out[b, :, h] = w @ v[b, :, h // groups]
    return out, lse, probs


def oracle_grads(q, k, v, dout, probs, *, scale=None, dlse=None, keep=None, dropout_p=0.0):
    """(dq, dk, dv, dlogits [B,Hq,Sq,Sk]) of sum(out·dout) + sum(lse·dlse); dlogits is also dbias unreduced."""
    q, k, v, dout = (np.asarray(x, np.float64) for x in (q, k, v, dout))
    hq, hk = q.shape[2], k.shape[2]
    groups = hq // hk
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    dlogits = np.zeros_like(probs)
    for b in range(q.shape[0]):
        for h in range(hq):
            p = probs[b, h]
            drop = 1.0 if keep is None else keep[b, h] / (1 - dropout_p)
            dv[b, :, h // groups] += (p * drop).T @ dout[b, :, h]
            dp = (dout[b, :, h] @ v[b, :, h // groups].T) * drop
            ds = p * (dp - (dp * p).sum(axis=1, keepdims=True))
            if dlse is not None:
                ds += p * dlse[b, h][:, None]
            dq[b, :, h] = scale * ds @ k[b, :, h // groups]
            dk[b, :, h // groups] += scale * ds.T @ q[b, :, h]
            dlogits[b, h] = ds
    return dq, dk, dv, dlogits


def reduce_to(full, shape):
    """Sum a [B,Hq,Sq,Sk] gradient down to a bias shape that broadcasts to it."""
    padded = (1,) * (full.ndim - len(shape)) + tuple(shape)
    axes = tuple(a for a, n in enumerate(padded) if n == 1 and full.shape[a] != 1)
    return full.sum(axis=axes, keepdims=True).reshape(shape)


def oracle_varlen(q, k, v, cu_q, cu_k, **kw):
    """Per-sequence oracle on packed tensors: (out [Tq,Hq,Dv], lse [Hq,Tq])."""
    out = np.zeros((q.shape[0], q.shape[1], v.shape[2]))
    lse = np.full((q.shape[1], q.shape[0]), -np.inf)
    alibi = kw.pop("alibi", None)
    bias = kw.pop("bias", None)
    for b in range(len(cu_q) - 1):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if sq.stop == sq.start:
            continue
        extra = {}
        if alibi is not None:
            extra["alibi"] = np.broadcast_to(alibi, (len(cu_q) - 1, q.shape[1]))[b]
        if bias is not None:
            full = np.broadcast_to(bias, (q.shape[1], q.shape[0], k.shape[0]))
            extra["bias"] = full[None, :, sq, sk]
        o, l, _ = oracle(q[None, sq], k[None, sk], v[None, sk], **kw, **extra)
        out[sq], lse[:, sq] = o[0], l[0]
    return out, lse


def assert_lse_close(actual, expected, **tol):
    actual = np.asarray(actual, np.float64)
    np.testing.assert_array_equal(np.isneginf(actual), np.isneginf(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(actual[finite], expected[finite], **(tol or F32_TOL))


def qkv(batch=2, sq=6, sk=6, hq=4, hk=2, dim=8, dv=None, seed=0, dtype=np.float32):
    return (rand((batch, sq, hq, dim), seed, dtype), rand((batch, sk, hk, dim), seed + 1, dtype),
            rand((batch, sk, hk, dv or dim), seed + 2, dtype))


# --- forward ---------------------------------------------------------------------------------------------

# Each head layout meets each length relation across the tests below, without the full product.
HEADS_AND_LENGTHS = [pytest.param(4, 4, 6, 6, id="mha-sq=sk"), pytest.param(4, 1, 4, 9, id="mqa-sq<sk"),
                     pytest.param(4, 2, 9, 4, id="gqa-sq>sk")]
LENGTHS = [pytest.param(4, 9, id="sq<sk"), pytest.param(9, 4, id="sq>sk")]


@pytest.mark.parametrize("hq,hk,sq,sk", HEADS_AND_LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
def test_forward_and_lse_match_oracle(hq, hk, sq, sk, causal):
    q, k, v = qkv(sq=sq, sk=sk, hq=hq, hk=hk, dv=5)
    out, lse = flash_attn_func(q, k, v, causal=causal, return_lse=True)
    want, want_lse, _ = oracle(q, k, v, window=(-1, 0) if causal else (-1, -1))
    assert out.shape == (2, sq, hq, 5) and out.dtype == jnp.float32
    assert lse.shape == (2, hq, sq) and lse.dtype == jnp.float32
    np.testing.assert_allclose(out, want, **F32_TOL)
    assert_lse_close(lse, want_lse)


@pytest.mark.parametrize("window", [(2, 0), (1, 2), (-1, 1), (3, -1), (0, 0)])
@pytest.mark.parametrize("sq,sk", LENGTHS)
def test_window_bottom_right_alignment(window, sq, sk):
    q, k, v = qkv(sq=sq, sk=sk, seed=3)
    out, lse = flash_attn_func(q, k, v, window_size=window, return_lse=True)
    want, want_lse, _ = oracle(q, k, v, window=window)
    np.testing.assert_allclose(out, want, **F32_TOL)
    assert_lse_close(lse, want_lse)


def test_causal_with_left_window_equals_window_with_right_zero():
    q, k, v = qkv(sq=5, sk=8)
    np.testing.assert_array_equal(flash_attn_func(q, k, v, causal=True, window_size=(2, -1)),
                                  flash_attn_func(q, k, v, window_size=(2, 0)))


def test_fully_masked_rows_give_zero_output_and_minus_inf_lse():
    # Sq > Sk with causal: the first Sq - Sk queries sit before every key.
    q, k, v = qkv(sq=7, sk=3)
    out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    np.testing.assert_array_equal(out[:, :4], 0.0)
    assert np.isneginf(np.asarray(lse[:, :, :4])).all()
    assert np.isfinite(np.asarray(lse[:, :, 4:])).all()


def test_softmax_scale():
    q, k, v = qkv(seed=5)
    out, lse = flash_attn_func(q, k, v, softmax_scale=0.37, causal=True, return_lse=True)
    want, want_lse, _ = oracle(q, k, v, scale=0.37, window=(-1, 0))
    np.testing.assert_allclose(out, want, **F32_TOL)
    assert_lse_close(lse, want_lse)


@pytest.mark.parametrize("slopes_shape", [(4,), (2, 4)])
@pytest.mark.parametrize("sq,sk,causal", [(5, 8, False), (8, 5, True), (6, 6, True)])
def test_alibi(slopes_shape, sq, sk, causal):
    q, k, v = qkv(sq=sq, sk=sk, seed=7)
    slopes = np.abs(rand(slopes_shape, 8))
    out, lse = flash_attn_func(q, k, v, causal=causal, alibi_slopes=slopes, return_lse=True)
    want, want_lse, _ = oracle(q, k, v, window=(-1, 0) if causal else (-1, -1), alibi=slopes)
    np.testing.assert_allclose(out, want, **F32_TOL)
    assert_lse_close(lse, want_lse)


@pytest.mark.parametrize("bias_shape", [(5,), (4, 1), (1, 4, 4, 5), (2, 1, 1, 5), (4, 1, 1)])
def test_bias_broadcasting(bias_shape):
    q, k, v = qkv(sq=4, sk=5, seed=9)
    bias = rand(bias_shape, 10)
    out, lse = flash_attn_func(q, k, v, bias=bias, return_lse=True)
    want, want_lse, _ = oracle(q, k, v, bias=bias)
    np.testing.assert_allclose(out, want, **F32_TOL)
    assert_lse_close(lse, want_lse)


def test_minus_inf_bias_masks_like_a_window():
    q, k, v = qkv(sq=5, sk=5, seed=11)
    i, j = np.arange(5)[:, None], np.arange(5)[None, :]
    bias = np.where(j <= i, 0.0, -np.inf).astype(np.float32)
    np.testing.assert_allclose(flash_attn_func(q, k, v, bias=bias), flash_attn_func(q, k, v, causal=True),
                               **F32_PAIR_TOL)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision(dtype):
    q, k, v = (jnp.asarray(x, dtype) for x in qkv(sq=8, sk=8, hq=4, hk=2, dim=16, seed=12))
    bias = jnp.asarray(rand((4, 8, 8), 13), dtype)
    out, lse = flash_attn_func(q, k, v, causal=True, bias=bias, return_lse=True)
    assert out.dtype == dtype and lse.dtype == jnp.float32
    want, want_lse, _ = oracle(*(np.asarray(x, np.float64) for x in (q, k, v)), window=(-1, 0),
                               bias=np.asarray(bias, np.float64))
    # Float32 math on the rounded inputs (the oracle reads the same), rounded once to the dtype: half an ulp
    # (RTOL/2 for bf16, RTOL/4 for f16), and float32's F32_TOL-sized error is far inside the rms term.
    _oracle.assert_close(out, want, dtype, factor=0.5)
    # lse stays float32: as accurate as in the float32 tests.
    assert_lse_close(lse, want_lse)


# --- dropout ---------------------------------------------------------------------------------------------


def dropped_weights(key, p, *, batch=2, sq=6, sk=7, hq=4, hk=2, causal=False):
    """The attention weights after dropout, read out through a one-hot v (out[b, i, h, :] = weights[b, h, i])."""
    q, k, _ = qkv(batch=batch, sq=sq, sk=sk, hq=hq, hk=hk, seed=20)
    v = np.broadcast_to(np.eye(sk, dtype=np.float32)[None, :, None, :], (batch, sk, hk, sk))
    out = flash_attn_func(q, k, v, dropout_p=p, dropout_key=key, causal=causal)
    _, _, probs = oracle(q, k, v, window=(-1, 0) if causal else (-1, -1))
    return np.asarray(out, np.float64).transpose(0, 2, 1, 3), probs


def test_dropout_structure_matches_definition():
    p = 0.3
    weights, probs = dropped_weights(jax.random.key(1), p, sq=16, sk=16)
    support = probs > 0
    kept = weights != 0
    assert not (kept & ~support).any()
    # Every weight is dropped (0) or kept and scaled by 1/(1-p). The one-hot v reads each weight out exactly: its
    # float32 error is twice a logit's plus Sk + 2 roundings, <= ~140 units of 2^-24 here (rtol: 168 units).
    np.testing.assert_allclose(weights[kept], probs[kept] / (1 - p), rtol=1e-5, atol=1e-7)
    # 2048 Bernoulli(0.7) draws: the kept fraction's standard deviation is 0.010, and 0.05 is five of them.
    assert abs(kept[support].mean() - (1 - p)) < 0.05


def test_dropout_is_reproducible_and_key_dependent():
    key = jax.random.key(7)
    first, _ = dropped_weights(key, 0.5)
    again, _ = dropped_weights(key, 0.5)
    other, _ = dropped_weights(jax.random.key(8), 0.5)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first != 0, other != 0)


def test_raw_uint32_key_equals_typed_threefry_key():
    typed, _ = dropped_weights(jax.random.key(3), 0.4)
    raw, _ = dropped_weights(jax.random.PRNGKey(3), 0.4)
    np.testing.assert_array_equal(typed, raw)


def test_dropout_zero_equals_no_dropout():
    q, k, v = qkv(seed=21)
    np.testing.assert_array_equal(flash_attn_func(q, k, v, dropout_p=0.0, dropout_key=jax.random.key(0)),
                                  flash_attn_func(q, k, v))


def test_dropout_keeps_lse_and_expectation():
    q, k, v = qkv(sq=4, sk=6, seed=22)
    p = 0.25
    keys = jax.random.split(jax.random.key(0), 512)
    outs, lses = jax.vmap(lambda key: flash_attn_func(q, k, v, dropout_p=p, dropout_key=key,
                                                      return_lse=True))(keys)
    want, want_lse, _ = oracle(q, k, v)
    # lse is that of the undropped softmax, whatever the key.
    np.testing.assert_allclose(lses, np.broadcast_to(want_lse, lses.shape), **F32_TOL)
    # Inverted dropout is unbiased: the mean over keys approaches the undropped output, within five standard
    # errors of the 512-key mean plus the float32 error (F32_TOL) that even a never-dropped element carries.
    spread = np.asarray(outs).std(axis=0) / np.sqrt(len(keys))
    f32_error = F32_TOL["atol"] + F32_TOL["rtol"] * np.abs(want)
    assert (np.abs(np.asarray(outs).mean(axis=0) - want) <= 5 * spread + f32_error).all()


# --- varlen ----------------------------------------------------------------------------------------------

# Sequence 1 is empty on the q side, sequence 3 on the k side; q has one token past the last offset.
CU_Q = np.array([0, 3, 3, 8, 10], np.int32)
CU_K = np.array([0, 4, 6, 8, 8], np.int32)


def varlen_inputs(hq=4, hk=2, dim=8, dv=8, seed=30):
    return (rand((11, hq, dim), seed), rand((8, hk, dim), seed + 1), rand((8, hk, dv), seed + 2))


@pytest.mark.parametrize("hq,hk,window", [(4, 2, (-1, -1)), (4, 2, (1, 1)), (4, 2, (2, 0)), (4, 4, (-1, 0)),
                                          (4, 1, (-1, 0))])
def test_varlen_matches_oracle(hq, hk, window):
    q, k, v = varlen_inputs(hq, hk, dv=6)
    out, lse = flash_attn_varlen(q, k, v, CU_Q, CU_K, 5, 4, window_size=window, return_lse=True)
    want, want_lse = oracle_varlen(q, k, v, CU_Q, CU_K, window=window)
    assert out.shape == (11, hq, 6) and lse.shape == (hq, 11)
    np.testing.assert_allclose(out, want, **F32_TOL)
    assert_lse_close(lse, want_lse)
    # The token past cu_seqlens_q[-1] belongs to no sequence.
    np.testing.assert_array_equal(out[10], 0.0)


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=4),
       heads=st.sampled_from([(2, 2), (4, 1), (4, 2)]),
       window=st.tuples(st.integers(-1, 3), st.integers(-1, 3)),
       seed=st.integers(0, 2**16))
def test_varlen_random_packings_match_oracle(lengths, heads, window, seed):
    cu_q = np.concatenate([[0], np.cumsum([a for a, _ in lengths])]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum([b for _, b in lengths])]).astype(np.int32)
    hq, hk = heads
    q, k, v = rand((cu_q[-1], hq, 8), seed), rand((cu_k[-1], hk, 8), seed + 1), rand((cu_k[-1], hk, 8), seed + 2)
    out, lse = flash_attn_varlen(q, k, v, cu_q, cu_k, 6, 6, window_size=window, return_lse=True)
    want, want_lse = oracle_varlen(q, k, v, cu_q, cu_k, window=window)
    np.testing.assert_allclose(out, want, **F32_TOL)
    assert_lse_close(lse, want_lse)


def test_varlen_equals_per_sequence_calls():
    q, k, v = varlen_inputs()
    slopes = np.abs(rand((4, 4), 31))
    out, lse = flash_attn_varlen(q, k, v, CU_Q, CU_K, 5, 4, causal=True, alibi_slopes=slopes, return_lse=True)
    for b in range(4):
        sq, sk = slice(CU_Q[b], CU_Q[b + 1]), slice(CU_K[b], CU_K[b + 1])
        if sq.stop == sq.start:
            continue
        one, one_lse = flash_attn_func(q[None, sq], k[None, sk], v[None, sk], causal=True,
                                       alibi_slopes=slopes[b:b + 1], return_lse=True)
        # The same float32 formulas (the packed row holds the other sequences' keys as exact zeros), which may sum
        # in other orders (they differ by ~1 unit of 2^-24 today).
        np.testing.assert_allclose(out[sq], one[0], **F32_PAIR_TOL)
        assert_lse_close(lse[:, sq], np.asarray(one_lse[0], np.float64), **F32_PAIR_TOL)


@pytest.mark.parametrize("bias_shape", [(11, 8), (4, 1, 8), (4, 11, 8)])
def test_varlen_bias_in_packed_coordinates(bias_shape):
    q, k, v = varlen_inputs()
    bias = rand(bias_shape, 32)
    out, lse = flash_attn_varlen(q, k, v, CU_Q, CU_K, 5, 4, bias=bias, return_lse=True)
    want, want_lse = oracle_varlen(q, k, v, CU_Q, CU_K, bias=bias)
    np.testing.assert_allclose(out, want, **F32_TOL)
    assert_lse_close(lse, want_lse)


def test_varlen_dropout_reproducible():
    q, k, v = varlen_inputs()
    run = functools.partial(flash_attn_varlen, q, k, v, CU_Q, CU_K, 5, 4, dropout_p=0.5)
    first = run(dropout_key=jax.random.key(1))
    np.testing.assert_array_equal(first, run(dropout_key=jax.random.key(1)))
    assert not np.array_equal(first, run(dropout_key=jax.random.key(2)))


def test_varlen_jit_with_traced_offsets():
    q, k, v = varlen_inputs()
    fn = jax.jit(lambda q, k, v, cu_q, cu_k: flash_attn_varlen(q, k, v, cu_q, cu_k, 5, 4, causal=True))
    want, _ = oracle_varlen(q, k, v, CU_Q, CU_K, window=(-1, 0))
    np.testing.assert_allclose(fn(q, k, v, jnp.asarray(CU_Q), jnp.asarray(CU_K)), want, **F32_TOL)


def test_varlen_vmap():
    batch = [varlen_inputs(seed=s) for s in (40, 43)]
    stacked = [np.stack(parts) for parts in zip(*batch)]
    outs = jax.vmap(lambda q, k, v: flash_attn_varlen(q, k, v, CU_Q, CU_K, 5, 4, causal=True))(*stacked)
    for out, (q, k, v) in zip(outs, batch):
        np.testing.assert_allclose(out, oracle_varlen(q, k, v, CU_Q, CU_K, window=(-1, 0))[0], **F32_TOL)


# --- gradients -------------------------------------------------------------------------------------------

# Float32 gradients against the float64 oracle: F32_TOL's logit and weight errors carried through the backward,
# where dp adds a Dv-term dot and ds = p (dp - sum_k p_k dp_k) cancels, so its error scales with |dp| (~3), not
# |ds|, before dq, dk and dbias sum Sk or Sq of them: ~5x on the relative term. Small gradients sum few small
# terms (atol). Realized errors stay within 4% of it; an estimate, not bounded term by term like F32_TOL.
GRAD_TOL = dict(rtol=1e-4, atol=1e-5)
GRAD_PAIR_TOL = {name: 2 * value for name, value in GRAD_TOL.items()}  # two float32 gradients, as F32_PAIR_TOL


@pytest.mark.parametrize("hq,hk,with_lse", [(4, 4, False), (4, 1, True), (4, 2, True)])
def test_gradients_match_oracle(hq, hk, with_lse):
    # Sq > Sk and causal: some rows are fully masked and must get zero gradient (not NaN).
    q, k, v = qkv(sq=7, sk=5, hq=hq, hk=hk, dv=6, seed=50)
    bias = rand((hq, 1, 5), 51)
    dout = rand((2, 7, hq, 6), 52)
    dlse = rand((2, hq, 7), 53)
    slopes = np.abs(rand((hq,), 54))

    def loss(q, k, v, bias):
        out, lse = flash_attn_func(q, k, v, causal=True, bias=bias, alibi_slopes=slopes, return_lse=True)
        total = jnp.sum(out * dout)
        if with_lse:
            total += jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0) * dlse)
        return total

    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, bias)
    _, _, probs = oracle(q, k, v, window=(-1, 0), bias=bias, alibi=slopes)
    dq, dk, dv, dlogits = oracle_grads(q, k, v, dout, probs, dlse=dlse if with_lse else None)
    for got, want in zip(grads, (dq, dk, dv, reduce_to(dlogits, bias.shape))):
        assert np.isfinite(np.asarray(got)).all()
        np.testing.assert_allclose(got, want, **GRAD_TOL)


@pytest.mark.parametrize("bias_shape", [(2, 4, 4, 6), (4, 6), ()])
def test_bias_gradient_reduces_to_bias_shape(bias_shape):
    q, k, v = qkv(sq=4, sk=6, seed=55)
    bias = rand(bias_shape, 56)
    dout = rand((2, 4, 4, 8), 57)
    dbias = jax.grad(lambda b: jnp.sum(flash_attn_func(q, k, v, bias=b) * dout))(bias)
    _, _, probs = oracle(q, k, v, bias=bias)
    assert dbias.shape == bias_shape
    np.testing.assert_allclose(dbias, reduce_to(oracle_grads(q, k, v, dout, probs)[3], bias_shape), **GRAD_TOL)


def test_dropout_gradients_match_oracle_with_the_same_mask():
    p, key = 0.3, jax.random.key(11)
    weights, _ = dropped_weights(key, p, causal=True)
    keep = (weights != 0).astype(np.float64)
    q, k, _ = qkv(sq=6, sk=7, seed=20)
    v = rand((2, 7, 2, 7), 60)  # the one-hot readout's shapes, so the same key draws the same mask
    dout = rand((2, 6, 4, 7), 61)
    grads = jax.grad(lambda q, k, v: jnp.sum(flash_attn_func(q, k, v, dropout_p=p, dropout_key=key, causal=True)
                                             * dout), argnums=(0, 1, 2))(q, k, v)
    _, _, probs = oracle(q, k, v, window=(-1, 0))
    want = oracle_grads(q, k, v, dout, probs, keep=keep, dropout_p=p)[:3]
    for got, expected in zip(grads, want):
        np.testing.assert_allclose(got, expected, **GRAD_TOL)


def test_varlen_gradients_match_oracle():
    q, k, v = varlen_inputs(seed=62)
    dout = rand((11, 4, 8), 63)
    grads = jax.grad(lambda q, k, v: jnp.sum(flash_attn_varlen(q, k, v, CU_Q, CU_K, 5, 4, causal=True) * dout),
                     argnums=(0, 1, 2))(q, k, v)
    want = [np.zeros(x.shape) for x in (q, k, v)]
    for b in range(4):
        sq, sk = slice(CU_Q[b], CU_Q[b + 1]), slice(CU_K[b], CU_K[b + 1])
        if sq.stop == sq.start:
            continue
        _, _, probs = oracle(q[None, sq], k[None, sk], v[None, sk], window=(-1, 0))
        dq, dk, dv, _ = oracle_grads(q[None, sq], k[None, sk], v[None, sk], dout[None, sq], probs)
        want[0][sq], want[1][sk], want[2][sk] = dq[0], dk[0], dv[0]
    for got, expected in zip(grads, want):
        np.testing.assert_allclose(got, expected, **GRAD_TOL)


def test_alibi_slopes_get_no_gradient():
    q, k, v = qkv(seed=64)
    slopes = np.abs(rand((4,), 65))
    dslopes = jax.grad(lambda s: jnp.sum(flash_attn_func(q, k, v, alibi_slopes=s)))(slopes)
    np.testing.assert_array_equal(dslopes, 0.0)


# --- transformations -------------------------------------------------------------------------------------


def test_jit_matches_eager():
    q, k, v = qkv(sq=5, sk=7, seed=70)
    bias = rand((4, 5, 7), 71)
    fn = functools.partial(flash_attn_func, causal=True, return_lse=True)
    eager = fn(q, k, v, bias=bias)
    jitted = jax.jit(lambda q, k, v, b: fn(q, k, v, bias=b))(q, k, v, bias)
    # One float32 program each, fused differently at most: their sums may run in other orders.
    for a, b in zip(eager, jitted):
        np.testing.assert_allclose(a, b, **F32_PAIR_TOL)


def test_vmap_over_an_extra_axis():
    inputs = [qkv(sq=5, sk=6, seed=s) for s in (72, 75, 78)]
    stacked = [np.stack(parts) for parts in zip(*inputs)]
    outs = jax.vmap(lambda q, k, v: flash_attn_func(q, k, v, causal=True))(*stacked)
    for out, (q, k, v) in zip(outs, inputs):
        np.testing.assert_allclose(out, oracle(q, k, v, window=(-1, 0))[0], **F32_TOL)


def test_grad_of_jit_of_vmap():
    inputs = [qkv(sq=4, sk=4, hq=2, hk=1, seed=s) for s in (80, 83)]
    q, k, v = (np.stack(parts) for parts in zip(*inputs))
    fn = jax.jit(jax.grad(lambda q: jnp.sum(jax.vmap(lambda q, k, v: flash_attn_func(q, k, v, causal=True))(
        q, k, v) ** 2)))
    got = fn(q)
    for n, (qi, ki, vi) in enumerate(inputs):
        out, _, probs = oracle(qi, ki, vi, window=(-1, 0))
        np.testing.assert_allclose(got[n], oracle_grads(qi, ki, vi, 2 * out, probs)[0], **GRAD_TOL)


# --- bad input -------------------------------------------------------------------------------------------

Q, K, V = qkv(batch=1, sq=4, sk=4, hq=4, hk=2)
QV, KV, VV = varlen_inputs()
GOOD_CU = np.array([0, 3, 3, 8, 10], np.int32)


def dense(**kw):
    args = {"q": Q, "k": K, "v": V, **kw}
    return lambda: flash_attn_func(**args)


def varlen(**kw):
    args = {"q": QV, "k": KV, "v": VV, "cu_seqlens_q": GOOD_CU, "cu_seqlens_k": CU_K, "max_seqlen_q": 5,
            "max_seqlen_k": 4, **kw}
    return lambda: flash_attn_varlen(**args)


def traced(fn_of_value, value):
    """Call with ``value`` traced under jit, so the check sees a tracer."""
    return lambda: jax.jit(fn_of_value)(value)


BAD_INPUTS = [
    ("q rank", dense(q=Q[0]), ValueError, "q must have rank 4"),
    ("k rank", dense(k=K[0]), ValueError, "k must have rank 4"),
    ("q not an array", dense(q=Q.tolist()), TypeError, "q must be an array"),
    ("q int dtype", dense(q=Q.astype(np.int32)), TypeError, "q must have dtype"),
    ("v dtype differs", dense(v=V.astype(np.float16)), TypeError, "v must have the dtype of q"),
    ("batch mismatch", dense(k=np.concatenate([K, K]), v=np.concatenate([V, V])), ValueError, "k must have q's batch"),
    ("v length", dense(v=V[:, :3]), ValueError, "v must have k's leading"),
    ("v heads", dense(v=V[:, :, :1]), ValueError, "v must have k's number of heads"),
    ("head dim", dense(k=K[..., :4]), ValueError, "k must have q's head dimension"),
    ("Hq % Hk", dense(k=rand((1, 4, 3, 8), 0), v=rand((1, 4, 3, 8), 0)), ValueError, "multiple of k's"),
    ("head dim 0", dense(q=Q[..., :0], k=K[..., :0]), ValueError, "head dimension must be at least 1"),
    ("window not a pair", dense(window_size=(1,)), ValueError, "window_size must be a pair"),
    ("window float", dense(window_size=(1.5, 0)), TypeError, "window_size must be a static Python int"),
    ("causal not bool", dense(causal=1), TypeError, "causal must be a Python bool"),
    ("return_lse traced", traced(lambda f: flash_attn_func(Q, K, V, return_lse=f), True), TypeError, "return_lse"),
    ("deterministic not bool", dense(deterministic="yes"), TypeError, "deterministic must be a Python bool"),
    ("dropout_p >= 1", dense(dropout_p=1.0, dropout_key=jax.random.key(0)), ValueError, r"dropout_p must be in"),
    ("dropout_p < 0", dense(dropout_p=-0.1), ValueError, r"dropout_p must be in"),
    ("dropout_p traced", traced(lambda p: flash_attn_func(Q, K, V, dropout_p=p), 0.1), TypeError, "dropout_p"),
    ("dropout without key", dense(dropout_p=0.1), ValueError, "dropout_key is required"),
    ("dropout key dtype", dense(dropout_p=0.1, dropout_key=np.zeros(2, np.float32)), TypeError, "dropout_key"),
    ("dropout key batch", dense(dropout_p=0.1, dropout_key=jax.random.split(jax.random.key(0))), ValueError,
     "dropout_key must be a single key"),
    ("softmax_scale negative", dense(softmax_scale=-1.0), ValueError, "softmax_scale"),
    ("softmax_scale array", dense(softmax_scale=np.ones(2)), TypeError, "softmax_scale"),
    ("bias shape", dense(bias=rand((4, 3), 0)), ValueError, "bias of shape"),
    ("bias rank 5", dense(bias=rand((1, 1, 4, 4, 4), 0)), ValueError, "bias of shape"),
    ("bias dtype", dense(bias=np.zeros((4, 4), np.int32)), TypeError, "bias must have dtype"),
    ("alibi shape", dense(alibi_slopes=np.ones(3, np.float32)), ValueError, "alibi_slopes must have shape"),
    ("alibi dtype", dense(alibi_slopes=np.ones(4, np.float16)), TypeError, "alibi_slopes must have dtype"),
    ("varlen q rank", varlen(q=QV[None]), ValueError, "q must have rank 3"),
    ("varlen token mismatch", varlen(v=VV[:7]), ValueError, "v must have k's leading"),
    ("cu dtype", varlen(cu_seqlens_q=GOOD_CU.astype(np.int64)), TypeError, "cu_seqlens_q must have dtype"),
    ("cu rank", varlen(cu_seqlens_k=CU_K[None]), ValueError, "cu_seqlens_k must have rank 1"),
    ("cu too short", varlen(cu_seqlens_q=GOOD_CU[:1], cu_seqlens_k=CU_K[:1]), ValueError, "B\\+1 >= 2"),
    ("cu lengths differ", varlen(cu_seqlens_k=CU_K[:4]), ValueError, "cu_seqlens_k must have cu_seqlens_q's shape"),
    ("cu unsorted", varlen(cu_seqlens_q=np.array([0, 3, 2, 8, 10], np.int32)), ValueError, "sorted"),
    ("cu not from 0", varlen(cu_seqlens_k=np.array([1, 4, 6, 8, 8], np.int32)), ValueError, "must start at 0"),
    ("cu past tokens", varlen(cu_seqlens_k=np.array([0, 4, 6, 8, 9], np.int32)), ValueError, "past the 8"),
    ("max_seqlen too small", varlen(max_seqlen_q=4), ValueError, "max_seqlen_q=4 is shorter"),
    ("max_seqlen negative", varlen(max_seqlen_k=-1), ValueError, "max_seqlen_k must be >= 0"),
    ("max_seqlen float", varlen(max_seqlen_k=4.0), TypeError, "max_seqlen_k must be a static Python int"),
    ("max_seqlen traced", traced(lambda m: flash_attn_varlen(QV, KV, VV, GOOD_CU, CU_K, m, 4), 5), TypeError,
     "max_seqlen_q must be a static Python int"),
    ("varlen bias shape", varlen(bias=rand((4, 11, 7), 0)), ValueError, r"\[Hq, Tq, Tk\]"),
    ("varlen alibi shape", varlen(alibi_slopes=np.ones((5, 4), np.float32)), ValueError, "alibi_slopes"),
    ("varlen Hq % Hk", varlen(k=rand((8, 3, 8), 0), v=rand((8, 3, 8), 0)), ValueError, "multiple of k's"),
]


@pytest.mark.parametrize("call,error,match", [pytest.param(*case[1:], id=case[0]) for case in BAD_INPUTS])
def test_bad_input_raises_before_tracing(call, error, match, monkeypatch):
    def no_dispatch(*args, **kwargs):
        raise AssertionError("reached dispatch with a bad argument")

    monkeypatch.setattr(_backend, "dispatch", no_dispatch)
    with pytest.raises(error, match=match):
        call()


# --- backend selection -----------------------------------------------------------------------------------


def test_reference_serves_cpu_and_rocm():
    operands, params = attention.flash_attn_call(Q, K, V, dropout_p=0.0, softmax_scale=None, causal=True,
                                                 window_size=(-1, -1), bias=None, alibi_slopes=None,
                                                 deterministic=True, return_lse=False, dropout_key=None)
    for platform in ("cpu", "rocm"):
        assert _backend.select(FLASH_ATTN, platform, operands, params).name == "xla"
    assert {"cudnn", "xla"} <= {i.name for i in _backend.implementations(FLASH_ATTN_VARLEN)}


def test_forced_xla_backend_runs():
    q, k, v = qkv(seed=90)
    with use_backend(flash_attn="xla"):
        out = flash_attn_func(q, k, v, causal=True)
    np.testing.assert_allclose(out, oracle(q, k, v, window=(-1, 0))[0], **F32_TOL)


@pytest.fixture
def cudnn_present(monkeypatch):
    """Pretend cuDNN is traceable on a Hopper GPU, to test the supports checks anywhere."""
    monkeypatch.setattr(_cudnn, "_availability_problem", lambda: None)
    monkeypatch.setattr(_cudnn, "_max_head_dim", lambda: 256)
    monkeypatch.delenv("XLA_FLAGS", raising=False)


def cudnn_reason(q_shape=(2, 8, 4, 64), k_shape=(2, 8, 2, 64), dtype=jnp.bfloat16, **kw):
    q = jnp.zeros(q_shape, dtype)
    kv = jnp.zeros(k_shape, dtype)
    options = dict(dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), bias=None,
                   alibi_slopes=None, deterministic=False, return_lse=False, dropout_key=None)
    operands, params = attention.flash_attn_call(q, kv, kv, **{**options, **kw})
    return _cudnn.supports_flash_attn(*operands, **params)


@pytest.mark.parametrize("kw,fragment", [
    ({}, None),
    ({"causal": True}, None),
    ({"causal": True, "window_size": (16, -1)}, None),
    ({"bias": jnp.zeros((4, 8, 8), jnp.bfloat16)}, None),
    ({"dtype": jnp.float32}, "bfloat16/float16"),
    ({"q_shape": (2, 8, 4, 60), "k_shape": (2, 8, 2, 60)}, "multiple of 8"),
    ({"q_shape": (2, 8, 4, 288), "k_shape": (2, 8, 2, 288)}, "<= 256"),
    ({"alibi_slopes": jnp.zeros((4,), jnp.float32)}, "ALiBi"),
    ({"dropout_p": 0.1, "dropout_key": jax.random.key(0)}, "dropout"),
    ({"return_lse": True}, "lse"),
    ({"deterministic": True}, "deterministic"),
    ({"causal": True, "k_shape": (2, 10, 2, 64)}, "Sq != Sk"),
    ({"window_size": (2, 2)}, "right window"),
    ({"window_size": (2, -1)}, "left-only"),
    ({"bias": jnp.zeros((8, 8), jnp.float32)}, "bias in q's dtype"),
    ({"bias": jnp.zeros((2, 1, 8, 8), jnp.bfloat16)}, "batch dimension"),
    ({"bias": jnp.zeros((7, 7), jnp.bfloat16), "q_shape": (2, 7, 4, 64), "k_shape": (2, 7, 2, 64)},
     "even"),
])
def test_cudnn_supports(cudnn_present, kw, fragment):
    reason = cudnn_reason(**kw)
    if fragment is None:
        assert reason is None
    else:
        assert fragment in reason


def test_cudnn_deterministic_with_xla_determinism_flag(cudnn_present, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                                    "--xla_gpu_exclude_nondeterministic_ops=true")
    assert cudnn_reason(deterministic=True) is None


@pytest.mark.usefixtures("automatic_selection")
def test_default_is_not_deterministic_and_takes_cudnn(cudnn_present):
    """flash-attn's default, deterministic=False: a call cuDNN supports goes to cuDNN with default arguments;
    deterministic=True without XLA's determinism flag takes the reference (docs/attention.md, "Determinism")."""
    import inspect

    for fn in (flash_attn_func, flash_attn_varlen):
        assert inspect.signature(fn).parameters["deterministic"].default is False
    q, kv = jnp.zeros((2, 8, 4, 64), jnp.bfloat16), jnp.zeros((2, 8, 2, 64), jnp.bfloat16)
    for deterministic, expected in ((False, "cudnn"), (True, "xla")):
        operands, params = attention.flash_attn_call(
            q, kv, kv, dropout_p=0.0, softmax_scale=None, causal=True, window_size=(-1, -1), bias=None,
            alibi_slopes=None, deterministic=deterministic, return_lse=False, dropout_key=None)
        assert _backend.select(FLASH_ATTN, "cuda", operands, params).name == expected


def test_cudnn_varlen_supports(cudnn_present):
    q = jnp.zeros((32, 4, 64), jnp.bfloat16)
    kv = jnp.zeros((32, 2, 64), jnp.bfloat16)
    cu, other = (jnp.asarray([0, 16, 32], jnp.int32) for _ in range(2))
    options = dict(dropout_p=0.0, softmax_scale=None, window_size=(-1, -1), bias=None, alibi_slopes=None,
                   deterministic=False, return_lse=False, dropout_key=None)

    def reason(cu_k, causal, **kw):
        operands, params = attention.flash_attn_varlen_call(q, kv, kv, cu, cu_k, 16, 16, causal=causal,
                                                            **{**options, **kw})
        return _cudnn.supports_flash_attn_varlen(*operands, **params)

    assert reason(other, False) is None
    assert reason(cu, True) is None
    assert "cu_seqlens_k to be cu_seqlens_q" in reason(other, True)
    assert "full or causal" in reason(cu, True, window_size=(4, -1))
    assert "packed coordinates" in reason(other, False, bias=jnp.zeros((32, 32), jnp.bfloat16))


def test_cudnn_unavailable_here_is_reported():
    if "cuda" in _backend.present_platforms():
        pytest.skip("cuDNN is available on this machine")
    assert "unavailable" in cudnn_reason()
    with use_backend(flash_attn="cudnn"), pytest.raises(ValueError, match="forced implementation 'cudnn'"):
        flash_attn_func(*qkv(), deterministic=False)


@pytest.fixture
def cudnn_emulated_by_jax_xla(monkeypatch):
    """Route the cuDNN adapter's jax.nn call to jax.nn's own xla path, which has cuDNN's mask semantics
    (top-left causal, padding by sequence lengths), so the adapter's padding and mask mapping run on a CPU."""
    real = jax.nn.dot_product_attention

    def emulated(*args, implementation, **kwargs):
        assert implementation == "cudnn"
        return real(*args, implementation="xla", **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", emulated)


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (2, 0)])
def test_cudnn_adapter_semantics(cudnn_emulated_by_jax_xla, window):
    q, k, v = qkv(sq=6, sk=6, seed=95)
    bias = rand((6, 6), 96)
    operands, params = attention.flash_attn_call(q, k, v, dropout_p=0.0, softmax_scale=0.3, causal=False,
                                                 window_size=window, bias=bias, alibi_slopes=None,
                                                 deterministic=False, return_lse=False, dropout_key=None)
    assert_adapter_matches_reference(_cudnn.flash_attn, attention._xla_flash_attn, operands, params, n_grads=4)


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0)])
def test_cudnn_varlen_adapter_semantics(cudnn_emulated_by_jax_xla, window):
    cu = np.array([0, 3, 3, 8, 10], np.int32)
    q, k, v = rand((11, 4, 8), 97), rand((11, 2, 8), 98), rand((11, 2, 8), 99)
    # The full-attention offsets include a sequence with queries but no keys.
    cu_k = cu if window != (-1, -1) else np.array([0, 4, 4, 11, 11], np.int32)
    operands, params = attention.flash_attn_varlen_call(
        q, k, v, cu, cu_k, 7, 7, dropout_p=0.0, softmax_scale=None, causal=False, window_size=window, bias=None,
        alibi_slopes=None, deterministic=False, return_lse=False, dropout_key=None)
    np.testing.assert_allclose(_cudnn.flash_attn_varlen(*operands, **params),
                               oracle_varlen(q, k, v, cu, cu_k, window=window)[0], **F32_TOL)
    assert_adapter_matches_reference(_cudnn.flash_attn_varlen, attention._xla_flash_attn_varlen, operands, params,
                                     n_grads=3)


def assert_adapter_matches_reference(adapter, reference, operands, params, *, n_grads):
    """Outputs and gradients (w.r.t. the first n_grads operands) of an adapter equal the reference's."""
    dout = rand(reference(*operands, **params).shape, 200)

    def value_and_grads(fn):
        loss = lambda *xs: jnp.sum(fn(*xs, *operands[n_grads:], **params) * dout)
        return jax.jit(jax.value_and_grad(loss, argnums=tuple(range(n_grads))))(*operands[:n_grads])

    (got, got_grads), (want, want_grads) = value_and_grads(adapter), value_and_grads(reference)
    np.testing.assert_allclose(got, want, **F32_PAIR_TOL)
    for g, w in zip(got_grads, want_grads):
        assert np.isfinite(np.asarray(g)).all()
        np.testing.assert_allclose(g, w, **GRAD_PAIR_TOL)


# --- GPU: cuDNN against the reference ----------------------------------------------------------------------

CUDNN_CASES = [
    pytest.param(dict(causal=True), id="causal"),
    pytest.param(dict(), id="full"),
    pytest.param(dict(causal=True, window_size=(16, -1)), id="causal-left16"),
    pytest.param(dict(bias="seq"), id="bias[Sq,Sk]"),
]


def _cuda_or_skip():
    if "cuda" not in _backend.present_platforms():
        pytest.skip("cuDNN tests need an NVIDIA GPU")


def _assert_close_bf16(got, want):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    # cuDNN rounds P (and in the backward dP, dS) to bf16 where the reference keeps float32, and both round their
    # results once: a few bf16 units (2^-8) of the largest value; 2e-2 is five of them.
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-2 * scale)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CUDNN_CASES)
def test_cudnn_matches_reference_on_cuda(case):
    _cuda_or_skip()
    case = dict(case)
    q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in qkv(batch=2, sq=128, sk=128, hq=8, hk=2, dim=64, seed=100))
    bias = jnp.asarray(rand((128, 128), 101), jnp.bfloat16) if case.pop("bias", None) else None
    options = {**dict(dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None,
                      deterministic=False, return_lse=False, dropout_key=None), **case}
    operands, params = attention.flash_attn_call(q, k, v, bias=bias, **options)
    assert _backend.select(FLASH_ATTN, "cuda", operands, params).name == "cudnn"

    def loss(q, k, v, bias):
        out = flash_attn_func(q, k, v, bias=bias, **options)
        return jnp.sum(out.astype(jnp.float32) ** 2), out

    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3) if bias is not None else (0, 1, 2), has_aux=True))
    assert "__cudnn$fmha" in fn.lower(q, k, v, bias).as_text()
    (_, out), grads = fn(q, k, v, bias)
    with use_backend(flash_attn="xla"):
        (_, want_out), want_grads = jax.jit(jax.value_and_grad(
            loss, argnums=(0, 1, 2, 3) if bias is not None else (0, 1, 2), has_aux=True))(q, k, v, bias)
    _assert_close_bf16(out, want_out)
    for got, want in zip(grads, want_grads):
        _assert_close_bf16(got, want)


def test_cudnn_packed_layout_needs_jax_s_private_module_with_its_arguments(monkeypatch):
    """The packed varlen path reads jax's private cuDNN module; a jax without it, or with other argument
    names, leaves varlen on the padded path (with a reason) instead of failing at trace time."""
    class Renamed:
        MaskType = _cudnn._private_cudnn.MaskType

        @staticmethod
        def dot_product_attention(query, key, value, q_seqlen=None, kv_seqlen=None, scale=1.0, mask_type=None):
            raise AssertionError("not called")

    for module in (None, Renamed):
        monkeypatch.setattr(_cudnn, "_private_cudnn", module)
        _cudnn._packed_layout_problem.cache_clear()
        assert "no packed cuDNN attention" in _cudnn._packed_layout_problem()
    monkeypatch.undo()
    _cudnn._packed_layout_problem.cache_clear()
    if "cuda" not in _backend.present_platforms():
        assert _cudnn._packed_layout_problem() == "no CUDA device"


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_cudnn_varlen_matches_reference_on_cuda(causal, layout, monkeypatch):
    """Tokens after the last offset (q and k), and a sequence without keys: outputs and gradients there are 0,
    as the reference's, on the packed layout (Hopper on) and on the padded one (older GPUs)."""
    _cuda_or_skip()
    if layout == "padded":
        monkeypatch.setattr(_cudnn, "_packed_layout_problem", lambda: "padded layout under test")
    cu_q = jnp.asarray([0, 40, 104, 128], jnp.int32)
    cu_k = cu_q if causal else jnp.asarray([0, 64, 64, 100], jnp.int32)
    q = jnp.asarray(rand((130, 8, 64), 110), jnp.bfloat16)
    k, v = (jnp.asarray(rand((110 if not causal else 130, 2, 64), s), jnp.bfloat16) for s in (111, 112))
    options = dict(dropout_p=0.0, softmax_scale=None, causal=causal, window_size=(-1, -1), bias=None,
                   alibi_slopes=None, deterministic=False, return_lse=False, dropout_key=None)
    operands, params = attention.flash_attn_varlen_call(q, k, v, cu_q, cu_k, 64, 64, **options)
    assert _backend.select(FLASH_ATTN_VARLEN, "cuda", operands, params).name == "cudnn"

    def loss(q, k, v):
        out = flash_attn_varlen(q, k, v, cu_q, cu_k, 64, 64, **options)
        return jnp.sum(out.astype(jnp.float32) ** 2), out

    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
    assert "__cudnn$fmha" in fn.lower(q, k, v).as_text()
    capability = tuple(int(p) for p in jax.devices("cuda")[0].compute_capability.split("."))
    if layout == "packed":
        assert (_cudnn._packed_layout_problem() is None) == (capability >= (9, 0))
    (_, out), grads = fn(q, k, v)
    with use_backend(flash_attn_varlen="xla"):
        (_, want_out), want_grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    _assert_close_bf16(out, want_out)
    for got, want in zip(grads, want_grads):
        _assert_close_bf16(got, want)


# --- masked means absent: non-finite keys and values a query may not see ---------------------------------------

def _loss_and_grads(fn, q, k, v, rows):
    """Output, and gradients of the sum over the query rows ``rows`` (a slice of the token axis)."""
    def loss(q, k, v):
        return jnp.sum(fn(q, k, v)[rows].astype(jnp.float32))
    return np.asarray(fn(q, k, v)), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)


POISONS = [pytest.param(np.nan, "v", id="nan-value"), pytest.param(np.inf, "k", id="inf-key"),
           pytest.param(-np.inf, "v", id="minus-inf-value"), pytest.param(np.nan, "k", id="nan-key")]


def _poisoned(k, v, where, value, index):
    k, v = np.array(k), np.array(v)
    (k if where == "k" else v)[index] = value
    return k, v


@pytest.mark.parametrize("value, where", POISONS)
def test_causal_future_non_finite_does_not_reach_earlier_queries(value, where):
    """Key/value 3 of a causal call: queries 0..2 may not see it; their outputs and the gradients of a loss on
    them equal the clean call's, and queries 3.. see it (NaN or Inf output). The poisoned key's own gradient is
    left out: queries 3.. attend to it, and their (zero) cotangents times its non-finite weights are NaN, as in
    any kernel."""
    q, k, v = qkv(batch=1, sq=6, sk=6, seed=300)
    k_bad, v_bad = _poisoned(k, v, where, value, (0, 3))
    call = functools.partial(flash_attn_func, causal=True)
    rows = (slice(None), slice(0, 3))
    clean_out, clean_grads = _loss_and_grads(lambda *a: call(*a), q, k, v, rows)
    out, grads = _loss_and_grads(lambda *a: call(*a), q, k_bad, v_bad, rows)
    np.testing.assert_array_equal(out[:, :3], clean_out[:, :3])
    assert not np.isfinite(out[:, 3:]).all(axis=-1).any()
    _assert_grads_equal_except_at(grads, clean_grads, key_index=(0, 3))


def _assert_grads_equal_except_at(grads, clean_grads, key_index):
    """dq everywhere, dk and dv everywhere but at the poisoned key: finite and equal to the clean call's."""
    for i, (got, want) in enumerate(zip(grads, clean_grads)):
        got, want = np.array(got), np.array(want)
        if i > 0:
            got[key_index] = want[key_index] = 0
        assert np.isfinite(got).all()
        # The poisoned call takes the non-finite branch: the same float32 terms (masked ones as exact zeros),
        # possibly summed in other orders.
        np.testing.assert_allclose(got, want, **GRAD_PAIR_TOL)


def test_window_left_bound_keeps_an_old_non_finite_key_out():
    q, k, v = qkv(batch=1, sq=6, sk=6, seed=310)
    _, v_bad = _poisoned(k, v, "v", np.nan, (0, 0))
    out = np.asarray(flash_attn_func(q, k, v_bad, window_size=(2, 0)))
    clean = np.asarray(flash_attn_func(q, k, v, window_size=(2, 0)))
    np.testing.assert_array_equal(out[:, 3:], clean[:, 3:])  # queries 3.. see keys >= 1 only
    assert np.isnan(out[:, :3]).any(axis=-1).all()


@pytest.mark.parametrize("token", [pytest.param(4, id="other-sequence"), pytest.param(9, id="past-last-offset")])
def test_varlen_non_finite_outside_a_sequence_stays_out(token):
    cu = np.array([0, 3, 8], np.int32)
    q, k, v = rand((10, 4, 8), 320), rand((10, 2, 8), 321), rand((10, 2, 8), 322)
    k_bad, v_bad = np.array(k), np.array(v)
    k_bad[token], v_bad[token] = np.inf, np.nan
    call = lambda q, k, v: flash_attn_varlen(q, k, v, cu, cu, 5, 5, causal=True)  # noqa: E731
    rows = slice(0, 3)
    clean_out, clean_grads = _loss_and_grads(call, q, k, v, rows)
    out, grads = _loss_and_grads(call, q, k_bad, v_bad, rows)
    np.testing.assert_array_equal(out[:3], clean_out[:3])
    _assert_grads_equal_except_at(grads, clean_grads, key_index=token)


def test_kernel_implementations_keep_masked_non_finite_values_out(cudnn_emulated_by_jax_xla):
    """The cuDNN adapter (run through jax.nn's xla path here) would spread a masked NaN. The declared
    implementation runs it on keys and values whose non-finite elements are replaced by 0: rows that cannot see
    the NaN get the kernel's clean output bit for bit, rows that see it the reference's NaN, and the gradients of
    a loss on the clean rows are the kernel's clean gradients bit for bit (the poisoned value's own aside)."""
    q, k, v = qkv(batch=1, sq=6, sk=6, seed=330)
    _, v_bad = _poisoned(k, v, "v", np.nan, (0, 3))
    operands, params = attention.flash_attn_call(q, k, v_bad, dropout_p=0.0, softmax_scale=None, causal=True,
                                                 window_size=(-1, -1), bias=None, alibi_slopes=None,
                                                 deterministic=False, return_lse=False, dropout_key=None)
    assert len(operands) == 3
    declared = next(i for i in _backend.implementations(FLASH_ATTN) if i.name == "cudnn").fn
    kernel = jax.jit(lambda *a: _cudnn.flash_attn(*a, **params))
    guarded = jax.jit(lambda *a: declared(*a, **params))
    assert np.isnan(np.asarray(kernel(*operands))[:, :3]).any()  # the raw kernel spreads it
    out, clean = np.asarray(guarded(*operands)), np.asarray(kernel(q, k, v))
    np.testing.assert_array_equal(out[:, :3], clean[:, :3])
    reference = np.asarray(flash_attn_func(q, k, v_bad, causal=True))  # the CPU default: the reference
    assert np.isnan(reference[:, 3:]).all()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(reference))
    rows = (slice(None), slice(0, 3))
    _, grads = _loss_and_grads(guarded, q, k, v_bad, rows)
    _, clean_grads = _loss_and_grads(kernel, q, k, v, rows)
    for i, (got, want) in enumerate(zip(grads, clean_grads)):
        got, want = np.array(got), np.array(want)
        if i == 2:
            got[0, 3] = want[0, 3] = 0
        assert np.isfinite(got).all()
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("where", ["k", "v"])
def test_kernel_implementations_give_the_reference_non_finite_elements(cudnn_emulated_by_jax_xla, where):
    """An Inf key or value inside a window: every output element that the reference makes NaN or Inf is the
    reference's, every other one the kernel's on the clean inputs."""
    q, k, v = qkv(batch=2, sq=8, sk=8, seed=334)
    k_bad, v_bad = _poisoned(k, v, where, np.inf, (1, 5))
    call = dict(dropout_p=0.0, softmax_scale=None, causal=False, window_size=(2, 0), bias=None, alibi_slopes=None,
                deterministic=False, return_lse=False, dropout_key=None)
    operands, params = attention.flash_attn_call(q, k_bad, v_bad, **call)
    declared = next(i for i in _backend.implementations(FLASH_ATTN) if i.name == "cudnn").fn
    got = np.asarray(jax.jit(lambda *a: declared(*a, **params))(*operands))
    clean = np.asarray(jax.jit(lambda *a: _cudnn.flash_attn(*a, **params))(q, k, v))
    reference = np.asarray(flash_attn_func(q, k_bad, v_bad, **call))
    bad = ~np.isfinite(reference)
    assert bad[1, 5:].all() and not bad[0].any() and not bad[1, :5].any()  # queries 5..7 see key 5
    np.testing.assert_array_equal(got[bad], reference[bad])
    np.testing.assert_array_equal(got[~bad], clean[~bad])


def test_varlen_kernel_implementation_keeps_a_non_finite_value_in_its_sequence(cudnn_emulated_by_jax_xla):
    """The packed call: a NaN value at token 5 (the second sequence, tokens 3..7, causal) reaches the rows 5..7 that
    see it; every other row, and the gradients of a loss on them, are the kernel's clean ones bit for bit."""
    cu = np.array([0, 3, 8], np.int32)
    q, k, v = rand((8, 4, 8), 335), rand((8, 2, 8), 336), rand((8, 2, 8), 337)
    v_bad = np.array(v)
    v_bad[5] = np.nan
    operands, params = attention.flash_attn_varlen_call(
        q, k, v_bad, cu, cu, 5, 5, dropout_p=0.0, softmax_scale=None, causal=True, window_size=(-1, -1), bias=None,
        alibi_slopes=None, deterministic=False, return_lse=False, dropout_key=None)
    offsets = operands[3:]
    declared = next(i for i in _backend.implementations(FLASH_ATTN_VARLEN) if i.name == "cudnn").fn
    guarded = jax.jit(lambda q, k, v: declared(q, k, v, *offsets, **params))
    kernel = jax.jit(lambda q, k, v: _cudnn.flash_attn_varlen(q, k, v, *offsets, **params))
    out, clean = np.asarray(guarded(q, k, v_bad)), np.asarray(kernel(q, k, v))
    np.testing.assert_array_equal(out[:5], clean[:5])
    assert np.isnan(out[5:]).all()
    rows = slice(0, 5)
    _, grads = _loss_and_grads(guarded, q, k, v_bad, rows)
    _, clean_grads = _loss_and_grads(kernel, q, k, v, rows)
    for i, (got, want) in enumerate(zip(grads, clean_grads)):
        got, want = np.array(got), np.array(want)
        if i == 2:
            got[5] = want[5] = 0
        assert np.isfinite(got).all()
        np.testing.assert_array_equal(got, want)


def test_kernel_implementations_keep_the_kernels_results_when_everything_is_finite(cudnn_emulated_by_jax_xla):
    """With finite keys and values the guarded implementation returns the kernel's own output and gradients
    (bit for bit), and its bias gradient; integer operands get no cotangent."""
    q, k, v = qkv(batch=1, sq=6, sk=6, seed=331)
    bias = rand((6, 6), 332)
    operands, params = attention.flash_attn_call(q, k, v, dropout_p=0.0, softmax_scale=None, causal=True,
                                                 window_size=(-1, -1), bias=bias, alibi_slopes=None,
                                                 deterministic=False, return_lse=False, dropout_key=None)
    declared = next(i for i in _backend.implementations(FLASH_ATTN) if i.name == "cudnn").fn
    dout = rand(q.shape, 333)

    def value_and_grads(fn):
        out, vjp = jax.vjp(lambda *a: fn(*a, **params), *operands)
        return out, *vjp(dout)

    got, want = jax.jit(lambda: value_and_grads(declared))(), jax.jit(lambda: value_and_grads(_cudnn.flash_attn))()
    assert len(got) == 5  # out, dq, dk, dv, dbias
    for got_x, want_x in zip(got, want):
        np.testing.assert_array_equal(np.asarray(got_x), np.asarray(want_x))


@pytest.mark.gpu
def test_cudnn_masked_non_finite_on_cuda():
    _cuda_or_skip()
    q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in qkv(batch=1, sq=128, sk=128, hq=8, hk=2, dim=64, seed=340))
    v_bad = v.at[0, 64].set(jnp.nan)
    fn = jax.jit(lambda q, k, v: flash_attn_func(q, k, v, causal=True))  # default: cuDNN
    # Rows that cannot see the NaN value equal the reference's clean rows (cuDNN on the clean keys and values).
    with use_backend(flash_attn="xla"):
        reference = np.asarray(jax.jit(lambda q, k, v: flash_attn_func(q, k, v, causal=True))(q, k, v))
    bad = np.asarray(fn(q, k, v_bad))
    # equal to the reference up to its float32 summation order, which on GPUs depends on the program's GEMMs
    _assert_close_bf16(bad[:, :64], reference[:, :64])
    assert np.isfinite(bad[:, :64]).all() and np.isnan(bad[:, 64:]).any()
    # and the gradients of a loss on the rows that cannot see it are the reference's, finite
    loss = lambda q, k, v: jnp.sum(flash_attn_func(q, k, v, causal=True)[:, :64].astype(jnp.float32))  # noqa: E731
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v_bad)
    with use_backend(flash_attn="xla"):
        want = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v_bad)
    for got, expected in zip(grads, want):
        got, expected = np.asarray(got, np.float32), np.asarray(expected, np.float32)
        got[:, 64], expected[:, 64] = 0, 0
        assert np.isfinite(got).all()
        _assert_close_bf16(got, expected)


# --- windows in canonical form ------------------------------------------------------------------------------

@pytest.mark.parametrize("given, same_as", [
    pytest.param((-2, 0), (-1, 0), id="any-negative-is-unbounded"),
    pytest.param((2**31 - 1, -1), (-1, -1), id="int32-max-left"),
    pytest.param((-1, 2**31 - 1), (-1, -1), id="int32-max-right"),
    pytest.param((2**40, 0), (-1, 0), id="beyond-int64-safe"),
    pytest.param((12, 12), (-1, -1), id="wider-than-the-sequences"),
])
def test_window_sides_that_bound_nothing_are_unbounded(given, same_as):
    q, k, v = qkv(sq=6, sk=6, seed=350)
    np.testing.assert_array_equal(np.asarray(flash_attn_func(q, k, v, window_size=given)),
                                  np.asarray(flash_attn_func(q, k, v, window_size=same_as)))


def test_causal_folds_a_right_window_to_zero():
    """As flash-attn does: causal=True with window (left, right) is the window (left, 0)."""
    q, k, v = qkv(sq=6, sk=6, seed=360)
    np.testing.assert_array_equal(np.asarray(flash_attn_func(q, k, v, causal=True, window_size=(2, 3))),
                                  np.asarray(flash_attn_func(q, k, v, window_size=(2, 0))))


# --- flash-attn drop-in: softcap, names, packed layouts ---------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_softcap_forward_and_lse_match_oracle(causal):
    q, k, v = qkv(sq=6, sk=7, seed=400)
    q = q * 4  # logits large enough that the cap matters
    out, lse = flash_attn_func(q, k, v, causal=causal, softcap=2.5, bias=rand((6, 7), 401), return_lse=True)
    want_out, want_lse, _ = oracle(q, k, v, window=(-1, 0) if causal else (-1, -1), softcap=2.5, bias=rand((6, 7), 401))
    np.testing.assert_allclose(out, want_out, **F32_TOL)
    assert_lse_close(lse, want_lse)
    assert not np.allclose(out, flash_attn_func(q, k, v, causal=causal, bias=rand((6, 7), 401)))


@pytest.mark.parametrize("blocks", [False, True], ids=["whole", "blocks"])
def test_softcap_gradients_match_central_differences(blocks, request):
    """Also in 4-query blocks, whose backward on the CPU runs over 4-key blocks (6 keys: one and two left)."""
    if blocks:
        request.getfixturevalue("small_query_chunk")
    q, k, v = qkv(batch=1, sq=5, sk=6, hq=2, hk=1, dim=4, seed=410)
    dout = rand((1, 5, 2, 4), 411)

    def loss64(q64, k64, v64):
        return float(np.sum(oracle(q64, k64, v64, softcap=1.5)[0] * dout))

    got = jax.grad(lambda q, k, v: jnp.sum(flash_attn_func(q, k, v, softcap=1.5) * dout), argnums=(0, 1, 2))(q, k, v)
    want = (_oracle.central_difference(lambda x: loss64(x, k, v), q),
            _oracle.central_difference(lambda x: loss64(q, x, v), k),
            _oracle.central_difference(lambda x: loss64(q, k, x), v))
    # The float32 gradients' own error (GRAD_TOL); float64 central differences add ~1e-8 (rounding over 2 eps).
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, **GRAD_TOL)


def test_softcap_in_varlen_equals_per_sequence_calls():
    q, k, v = varlen_inputs(seed=420)
    cu = np.array([0, 3, 8], np.int32)
    out = flash_attn_varlen_func(q[:8], k, v, cu, cu, 5, 5, causal=True, softcap=3.0)
    for b in range(2):
        s, e = cu[b], cu[b + 1]
        np.testing.assert_allclose(out[s:e], flash_attn_func(q[None, s:e], k[None, s:e], v[None, s:e], causal=True,
                                                             softcap=3.0)[0], **F32_PAIR_TOL)


@pytest.mark.parametrize("softcap, error", [(-1.0, ValueError), (float("inf"), ValueError), ("2", TypeError),
                                            (np.ones(1), TypeError)])
def test_softcap_checks(softcap, error):
    q, k, v = qkv()
    with pytest.raises(error, match="softcap"):
        flash_attn_func(q, k, v, softcap=softcap)


def test_kernel_implementations_name_why_they_skip_softcap():
    q = jax.ShapeDtypeStruct((1, 16, 4, 128), jnp.bfloat16)
    operands, params = attention.flash_attn_call(q, q, q, dropout_p=0.0, softmax_scale=None, causal=True,
                                                 window_size=(-1, -1), bias=None, alibi_slopes=None,
                                                 deterministic=False, return_lse=False, dropout_key=None, softcap=30.0)
    reasons = {i.name: i.unsupported_reason(operands, params) for i in _backend.implementations(FLASH_ATTN)}
    assert "soft-capping" in reasons["aiter"]
    assert reasons["xla"] is None


def test_packed_layouts_equal_the_unpacked_calls():
    q, k, v = qkv(sq=6, sk=6, hq=2, hk=2, seed=430)
    np.testing.assert_array_equal(np.asarray(flash_attn_qkvpacked_func(np.stack([q, k, v], axis=2), causal=True)),
                                  np.asarray(flash_attn_func(q, k, v, causal=True)))
    np.testing.assert_array_equal(np.asarray(flash_attn_kvpacked_func(q, np.stack([k, v], axis=2), 0.0, None, True)),
                                  np.asarray(flash_attn_func(q, k, v, causal=True)))
    cu = np.array([0, 2, 6], np.int32)
    qv, kv_, vv = q[0], k[0], v[0]
    np.testing.assert_array_equal(
        np.asarray(flash_attn_varlen_qkvpacked_func(np.stack([qv, kv_, vv], axis=1), cu, 4, causal=True)),
        np.asarray(flash_attn_varlen(qv, kv_, vv, cu, cu, 4, 4, causal=True)))
    np.testing.assert_array_equal(
        np.asarray(flash_attn_varlen_kvpacked_func(qv, np.stack([kv_, vv], axis=1), cu, cu, 4, 4, causal=True)),
        np.asarray(flash_attn_varlen(qv, kv_, vv, cu, cu, 4, 4, causal=True)))
    with pytest.raises(ValueError, match="qkv must have 3 on axis 2"):
        flash_attn_qkvpacked_func(np.stack([q, k], axis=2))


def test_flash_attn_positional_order_is_flash_attns():
    """q, k, v, dropout_p, softmax_scale, causal, window_size, softcap: the first eight positions as flash-attn."""
    q, k, v = qkv(sq=6, sk=6, seed=440)
    np.testing.assert_array_equal(np.asarray(flash_attn_func(q, k, v, 0.0, 0.5, True, (2, -1), 3.0)),
                                  np.asarray(flash_attn_func(q, k, v, softmax_scale=0.5, causal=True,
                                                             window_size=(2, 0), softcap=3.0)))
    assert flash_attn_varlen_func is flash_attn_varlen


# --- the chunked reference: blocks of queries, rematerialized in the backward pass ----------------------------

@pytest.fixture
def small_query_chunk(monkeypatch):
    from jax_aiter.ref import mha as ref_mha

    monkeypatch.setattr(ref_mha, "QUERY_CHUNK", 4)
    monkeypatch.setattr(ref_mha, "CPU_QUERY_CHUNK", 4)
    jax.clear_caches()  # the reference is jitted: retrace it with the small blocks
    yield
    jax.clear_caches()


@pytest.mark.parametrize("options", [dict(causal=True), dict(window_size=(3, 1)), dict(), dict(softcap=2.0)],
                         ids=["causal", "window", "full", "softcap"])
@pytest.mark.parametrize("sq,sk,bias_shape", [(11, 9, (11, 9)), (33, 30, (33, 30)), (33, 37, (33, 1)), (11, 8, None),
                                              (33, 37, None)],
                         ids=["three-blocks", "grouped", "grouped-row-bias", "key-blocks", "key-blocks-and-rest"])
def test_chunked_reference_matches_the_float64_oracle(small_query_chunk, options, sq, sk, bias_shape):
    """With 4-query blocks, 11 queries take three blocks (the last padded), 33 queries nine blocks in four
    groups, each over the keys its window leaves it; without a mask or bias the CPU's backward runs over 4-key
    blocks instead (8 keys: two; 37: nine and one key left): outputs, lse and gradients (with lse's) still equal
    the float64 oracle."""
    q, k, v = qkv(sq=sq, sk=sk, seed=500)
    bias = None if bias_shape is None else rand(bias_shape, 501)
    window = options.get("window_size", (-1, 0) if options.get("causal") else (-1, -1))
    out, lse = flash_attn_func(q, k, v, bias=bias, return_lse=True, **options)
    want_out, want_lse, probs = oracle(q, k, v, window=window, bias=bias, softcap=options.get("softcap", 0.0))
    np.testing.assert_allclose(out, want_out, **F32_TOL)
    assert_lse_close(lse, want_lse)
    if not options.get("softcap"):
        dout, dlse = rand(out.shape, 502), rand(lse.shape, 503)
        finite_dlse = np.where(np.isfinite(want_lse), dlse, 0)

        def loss(q, k, v):
            out, lse = flash_attn_func(q, k, v, bias=bias, return_lse=True, **options)
            return jnp.sum(out * dout) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0) * dlse)

        grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
        for got, want in zip(grads, oracle_grads(q, k, v, dout, probs, dlse=finite_dlse)[:3]):
            np.testing.assert_allclose(got, want, **GRAD_TOL)


def test_chunked_half_precision_gradients_without_a_mask_are_rounded_once(small_query_chunk):
    """bf16 without a mask in 4-query blocks (on the CPU: the backward over 4-key blocks, 9 keys: two and one
    left): output and gradients are float32 math on the rounded inputs rounded once to bf16, half an ulp from the
    float64 oracle (dq summed over the key blocks in float32, dk and dv one product each)."""
    q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in qkv(sq=11, sk=9, hq=4, hk=2, dim=16, seed=505))
    dout = jnp.asarray(rand((2, 11, 4, 16), 506), jnp.bfloat16)
    out, vjp = jax.vjp(lambda q, k, v: flash_attn_func(q, k, v), q, k, v)
    q64, k64, v64, dout64 = (np.asarray(x, np.float64) for x in (q, k, v, dout))
    want, _, probs = oracle(q64, k64, v64)
    _oracle.assert_close(out, want, jnp.bfloat16, factor=0.5)
    for got, want in zip(vjp(dout), oracle_grads(q64, k64, v64, dout64, probs)[:3]):
        _oracle.assert_close(got, want, jnp.bfloat16, factor=0.5)


@pytest.mark.parametrize("window", [(-1, 0), (3, 1), (0, 0), (2, -1), (-1, 2), (-1, -1)])
@pytest.mark.parametrize("sq,sk", [(16, 16), (16, 9), (9, 16)])
def test_window_key_range_holds_every_key_a_window_allows(window, sq, sk):
    """The keys a group of query rows is attended over include every key the window lets one of them see."""
    from jax_aiter.ref import mha as ref_mha

    allowed = window_allowed(sq, sk, window)
    for first in range(sq):
        for end in range(first + 1, sq + 1):
            lo, hi = ref_mha._window_key_range(first, end, window=window, offset=sk - sq, sk=sk)
            assert 0 <= lo < hi <= sk
            seen = np.flatnonzero(allowed[first:end].any(axis=0))
            assert seen.size == 0 or (lo <= seen.min() and seen.max() < hi), (first, end, lo, hi)


def test_chunked_reference_keeps_masked_non_finite_values_out(small_query_chunk):
    q, k, v = qkv(batch=1, sq=10, sk=10, seed=510)
    _, v_bad = _poisoned(k, v, "v", np.nan, (0, 6))
    out = np.asarray(flash_attn_func(q, k, v_bad, causal=True))
    np.testing.assert_allclose(out[:, :6], np.asarray(flash_attn_func(q, k, v, causal=True))[:, :6],
                               **F32_PAIR_TOL)
    assert np.isnan(out[:, 6:]).any(axis=-1).all()


def test_chunked_varlen_matches_per_sequence_calls(small_query_chunk):
    q, k, v = varlen_inputs(seed=520)
    cu = np.array([0, 3, 8], np.int32)
    out = flash_attn_varlen(q[:8], k, v, cu, cu, 5, 5, causal=True)
    for b in range(2):
        s, e = cu[b], cu[b + 1]
        np.testing.assert_allclose(out[s:e], flash_attn_func(q[None, s:e], k[None, s:e], v[None, s:e],
                                                             causal=True)[0], **F32_PAIR_TOL)


@pytest.mark.parametrize("platform, blocks, float32_products", [("cpu", {"128"}, True), ("cuda", {"512"}, False),
                                                                ("rocm", {"512"}, False)])
def test_reference_lowers_with_its_platform_s_blocks_and_products(platform, blocks, float32_products):
    """The gradient of a causal bf16 call, lowered per platform: 128-query blocks over growing key ranges on the
    CPU, 512-query blocks on GPUs (1100 queries: 3 blocks, one group). Products of two bf16 operands are bf16 dots
    everywhere; those with a float32 operand are float32 dots on the CPU and bf16 ones (two parts) on GPUs."""
    import re

    from jax_aiter.ref import mha as ref_mha

    q = jax.ShapeDtypeStruct((1, 1100, 4, 64), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 1100, 2, 64), jnp.bfloat16)

    def loss(q, k, v):
        return ref_mha.attention(q, k, v, bias=None, alibi_slopes=None, dropout_seed=None, softmax_scale=0.125,
                                 window=(-1, 0), dropout_p=0.0)[0].astype(jnp.float32).sum()

    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, kv, kv).lower(lowering_platforms=(platform,)).as_text()
    logits = set(re.findall(r"tensor<1x2x2x(\d+)x(\d+)xf32>", text))
    assert {rows for rows, keys in logits if keys != "1"} == blocks
    key_ranges = {keys for rows, keys in logits if keys not in ("1", "64")}
    assert key_ranges == ({"256", "512", "768", "1100"} if platform == "cpu" else {"1100"})
    def dots(dtype):
        return len(re.findall(rf"dot_general[^\n]*: \(tensor<[0-9x]*x{dtype}>, tensor<[0-9x]*x{dtype}>\)", text))

    assert dots("bf16") > 0
    assert (dots("f32") > 0) == float32_products


@pytest.mark.parametrize("platform, query_blocks, key_blocks", [("cpu", {"128"}, {"128", "76"}),
                                                              ("cuda", {"512"}, set()), ("rocm", {"512"}, set())])
def test_reference_without_a_mask_lowers_a_backward_over_key_blocks_on_the_cpu_only(platform, query_blocks,
                                                                                    key_blocks):
    """The gradient of a bf16 call without a mask, lowered per platform: on the CPU the forward's logits come in
    128-query blocks and the backward's key-major ([B, Hk, keys, G, Sq]) in 128-key blocks (1100 keys: eight and
    76 left); GPUs keep 512-query blocks in both passes."""
    import re

    from jax_aiter.ref import mha as ref_mha

    q = jax.ShapeDtypeStruct((1, 1100, 4, 64), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 1100, 2, 64), jnp.bfloat16)

    def loss(q, k, v):
        return ref_mha.attention(q, k, v, bias=None, alibi_slopes=None, dropout_seed=None, softmax_scale=0.125,
                                 window=(-1, -1), dropout_p=0.0)[0].astype(jnp.float32).sum()

    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, kv, kv).lower(lowering_platforms=(platform,)).as_text()
    assert set(re.findall(r"tensor<1x2x2x(\d+)x1100xf32>", text)) == query_blocks
    # Besides the key blocks: the row terms [B, Hk, 1, G, Sq] and dq's accumulator [B, Hk, D, G, Sq].
    assert set(re.findall(r"tensor<1x2x(\d+)x2x1100xf32>", text)) - {"1", "64"} == key_blocks


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "no-mask"])
def test_reference_backward_memory_grows_linearly_with_the_sequence(monkeypatch, causal):
    """Gradient of a causal call, and of one without a mask (on the CPU: a backward over key blocks): the compiled
    program's scratch memory grows about linearly with the sequence length (blocks of [QUERY_CHUNK, Sk] logits),
    where the unblocked form grows with its square."""
    from jax_aiter.ref import mha as ref_mha

    def scratch(length, chunk):
        monkeypatch.setattr(ref_mha, "QUERY_CHUNK", chunk)
        monkeypatch.setattr(ref_mha, "CPU_QUERY_CHUNK", chunk)
        jax.clear_caches()
        q = jax.ShapeDtypeStruct((1, length, 2, 64), jnp.bfloat16)
        grad = jax.jit(jax.grad(lambda q, k, v: flash_attn_func(q, k, v, causal=causal).astype(jnp.float32).sum(),
                                argnums=(0, 1, 2)))
        with use_backend(flash_attn="xla"):
            return grad.lower(q, q, q).compile().memory_analysis().temp_size_in_bytes

    # From 4k queries on, the blocks are mapped in KEY_RANGE_GROUPS groups.
    blocked_4k, blocked_8k = scratch(4096, 512), scratch(8192, 512)
    whole_4k = scratch(4096, 8192)
    jax.clear_caches()
    # Linear growth doubles the scratch from 4k to 8k (quadratic would quadruple it); at 4k the [512, Sk] blocks
    # need an eighth of the whole [Sk, Sk] logits, plus what both hold alike.
    assert blocked_8k < 3 * blocked_4k, (blocked_4k, blocked_8k)
    assert blocked_4k < whole_4k / 2, (blocked_4k, whole_4k)
