package dev.spanflow.realtime;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The source's options, the same keys as the Python source's, every one given by
 * spanflow.spark.connectors.jetstream.source.source_options: no default is written here.
 */
final class SourceOptions {
  final String url;
  final String stream;
  final String pipeline;
  final String step;
  /** The durable consumer that shows the pipeline's progress (as the Python source's). */
  final String consumer;
  final String schema;
  final String start;
  final long maxRows;
  final String scalarField;
  final boolean tombstones;
  final List<String> filters = new ArrayList<>();

  SourceOptions(Map<String, String> options) {
    url = require(options, "url");
    stream = require(options, "stream");
    pipeline = require(options, "pipeline");
    step = require(options, "step");
    String given = options.get("consumer");
    consumer = given == null || given.isEmpty() ? "spanflow-" + pipeline + "-" + step : given;
    schema = require(options, "schema");
    start = require(options, "start");
    maxRows = Long.parseLong(require(options, "max_rows"));
    scalarField = present(options, "scalar_field");
    tombstones = "true".equals(options.get("tombstones"));
    String format = require(options, "format");
    if (!format.equals("json")) {
      throw new IllegalArgumentException("the real-time JetStream source reads JSON only, not "
          + format);
    }
    try {
      for (JsonNode subject : Json.MAPPER.readTree(require(options, "filter_subjects"))) {
        filters.add(subject.asText());
      }
    } catch (IOException exc) {
      throw new IllegalArgumentException("filter_subjects is not a JSON list", exc);
    }
  }

  static HashMap<String, String> copy(Map<String, String> options) {
    HashMap<String, String> out = new HashMap<>();
    options.forEach((k, v) -> out.put(k.toLowerCase(), v));
    return out;
  }

  /** An option that must be given, and may be empty. */
  private static String present(Map<String, String> options, String key) {
    String value = options.get(key);
    if (value == null) {
      throw new IllegalArgumentException("the JetStream source needs the option " + key);
    }
    return value;
  }

  private static String require(Map<String, String> options, String key) {
    String value = options.get(key);
    if (value == null || value.isEmpty()) {
      throw new IllegalArgumentException("the JetStream source needs the option " + key);
    }
    return value;
  }
}
