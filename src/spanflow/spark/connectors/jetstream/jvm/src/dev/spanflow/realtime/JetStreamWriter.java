package dev.spanflow.realtime;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.sql.Timestamp;
import java.time.Instant;
import java.time.LocalDateTime;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.ArrayDeque;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.ForeachWriter;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * Publishes each output row to JetStream as JSON, the JVM-side sink of Real-Time Mode.
 *
 * <p>Exactly once: a row's {@code Nats-Msg-Id} is {@code pipeline:sink:} plus a digest of
 * the whole row, metadata columns included. A per-event row carries its source sequence
 * (_seq) and an aggregate's update carries its update number (_updates), so every distinct
 * output has a distinct id, and a batch Spark replays after a crash re-creates the same
 * rows, whose ids JetStream drops as duplicates within the stream's duplicate window.
 * Columns whose names start with "_" are not published.
 *
 * <p>Publishes are pipelined: up to {@code maxInFlight} wait for their acks; {@link #close}
 * waits for the rest, and any failed ack fails the task, so Spark never commits a batch
 * whose output JetStream did not store.
 */
public final class JetStreamWriter extends ForeachWriter<Row> {
  private static final long serialVersionUID = 1L;
  private static final JsonFactory JSON = new JsonFactory();
  private static final DateTimeFormatter SECONDS =
      DateTimeFormatter.ofPattern("yyyy-MM-dd'T'HH:mm:ss");

  private final String url;
  private final String pipeline;
  private final String sink;
  private final String subject;
  private final String epoch;
  private final int maxInFlight;

  private transient NatsClient nc;
  private transient ArrayDeque<CompletableFuture<NatsClient.Ack>> inFlight;
  private transient MessageDigest digest;
  private transient LiveProgress.Writer live;

  /** {@code epoch}: the fragment's fence epoch for the Spanflow-Epoch header, or "". */
  public JetStreamWriter(String url, String pipeline, String sink, String subject, String epoch,
      int maxInFlight) {
    this.url = url;
    this.pipeline = pipeline;
    this.sink = sink;
    this.subject = subject;
    this.epoch = epoch;
    this.maxInFlight = maxInFlight;
  }

  @Override
  public boolean open(long partitionId, long epochId) {
    try {
      nc = NatsClient.connect(url, "spanflow-rt-sink-" + pipeline + "-" + sink);
      inFlight = new ArrayDeque<>();
      digest = MessageDigest.getInstance("SHA-256");
      TaskContext task = TaskContext.get();
      String query = task == null ? null : task.getLocalProperty("sql.streaming.queryId");
      live = query == null ? null : LiveProgress.writer(query);
      return true;
    } catch (IOException exc) {
      throw new IllegalStateException("sink " + sink + ": " + exc.getMessage(), exc);
    } catch (NoSuchAlgorithmException exc) {
      throw new IllegalStateException(exc);
    }
  }

  @Override
  public void process(Row row) {
    try {
      StructType schema = row.schema();
      byte[] payload = payload(row, schema);
      Map<String, String> headers = new LinkedHashMap<>();
      headers.put("Nats-Msg-Id", pipeline + ":" + sink + ":" + rowId(row, schema, payload));
      if (!epoch.isEmpty()) {
        headers.put("Spanflow-Epoch", epoch);
      }
      inFlight.add(nc.publishToStream(Subjects.fill(subject, row, schema, true), headers, payload));
      while (inFlight.size() > maxInFlight) {
        settle(inFlight.poll(), 60_000);
      }
      if (live != null) {
        live.wrote(secondsSincePublished(row, schema));
      }
    } catch (IOException exc) {
      throw new IllegalStateException("sink " + sink + ": " + exc.getMessage(), exc);
    }
  }

  @Override
  public void close(Throwable error) {
    try {
      if (error == null && inFlight != null) {
        long deadline = System.currentTimeMillis() + 60_000;
        while (!inFlight.isEmpty()) {
          settle(inFlight.poll(), Math.max(1, deadline - System.currentTimeMillis()));
        }
      }
    } catch (IOException exc) {
      throw new IllegalStateException("sink " + sink + ": " + exc.getMessage(), exc);
    } finally {
      if (nc != null) {
        nc.close();
      }
    }
  }

  /** Seconds from when the source stored the row's record ({@code _published}) to now;
   * -1 for a row that does not carry it. */
  private static double secondsSincePublished(Row row, StructType schema) {
    int at = Subjects.fieldIndex(schema, "_published");
    if (at < 0 || row.isNullAt(at)) {
      return -1;
    }
    Object v = row.get(at);
    long micros;
    if (v instanceof Timestamp) {
      Timestamp t = (Timestamp) v;
      micros = t.getTime() / 1000 * 1_000_000 + t.getNanos() / 1000;
    } else if (v instanceof Instant) {
      Instant t = (Instant) v;
      micros = t.getEpochSecond() * 1_000_000 + t.getNano() / 1000;
    } else {
      return -1;
    }
    return Math.max(0.0, (System.currentTimeMillis() * 1000 - micros) / 1e6);
  }

  private void settle(CompletableFuture<NatsClient.Ack> ack, long timeoutMs) throws IOException {
    JetStream.publishAck(ack, timeoutMs, sink, subject); // an error fails the task
  }

  private String rowId(Row row, StructType schema, byte[] payload) {
    digest.reset();
    digest.update(payload);
    StructField[] fields = schema.fields();
    for (int i = 0; i < fields.length; i++) {
      if (fields[i].name().startsWith("_")) {
        digest.update((byte) 0);
        digest.update(fields[i].name().getBytes(StandardCharsets.UTF_8));
        digest.update((byte) '=');
        digest.update(String.valueOf(row.get(i)).getBytes(StandardCharsets.UTF_8));
      }
    }
    byte[] d = digest.digest();
    StringBuilder hex = new StringBuilder(32);
    for (int i = 0; i < 16; i++) {
      hex.append(Character.forDigit((d[i] >> 4) & 0xF, 16)).append(Character.forDigit(d[i] & 0xF, 16));
    }
    return hex.toString();
  }

  static byte[] payload(Row row, StructType schema) throws IOException {
    ByteArrayOutputStream bytes = new ByteArrayOutputStream(256);
    try (JsonGenerator g = JSON.createGenerator(bytes)) {
      writeStruct(g, row, schema, true);
    }
    return bytes.toByteArray();
  }

  private static void writeStruct(JsonGenerator g, Row row, StructType schema, boolean top)
      throws IOException {
    g.writeStartObject();
    StructField[] fields = schema.fields();
    for (int i = 0; i < fields.length; i++) {
      if (top && fields[i].name().startsWith("_")) {
        continue;
      }
      g.writeFieldName(fields[i].name());
      writeValue(g, row.get(i));
    }
    g.writeEndObject();
  }

  private static void writeValue(JsonGenerator g, Object v) throws IOException {
    if (v == null) {
      g.writeNull();
    } else if (v instanceof String) {
      g.writeString((String) v);
    } else if (v instanceof Long || v instanceof Integer || v instanceof Short
        || v instanceof Byte) {
      g.writeNumber(((Number) v).longValue());
    } else if (v instanceof Double || v instanceof Float) {
      double d = ((Number) v).doubleValue();
      if (Double.isNaN(d) || Double.isInfinite(d)) {
        g.writeNull(); // JSON has no NaN
      } else {
        g.writeNumber(d);
      }
    } else if (v instanceof BigDecimal) {
      g.writeNumber((BigDecimal) v);
    } else if (v instanceof Boolean) {
      g.writeBoolean((Boolean) v);
    } else if (v instanceof Timestamp) {
      g.writeString(isoUtc(((Timestamp) v).toInstant()));
    } else if (v instanceof Instant) {
      g.writeString(isoUtc((Instant) v));
    } else if (v instanceof LocalDateTime) {
      g.writeString(isoUtc(((LocalDateTime) v).toInstant(ZoneOffset.UTC)));
    } else if (v instanceof java.sql.Date || v instanceof java.time.LocalDate) {
      g.writeString(v.toString());
    } else if (v instanceof byte[]) {
      g.writeString(new String((byte[]) v, StandardCharsets.UTF_8));
    } else if (v instanceof Row) {
      Row r = (Row) v;
      writeStruct(g, r, r.schema(), false);
    } else if (v instanceof scala.collection.Seq) {
      g.writeStartArray();
      scala.collection.Iterator<?> it = ((scala.collection.Seq<?>) v).iterator();
      while (it.hasNext()) {
        writeValue(g, it.next());
      }
      g.writeEndArray();
    } else if (v instanceof List) {
      g.writeStartArray();
      for (Object item : (List<?>) v) {
        writeValue(g, item);
      }
      g.writeEndArray();
    } else if (v instanceof scala.collection.Map) {
      g.writeStartObject();
      scala.collection.Iterator<?> it = ((scala.collection.Map<?, ?>) v).iterator();
      while (it.hasNext()) {
        scala.Tuple2<?, ?> e = (scala.Tuple2<?, ?>) it.next();
        g.writeFieldName(String.valueOf(e._1()));
        writeValue(g, e._2());
      }
      g.writeEndObject();
    } else {
      g.writeString(v.toString());
    }
  }

  /** As orjson writes a UTC datetime: seconds, then .ffffff only when non-zero, then Z. */
  static String isoUtc(Instant instant) {
    LocalDateTime t = LocalDateTime.ofInstant(instant, ZoneOffset.UTC);
    String base = t.format(SECONDS);
    int micros = t.getNano() / 1000;
    return micros == 0 ? base + "Z" : base + String.format(".%06dZ", micros);
  }
}
