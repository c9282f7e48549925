"""Test doubles for the libraries smlens talks to."""
