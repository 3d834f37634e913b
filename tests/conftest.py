"""Shared test configuration.

Hypothesis's per-example deadline is a wall-clock check: on a loaded 2-core CI box an honest example
can take 600 ms. Tests check correctness, never speed, so every profile drops the deadline. The
``mutation`` profile (``pytest --hypothesis-profile=mutation``, used by ``tools/mutation.py``) is
kept as a name for the same settings.
"""

from hypothesis import settings

settings.register_profile("rollserve", deadline=None)
settings.register_profile("mutation", deadline=None)
settings.load_profile("rollserve")
