package dev.spanflow.realtime;

import java.util.HashMap;
import org.apache.spark.sql.connector.read.InputPartition;

/** Sequences [start, end) of one stream; end is Long.MAX_VALUE in real-time mode. */
final class SeqPartition implements InputPartition {
  private static final long serialVersionUID = 1L;
  final long start;
  final long end;
  final HashMap<String, String> options;

  SeqPartition(long start, long end, HashMap<String, String> options) {
    this.start = start;
    this.end = end;
    this.options = options;
  }
}
