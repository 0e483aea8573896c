"""Imported only by a warm-up in tests/spark/test_python_workers.py."""
