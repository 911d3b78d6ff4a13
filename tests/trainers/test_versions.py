from importlib import metadata

import pytest
from packaging.version import Version

SUPPORTED = {"trl": (Version("1.16.0"), Version("1.17")), "datasets": (Version("4.7.0"), Version("6"))}
"""[lowest tested, first untested) for the packages the trainer relies on."""


@pytest.mark.parametrize("package", sorted(SUPPORTED))
def test_installed_version_is_supported(package):
    try:
        installed = Version(metadata.version(package))
    except metadata.PackageNotFoundError:
        pytest.skip(f"{package} is not installed: pip install 'trace-gym[train]'")
    low, high = SUPPORTED[package]
    assert low <= installed < high, (
        f"{package} {installed} is outside the supported range [{low}, {high}); TreeGRPOTrainer overrides "
        "TRL internals checked against that range. Install a supported one: "
        f"pip install '{package}>={low},<{high}'"
    )
