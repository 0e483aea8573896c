"""Word count: lines of text in, a running count per word out (updated every batch).

./dev run examples/word_count.yaml --feed examples/data/lines.jsonl
"""

import spanflow as sf


def word_count() -> sf.Flow:
    p = sf.Pipeline("word-count", trigger="1s")
    return (
        p.source("LINES", subjects=["lines.>"], schema={"line": "string"}, id="lines")
        .select("explode(split(lower(line), '[^a-z0-9]+')) AS word", id="words")
        .filter("word != ''", id="non_empty")
        .key_by("word", id="by_word")
        .aggregate(count="count", id="counts")
        .sink_console(id="out")
    )


flow = word_count()
