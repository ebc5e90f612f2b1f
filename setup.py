"""Build hook for the one optional C extension; project metadata lives in pyproject.toml.

`pip install -e .` (or a wheel build) compiles ratchet/governance/_sha1batch.c, the batched SHA-1
behind ratchet.governance.minhash. The extension is optional: if it does not compile (no C
compiler, no Python headers) installation still succeeds and minhash falls back to DuckDB's
sha1() (same signatures, slower).
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ratchet.governance._sha1batch",
            sources=["ratchet/governance/_sha1batch.c"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ]
)
