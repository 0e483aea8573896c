"""Servers spanflow starts on this machine for development, examples and tests."""
