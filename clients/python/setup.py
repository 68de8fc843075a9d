"""Builds llm_client with its gRPC stubs generated from ../../proto/llm.proto (build_stubs.py):
the stubs are never committed, so they cannot go stale. Metadata is in pyproject.toml."""
import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_stubs  # noqa: E402


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        build_stubs.generate(self.build_lib)


setup(cmdclass={"build_py": BuildPyWithStubs})
