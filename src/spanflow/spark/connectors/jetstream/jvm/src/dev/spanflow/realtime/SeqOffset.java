package dev.spanflow.realtime;

import com.fasterxml.jackson.databind.JsonNode;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.PartitionOffset;

/** The next stream sequence to read, as {@code {"seq": N}} (the Python source's form). */
final class SeqOffset extends Offset implements PartitionOffset {
  private static final long serialVersionUID = 1L;
  final long seq;

  SeqOffset(long seq) {
    this.seq = seq;
  }

  static SeqOffset parse(String json) {
    try {
      JsonNode node = Json.MAPPER.readTree(json);
      return new SeqOffset(node.path("seq").asLong());
    } catch (java.io.IOException exc) {
      throw new IllegalArgumentException("not a spanflow offset: " + json, exc);
    }
  }

  @Override
  public String json() {
    return "{\"seq\":" + seq + "}";
  }
}
