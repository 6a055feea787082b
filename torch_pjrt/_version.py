"""torch_pjrt's version (``torch_pjrt.__version__``; pyproject.toml says the same)."""

__version__ = "0.1.0"
