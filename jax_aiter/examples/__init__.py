"""Small end-to-end programs built only from jax_aiter ops (used by the `jax-aiter` command)."""
