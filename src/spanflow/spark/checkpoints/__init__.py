"""Where a query's progress lives and how it moves: checkpoint stores (local, Hadoop,
``jetstream://``), a peer's copy, the pipeline version a checkpoint was made by, and
sources named in offsets."""
