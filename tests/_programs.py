"""What a traced program runs, for tests that count ops."""


def cast_calls(jaxpr) -> int:
    """MXFP4 cast ops (the reference's jitted casts, named cast_mxfp4*) the program runs, counting each nested jaxpr
    once per use."""
    count = 0
    for eqn in jaxpr.eqns:
        if str(eqn.params.get("name", "")).startswith("cast_mxfp4"):
            count += 1
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", param)
            if hasattr(inner, "eqns"):
                count += cast_calls(inner)
    return count
