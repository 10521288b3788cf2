"""Pure-JAX reference implementations: they define every op's numerics and run on any platform."""
