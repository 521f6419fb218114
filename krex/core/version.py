"""The package's version (pyproject.toml's), in a module of its own: `import krex` reads it
and nothing else."""

__version__ = "0.1.0"
