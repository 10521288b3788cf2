"""``PrecisionPolicy``: which projections of a decoder run in which precision.

A model asks the policy for the recipe of each projection by its role (``"attention"`` or ``"mlp"`` inside
block ``i`` of ``n``, ``"lm_head"``, ``"embedding"``) and runs it through :func:`project`: BF16 ``gemm`` for
None, ``gemm_fp4_bf16`` for an ``Mxfp4Recipe``, ``gemm_fp8`` for an ``Fp8Recipe``. The policy is a static,
hashable value (a frozen dataclass of frozen recipes), so it can be a ``jit`` static argument or a field of a
model.

The MXFP4 and FP8 policies keep the LM head and the embedding in BF16 unless asked otherwise: on real text an MXFP4
LM head roughly triples the held-out loss gap to BF16 (docs/convergence.md). The default MXFP4 policy also keeps the
last third of the blocks in BF16 and rotates with keyed random signs: the measured best static policy there.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax

from jax_aiter._phases import closing_phase_start
from jax_aiter.gemm import gemm
from jax_aiter.gemm_fp4 import Mxfp4Recipe, gemm_fp4_bf16
from jax_aiter.gemm_fp8 import Fp8Recipe, gemm_fp8

__all__ = ["BLOCK_ROLES", "MXFP4_BF16_LAST_FRACTION", "ROLES", "PrecisionPolicy", "PrecisionSchedule", "Recipe",
           "project"]

Recipe = Mxfp4Recipe | Fp8Recipe | None
BLOCK_ROLES = ("attention", "mlp")
ROLES = (*BLOCK_ROLES, "lm_head", "embedding")
_RECIPE_TYPES = (Mxfp4Recipe, Fp8Recipe)
# The share of the blocks, at the output end, that the default MXFP4 policy keeps in BF16: 4 of the 75 M model's 12
# (docs/convergence.md, "The default policy").
MXFP4_BF16_LAST_FRACTION = 1 / 3


@dataclasses.dataclass(frozen=True)
class PrecisionPolicy:
    """The recipe of every projection of a decoder with blocks of attention and MLP projections.

    * ``linear``: every attention and MLP projection inside the blocks;
    * ``lm_head``: the output projection to the vocabulary;
    * ``embedding``: None is the BF16 table lookup; a recipe runs the lookup as the GEMM
      ``one_hot(tokens) . table`` through that recipe, so the table and its gradient are quantized as the recipe
      says (the vocabulary size must then be a multiple of 64);
    * ``bf16_first_blocks`` / ``bf16_last_blocks``: that many blocks at the input / output end run BF16 whatever
      ``linear`` says;
    * ``bf16_last_fraction``: a share of the blocks, in [0, 1), at the output end that runs BF16 too, for a policy
      that holds for any depth: the last ``floor(fraction * blocks)`` blocks (``bf16_last_blocks`` if that is
      more; :meth:`bf16_last_count`);
    * ``quantize_weights_once``: a model that honours it (both definitions of the demo model,
      ``jax_aiter.examples.tiny_llama``) makes the FP4 copies of all its MXFP4 projections' weights at the start of
      the forward pass with ``jax_aiter.gemm_fp4.quantize_weights`` (one cast per recipe and weight width where the
      recipe allows) instead of one cast per projection; the same bits unless a recipe rounds weights
      stochastically (docs/mxfp4.md, "Weights quantized once").

    A recipe is an ``Mxfp4Recipe``, an ``Fp8Recipe`` or None (BF16). The named constructors :meth:`bf16`,
    :meth:`mxfp4` and :meth:`fp8` build the usual policies.
    """

    linear: Recipe = None
    lm_head: Recipe = None
    embedding: Recipe = None
    bf16_first_blocks: int = 0
    bf16_last_blocks: int = 0
    bf16_last_fraction: float = 0.0
    quantize_weights_once: bool = False

    def __post_init__(self) -> None:
        for name in ("linear", "lm_head", "embedding"):
            recipe = getattr(self, name)
            if recipe is not None and not isinstance(recipe, _RECIPE_TYPES):
                raise TypeError(f"{name} must be an Mxfp4Recipe, an Fp8Recipe or None (BF16), got "
                                f"{type(recipe).__name__}")
        for name in ("bf16_first_blocks", "bf16_last_blocks"):
            count = getattr(self, name)
            if isinstance(count, bool) or not isinstance(count, int):
                raise TypeError(f"{name} must be an int, got {type(count).__name__}")
            if count < 0:
                raise ValueError(f"{name} must be >= 0, got {count}")
        fraction = self.bf16_last_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
            raise TypeError(f"bf16_last_fraction must be a float, got {type(fraction).__name__}")
        if not 0 <= fraction < 1:
            raise ValueError(f"bf16_last_fraction must be in [0, 1), got {fraction}")
        if not isinstance(self.quantize_weights_once, bool):
            raise TypeError(f"quantize_weights_once must be a bool, got {type(self.quantize_weights_once).__name__}")

    @classmethod
    def bf16(cls) -> PrecisionPolicy:
        """Every projection BF16."""
        return cls()

    @classmethod
    def mxfp4(cls, recipe: Mxfp4Recipe | None = None, *, lm_head: bool = False, embedding: bool = False,
              bf16_first_blocks: int = 0, bf16_last_blocks: int = 0,
              bf16_last_fraction: float = MXFP4_BF16_LAST_FRACTION) -> PrecisionPolicy:
        """The block projections through ``recipe`` (default ``Mxfp4Recipe.keyed_hadamard()``), except the last
        third of the blocks (``bf16_last_fraction``; 0 puts every block through ``recipe``), which run BF16; the LM
        head and the embedding BF16 unless ``lm_head`` / ``embedding`` put them through the same recipe.

        With the defaults a 75 M decoder trained 2000 steps on real text reached +1.18 ± 0.14 % of BF16's held-out
        loss (six seeds), every block through ``Mxfp4Recipe.default()`` +1.72 ± 0.07 % (docs/convergence.md)."""
        recipe = Mxfp4Recipe.keyed_hadamard() if recipe is None else recipe
        if not isinstance(recipe, Mxfp4Recipe):
            raise TypeError(f"recipe must be an Mxfp4Recipe or None (the default recipe), got "
                            f"{type(recipe).__name__}")
        return cls._with_recipe(recipe, lm_head, embedding, bf16_first_blocks, bf16_last_blocks, bf16_last_fraction)

    @classmethod
    def fp8(cls, recipe: Fp8Recipe | None = None, *, lm_head: bool = False, embedding: bool = False,
            bf16_first_blocks: int = 0, bf16_last_blocks: int = 0) -> PrecisionPolicy:
        """Every block projection through ``recipe`` (default ``Fp8Recipe.default()``: current scaling, E4M3
        forward, E5M2 gradients); the LM head and the embedding BF16 unless ``lm_head`` / ``embedding`` put them
        through the same recipe."""
        recipe = Fp8Recipe.default() if recipe is None else recipe
        if not isinstance(recipe, Fp8Recipe):
            raise TypeError(f"recipe must be an Fp8Recipe or None (the default recipe), got {type(recipe).__name__}")
        return cls._with_recipe(recipe, lm_head, embedding, bf16_first_blocks, bf16_last_blocks, 0.0)

    @classmethod
    def _with_recipe(cls, recipe, lm_head, embedding, bf16_first_blocks, bf16_last_blocks,
                     bf16_last_fraction) -> PrecisionPolicy:
        for name, flag in (("lm_head", lm_head), ("embedding", embedding)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        return cls(linear=recipe, lm_head=recipe if lm_head else None, embedding=recipe if embedding else None,
                   bf16_first_blocks=bf16_first_blocks, bf16_last_blocks=bf16_last_blocks,
                   bf16_last_fraction=bf16_last_fraction)

    def bf16_last_count(self, blocks: int) -> int:
        """How many blocks at the output end of ``blocks`` run BF16: ``bf16_last_blocks`` or
        ``floor(bf16_last_fraction * blocks)``, whichever is more (the product rounded to 9 decimals first, so
        that 12 / 3 is 4 whatever the float)."""
        if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
            raise ValueError(f"blocks must be a positive int, got {blocks!r}")
        return max(self.bf16_last_blocks, math.floor(round(self.bf16_last_fraction * blocks, 9)))

    def recipe_for(self, role: str, block: int | None = None, blocks: int | None = None) -> Recipe:
        """The recipe of the projections of ``role``: for ``"attention"`` and ``"mlp"``, those of block
        ``block`` (0-based) of ``blocks``; ``"lm_head"`` and ``"embedding"`` take no block."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        if role not in BLOCK_ROLES:
            if block is not None or blocks is not None:
                raise ValueError(f"role {role!r} is not inside a block: pass no block or blocks")
            return getattr(self, role)
        for name, value in (("block", block), ("blocks", blocks)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int for role {role!r}, got {type(value).__name__}")
        if not 0 <= block < blocks:
            raise ValueError(f"block must be in [0, blocks = {blocks}), got {block}")
        if block < self.bf16_first_blocks or block >= blocks - self.bf16_last_count(blocks):
            return None
        return self.linear

    @property
    def uses_stochastic_rounding(self) -> bool:
        """Whether some projection rounds stochastically, so a forward pass needs a key."""
        recipes = (self.linear, self.lm_head, self.embedding)
        return any(isinstance(r, Mxfp4Recipe) and r.uses_stochastic_rounding for r in recipes)


@dataclasses.dataclass(frozen=True)
class PrecisionSchedule:
    """Policies by training progress: ``policy`` trains the steps before the last ``final_fraction`` of them,
    ``final_policy`` (if any) those last steps, a closing phase in a wider format. A policy is static, so a
    training loop compiles one step per policy of :attr:`policies` and takes ``policy_at(step, steps)``'s.

    :meth:`mxfp4_then_fp8` is the schedule that met the 1 % target of issue 18 on the H200 (docs/convergence.md).
    """

    policy: PrecisionPolicy
    final_policy: PrecisionPolicy | None = None
    final_fraction: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.policy, PrecisionPolicy):
            raise TypeError(f"policy must be a PrecisionPolicy, got {type(self.policy).__name__}")
        if self.final_policy is None:
            if self.final_fraction != 0.0:
                raise ValueError(f"final_fraction must be 0 without a final_policy, got {self.final_fraction}")
            return
        if not isinstance(self.final_policy, PrecisionPolicy):
            raise TypeError(f"final_policy must be a PrecisionPolicy or None, got {type(self.final_policy).__name__}")
        if not 0.0 < self.final_fraction < 1.0:
            raise ValueError(f"final_fraction must be in (0, 1) with a final_policy, got {self.final_fraction}")

    @classmethod
    def mxfp4_then_fp8(cls, recipe: Mxfp4Recipe | None = None, *, bf16_last_blocks: int = 2,
                       final_fraction: float = 0.25) -> PrecisionSchedule:
        """``PrecisionPolicy.mxfp4(recipe, bf16_last_blocks=..., bf16_last_fraction=0)``, then
        ``PrecisionPolicy.fp8()`` for the last ``final_fraction`` of the steps; ``recipe`` defaults to
        ``Mxfp4Recipe.keyed_hadamard()``. With the defaults, a 75 M decoder trained 2000 steps on real text reached
        +0.86 ± 0.14 % of BF16's held-out loss (six seeds; every block through ``Mxfp4Recipe.default()`` alone
        +1.72 %)."""
        recipe = Mxfp4Recipe.keyed_hadamard() if recipe is None else recipe
        return cls(PrecisionPolicy.mxfp4(recipe, bf16_last_blocks=bf16_last_blocks, bf16_last_fraction=0.0),
                   PrecisionPolicy.fp8(), final_fraction)

    @property
    def policies(self) -> tuple[PrecisionPolicy, ...]:
        """The policies in the order they train: one, or two with a closing phase."""
        return (self.policy,) if self.final_policy is None else (self.policy, self.final_policy)

    def final_from(self, steps: int) -> int:
        """The first (0-based) of ``steps`` steps trained under ``final_policy``; ``steps`` when there is none.
        Raises ValueError when ``final_fraction`` of ``steps`` leaves one of the two phases without a step."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be a positive int, got {steps!r}")
        return steps if self.final_policy is None else closing_phase_start(steps, self.final_fraction)

    def policy_at(self, step: int, steps: int) -> PrecisionPolicy:
        """The policy that trains step ``step`` (0-based) of ``steps``."""
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < steps:
            raise ValueError(f"step must be an int in [0, steps = {steps}), got {step!r}")
        return self.policy if step < self.final_from(steps) else self.final_policy


def project(x: jax.Array, w: jax.Array, recipe: Recipe, *, key: Any = None) -> jax.Array:
    """``x[..., K] . w[N, K]^T`` in the precision ``recipe`` names: ``gemm`` (x and w bf16) for None,
    ``gemm_fp4_bf16(x, w, recipe, key=key)`` for an ``Mxfp4Recipe``, ``gemm_fp8(x, w, recipe)`` for an
    ``Fp8Recipe``. ``key`` is used only by an MXFP4 recipe that rounds stochastically (and required by it)."""
    if recipe is None:
        return gemm(x, w)
    if isinstance(recipe, Mxfp4Recipe):
        return gemm_fp4_bf16(x, w, recipe, key=key if recipe.uses_stochastic_rounding else None)
    if isinstance(recipe, Fp8Recipe):
        return gemm_fp8(x, w, recipe)
    raise TypeError(f"recipe must be an Mxfp4Recipe, an Fp8Recipe or None (BF16), got {type(recipe).__name__}")
