package dev.spanflow.realtime;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.sql.Timestamp;
import java.time.Instant;
import java.time.LocalDateTime;
import java.time.ZoneOffset;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.types.StructType;

/**
 * The micro-batch JetStream sink, on the driver: a batch's rows encoded to JSON and
 * published with pipelined acks, with no Python in the way (spanflow.spark.jetstream).
 *
 * <p>A message's {@code Nats-Msg-Id} is {@code pipeline:sink:batch:driver:digest:n}, the
 * digest of its payload and {@code n} its occurrence among equal payloads of the batch:
 * a batch Spark replays re-creates the same ids, whatever the order of its rows, and
 * JetStream drops them as duplicates within its window. Beyond the window the sink's
 * ledger (spanflow.nats.ledger) names the ids already stored, which {@link #publish}
 * skips. Columns whose names start with "_" are not published.
 *
 * <p>One connection per sink, kept across batches (reopened when lost). {@link #publish}
 * returns only when JetStream acknowledged every message, so Spark never commits a
 * batch whose output it did not store.
 */
public final class BatchSink implements AutoCloseable {
  private static final String PUBLISHED = "_published";

  private final String url;
  private final String pipeline;
  private final String sink;
  private final String subject;
  private final String orderBy;
  private final String epoch;
  private final int maxInFlight;
  private NatsClient nc;

  /**
   * {@code orderBy}: a column to publish in ascending order of (nulls last), or "";
   * {@code epoch}: the fragment's fence epoch for the Spanflow-Epoch header, or "".
   */
  public BatchSink(String url, String pipeline, String sink, String subject, String orderBy,
      String epoch, int maxInFlight) {
    this.url = url;
    this.pipeline = pipeline;
    this.sink = sink;
    this.subject = subject;
    this.orderBy = orderBy;
    this.epoch = epoch;
    this.maxInFlight = maxInFlight;
  }

  /** A batch's messages, ready to publish. */
  public static final class Encoded {
    private final List<String> subjects;
    private final List<byte[]> payloads;
    private final List<String> ids;
    private final long[] bornMicros;

    Encoded(List<String> subjects, List<byte[]> payloads, List<String> ids, long[] bornMicros) {
      this.subjects = subjects;
      this.payloads = payloads;
      this.ids = ids;
      this.bornMicros = bornMicros;
    }

    public int size() {
      return ids.size();
    }

    /** The messages' ids, one per line (one call across to Python). */
    public String idsText() {
      return String.join("\n", ids);
    }

    /**
     * When each row's source stored its record ({@code _published}, µs since the epoch,
     * little-endian longs), for rows that still carry it: the end-to-end latency.
     */
    public byte[] bornMicros() {
      ByteBuffer out = ByteBuffer.allocate(bornMicros.length * 8).order(ByteOrder.LITTLE_ENDIAN);
      for (long t : bornMicros) {
        out.putLong(t);
      }
      return out.array();
    }
  }

  /** Collect a batch to the driver and encode its rows. */
  public Encoded encode(Dataset<Row> batch, long batchId) throws IOException {
    StructType schema = batch.schema();
    List<Row> rows = new ArrayList<>(batch.collectAsList());
    int order = orderBy.isEmpty() ? -1 : Subjects.fieldIndex(schema, orderBy);
    if (order >= 0) {
      rows.sort(nullsLast(order));
    }
    int born = Subjects.fieldIndex(schema, PUBLISHED);
    String prefix = pipeline + ":" + sink + ":" + batchId + ":driver:";
    MessageDigest digest = sha256();
    Map<String, Integer> seen = new HashMap<>();
    List<String> subjects = new ArrayList<>(rows.size());
    List<byte[]> payloads = new ArrayList<>(rows.size());
    List<String> ids = new ArrayList<>(rows.size());
    long[] bornMicros = new long[rows.size()];
    int borns = 0;
    for (Row row : rows) {
      byte[] payload = JetStreamWriter.payload(row, schema);
      String hex = hex(digest.digest(payload), 12);
      int n = seen.merge(hex, 1, Integer::sum) - 1;
      subjects.add(Subjects.fill(subject, row, schema, false));
      payloads.add(payload);
      ids.add(prefix + hex + ":" + n);
      long t = born < 0 ? -1 : micros(row.get(born));
      if (t >= 0) {
        bornMicros[borns++] = t;
      }
    }
    return new Encoded(subjects, payloads, ids, Arrays.copyOf(bornMicros, borns));
  }

  /**
   * Publish the batch's messages but those whose ids are among {@code skipIds} (one per
   * line; "" for none), and wait for every ack. Returns "published duplicates lastSeq":
   * how many were sent, how many JetStream flagged duplicate, and the highest stream
   * sequence among the acks (0 when nothing was sent).
   */
  public String publish(Encoded batch, String skipIds) throws IOException {
    Set<String> skip = skipIds.isEmpty() ? Set.of() : new HashSet<>(List.of(skipIds.split("\n")));
    NatsClient client = connection();
    ArrayDeque<CompletableFuture<NatsClient.Ack>> inFlight = new ArrayDeque<>();
    long sent = 0;
    long[] acked = {0, 0}; // duplicates, highest sequence
    for (int i = 0; i < batch.size(); i++) {
      String id = batch.ids.get(i);
      if (skip.contains(id)) {
        continue;
      }
      Map<String, String> headers = new LinkedHashMap<>(4);
      headers.put("Nats-Msg-Id", id);
      if (!epoch.isEmpty()) {
        headers.put("Spanflow-Epoch", epoch);
      }
      inFlight.add(client.publishToStream(batch.subjects.get(i), headers, batch.payloads.get(i)));
      sent++;
      if (inFlight.size() >= maxInFlight) {
        while (inFlight.size() > maxInFlight / 2) {
          settle(inFlight.poll(), 60_000, acked);
        }
      }
    }
    long deadline = System.currentTimeMillis() + 60_000;
    while (!inFlight.isEmpty()) {
      settle(inFlight.poll(), Math.max(1, deadline - System.currentTimeMillis()), acked);
    }
    return sent + " " + acked[0] + " " + acked[1];
  }

  @Override
  public synchronized void close() {
    if (nc != null) {
      nc.close();
      nc = null;
    }
  }

  private synchronized NatsClient connection() throws IOException {
    if (nc == null || !nc.isOpen()) {
      if (nc != null) {
        nc.close();
      }
      nc = NatsClient.connect(url, "spanflow-sink-" + pipeline + "-" + sink);
    }
    return nc;
  }

  private void settle(CompletableFuture<NatsClient.Ack> ack, long timeoutMs, long[] acked)
      throws IOException {
    NatsClient.Ack answer = JetStream.publishAck(ack, timeoutMs, sink, subject);
    if (answer.duplicate) {
      acked[0]++;
    }
    acked[1] = Math.max(acked[1], answer.seq);
  }

  @SuppressWarnings({"unchecked", "rawtypes"})
  private static Comparator<Row> nullsLast(int index) {
    return (a, b) -> {
      Object x = a.get(index);
      Object y = b.get(index);
      if (x == null || y == null) {
        return x == null ? (y == null ? 0 : 1) : -1;
      }
      return ((Comparable) x).compareTo(y);
    };
  }

  private static long micros(Object t) {
    Instant instant;
    if (t instanceof Timestamp) {
      instant = ((Timestamp) t).toInstant();
    } else if (t instanceof Instant) {
      instant = (Instant) t;
    } else if (t instanceof LocalDateTime) {
      instant = ((LocalDateTime) t).toInstant(ZoneOffset.UTC);
    } else {
      return -1; // absent (null) or not a time
    }
    return instant.getEpochSecond() * 1_000_000L + instant.getNano() / 1000;
  }

  private static MessageDigest sha256() {
    try {
      return MessageDigest.getInstance("SHA-256");
    } catch (NoSuchAlgorithmException exc) {
      throw new IllegalStateException(exc);
    }
  }

  private static String hex(byte[] bytes, int count) {
    StringBuilder out = new StringBuilder(count * 2);
    for (int i = 0; i < count; i++) {
      out.append(Character.forDigit((bytes[i] >> 4) & 0xF, 16))
          .append(Character.forDigit(bytes[i] & 0xF, 16));
    }
    return out.toString();
  }
}
