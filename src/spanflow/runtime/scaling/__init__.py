"""A node on a Spark cluster asks for executors when its fragments fall behind and
gives them back when they idle: ``policy`` decides (pure), ``autoscaler`` acts."""
