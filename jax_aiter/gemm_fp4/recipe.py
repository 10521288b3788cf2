"""``Mxfp4Recipe``: how each tensor role and each GEMM of an MXFP4 linear layer is quantized."""

from __future__ import annotations

import dataclasses

from jax_aiter.gemm_fp4 import _quantize
from jax_aiter.ref import mxfp4 as ref

__all__ = ["GEMMS", "Mxfp4Recipe", "ROLES"]

ROLES = ("activation", "weight", "gradient")
GEMMS = ("fprop", "dgrad", "wgrad")


@dataclasses.dataclass(frozen=True)
class Mxfp4Recipe:
    """Numerics of ``y = x . W^T`` and its gradients, as a static, hashable value.

    Per role (activation x, weight W, output gradient g): the scale rule and whether stochastic rounding is
    used. Per GEMM (fprop y = x.W^T over K, dgrad dx = g.W over N, wgrad dW = g^T.x over M): the Hadamard
    size (0, 16 or 32), always applied to *both* operands along that GEMM's contraction axis so the exact
    product is unchanged. ``hadamard_seed`` (an int) adds keyed +-1 signs to every rotation; None means the plain
    Hadamard. Which copies are shuffled is not a choice: it follows from the operand each copy is in AITER's
    GEMM (see ``MXFP4Quantizer.for_role``). ``weight_tile_scaling`` gives W one scale per 32 x 32 tile, shared
    by its rowwise (fprop) and columnwise (dgrad) copy, so both GEMMs use the same quantized weight
    (``jax_aiter.ref.mxfp4.quantize_tiles``); it needs W's copies unrotated (fprop and dgrad Hadamard 0).

    The field defaults are the project default (paired Hadamard on wgrad only, round-to-nearest-even).
    """

    activation_scale_rule: str = "even"
    weight_scale_rule: str = "even"
    gradient_scale_rule: str = "even"
    activation_stochastic: bool = False
    weight_stochastic: bool = False
    gradient_stochastic: bool = False
    fprop_hadamard: int = 0
    dgrad_hadamard: int = 0
    wgrad_hadamard: int = 16
    hadamard_seed: int | None = None
    weight_tile_scaling: bool = False

    def __post_init__(self) -> None:
        for role in ROLES:
            _quantize.check_choice(f"{role}_scale_rule", getattr(self, f"{role}_scale_rule"), ref.SCALE_RULES)
            if not isinstance(getattr(self, f"{role}_stochastic"), bool):
                raise TypeError(f"{role}_stochastic must be a bool")
        for gemm in GEMMS:
            _quantize.check_hadamard_size(f"{gemm}_hadamard", getattr(self, f"{gemm}_hadamard"))
        _quantize.check_seed("hadamard_seed", self.hadamard_seed)
        if not isinstance(self.weight_tile_scaling, bool):
            raise TypeError(f"weight_tile_scaling must be a bool, got {type(self.weight_tile_scaling).__name__}")
        if self.weight_tile_scaling and (self.fprop_hadamard or self.dgrad_hadamard):
            raise ValueError("weight_tile_scaling needs fprop_hadamard = dgrad_hadamard = 0: a rotation along one "
                             f"axis of W breaks its 32 x 32 tiles (got {self.fprop_hadamard}, {self.dgrad_hadamard})")

    @classmethod
    def default(cls) -> Mxfp4Recipe:
        """The project default: RNE everywhere, paired 16-point Hadamard on the wgrad operands only."""
        return cls()

    @classmethod
    def gradient_hadamard(cls) -> Mxfp4Recipe:
        """RNE everywhere and a paired 16-point Hadamard on both gradient GEMMs (dgrad and wgrad): the rotation
        spreads the gradient's outliers over each 16-element chunk before it is quantized, on both operands of
        each GEMM so the product is unbiased."""
        return cls(dgrad_hadamard=16, wgrad_hadamard=16)

    @classmethod
    def keyed_hadamard(cls) -> Mxfp4Recipe:
        """The default with keyed random signs on its rotation (``hadamard_seed=0``): the recipe of the default
        training policy, ``PrecisionPolicy.mxfp4()``. The forward GEMM is the default's; the signs change how wgrad's
        operands are rotated before they are quantized, not the exact product."""
        return cls(hadamard_seed=0)

    # Alias of gradient_hadamard, the name this preset had in jax-aiter 0.1.0.
    peer_parity = gradient_hadamard

    def scale_rule(self, role: str) -> str:
        return getattr(self, f"{_check_role(role)}_scale_rule")

    def stochastic(self, role: str) -> bool:
        return getattr(self, f"{_check_role(role)}_stochastic")

    def hadamard(self, gemm: str) -> int:
        if gemm not in GEMMS:
            raise ValueError(f"gemm must be one of {GEMMS}, got {gemm!r}")
        return getattr(self, f"{gemm}_hadamard")

    @property
    def uses_stochastic_rounding(self) -> bool:
        return any(self.stochastic(role) for role in ROLES)


def _check_role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    return role
