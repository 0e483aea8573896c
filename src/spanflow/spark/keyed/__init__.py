"""Keyed state on Spark: users' processors, count windows, running aggregates and the
state they keep between batches (applyInPandasWithState)."""
