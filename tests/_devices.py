"""The devices the `multidevice` tests spread over: the GPUs where this process has two or more (the multigpu tier's
machine), else the CPU's, which tests/conftest.py splits into 8 virtual devices."""

import jax


def multidevice_devices() -> list[jax.Device]:
    accelerators = [d for d in jax.devices() if d.platform != "cpu"]
    return accelerators if len(accelerators) >= 2 else jax.devices("cpu")
