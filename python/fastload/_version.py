"""The one place the version is written: pyproject.toml reads it (scikit-build-core's regex
provider), CMake gets it as SKBUILD_PROJECT_VERSION and compiles it into fastload._C."""
__version__ = "0.1.0"
