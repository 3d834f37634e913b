"""Shared test configuration.

The ``mutation`` hypothesis profile (``pytest --hypothesis-profile=mutation``) drops the per-example
deadline: ``tools/mutation.py`` traces every call, which makes examples slower but not wrong.
"""

from hypothesis import settings

settings.register_profile("mutation", deadline=None)
