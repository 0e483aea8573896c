"""Everything that runs on Spark: the compiler (:mod:`.compile`), the connectors
(:mod:`.connectors`), the runner, keyed state, sessions. The only package that imports
pyspark. Nothing is imported here: Spark's Python workers import its modules by name.

(A package, not a namespace folder, so that pytest's doctest collection imports its
modules under their own names: a second copy of a connector module registered under
another name would replace the registered reader or writer.)
"""
