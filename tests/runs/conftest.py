from tests.gpu.conftest import _close_collectors, fake_nvml, scenario  # noqa: F401 - shared fixtures
