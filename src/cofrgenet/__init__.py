"""cofrgenet: continued-fraction language models."""

from importlib import metadata


def package_version() -> str:
    """The installed cofrgenet's version ("unknown" when it is not installed)."""
    try:
        return metadata.version("cofrgenet")
    except metadata.PackageNotFoundError:
        return "unknown"
