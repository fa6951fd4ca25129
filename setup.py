"""The one compiled part of the appliance: the per-record walk of produced batches
(appliance/protocol/_recwalk.c). Everything else is configured in pyproject.toml.

Optional: without a C compiler the install goes on without it and record_contents.py walks the
records with aiokafka's parser and its own Python walk (slower, same answers)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("appliance.protocol._recwalk", ["appliance/protocol/_recwalk.c"],
                             extra_compile_args=["-O2"], optional=True)])
