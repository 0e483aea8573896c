"""The JVM and Python processes Spark runs: jars, the Java runtime, the class-data
archive, the Python worker daemon and its logs, executors on a Spark cluster."""
