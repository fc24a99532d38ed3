"""The one compiled part of schedext, extender/_packed.c (see extender/packed.py).

Everything else is in pyproject.toml. The extension is optional: without a C compiler the
install goes ahead and extender.packed uses its pure-Python twin (same answers, slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "extender._packed",
            sources=["extender/_packed.c"],
            extra_compile_args=["-O2", "-std=c11"],
            optional=True,
        )
    ]
)
