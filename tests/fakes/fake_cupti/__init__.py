"""Test double of cupti-python 13.4.0 (the ``cupti`` package); tests put this directory on sys.path."""
