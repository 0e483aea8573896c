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

  /** How long one publish waits for its ack before it is sent again. */
  static final long ACK_WAIT_MS = 2_000;
  /** Pause between two rounds of publishes the stream did not acknowledge. */
  static final long RETRY_PAUSE_MS = 200;
  /** How long a batch keeps trying before its failure goes to Spark. */
  static final long PUBLISH_DEADLINE_MS = 60_000;

  /**
   * Publish the batch's messages but those whose ids are among {@code skipIds} (one per
   * line; "" for none), and wait for every ack. Returns "published duplicates lastSeq":
   * how many were sent, how many JetStream flagged duplicate, and the highest stream
   * sequence among the acks (0 when nothing was sent).
   *
   * <p>A message without an ack — the stream elects a leader after a NATS server died
   * (4 to 9 s), the connection broke — is sent again, with its id, in rounds until
   * {@link #PUBLISH_DEADLINE_MS}: JetStream stores it once. Failing the batch instead
   * would restart the query, which costs seconds more than the election. A refusal
   * (JetStream said no) fails at once.
   */
  public String publish(Encoded batch, String skipIds) throws IOException {
    Set<String> skip = skipIds.isEmpty() ? Set.of() : new HashSet<>(List.of(skipIds.split("\n")));
    List<Integer> todo = new ArrayList<>(batch.size());
    for (int i = 0; i < batch.size(); i++) {
      if (!skip.contains(batch.ids.get(i))) {
        todo.add(i);
      }
    }
    long sent = todo.size();
    long[] acked = {0, 0}; // duplicates, highest sequence
    long deadline = System.currentTimeMillis() + PUBLISH_DEADLINE_MS;
    IOException[] last = {null};
    while (true) {
      todo = publishRound(batch, todo, acked, last);
      if (todo.isEmpty()) {
        return sent + " " + acked[0] + " " + acked[1];
      }
      if (System.currentTimeMillis() + RETRY_PAUSE_MS > deadline) {
        throw new IOException("sink " + sink + ": " + todo.size() + " messages to " + subject
            + " not acknowledged within " + PUBLISH_DEADLINE_MS / 1000 + " s: "
            + last[0].getMessage(), last[0]);
      }
      sleep(RETRY_PAUSE_MS); // connection() replaces a broken connection
    }
  }

  /** One pass over {@code todo} (indices into the batch); returns those without an ack
   * (their last failure in {@code last}). */
  private List<Integer> publishRound(Encoded batch, List<Integer> todo, long[] acked,
      IOException[] last) throws IOException {
    List<Integer> missing = new ArrayList<>();
    NatsClient client;
    try {
      client = connection();
    } catch (IOException exc) {
      last[0] = exc;
      return todo;
    }
    ArrayDeque<Integer> order = new ArrayDeque<>();
    ArrayDeque<CompletableFuture<NatsClient.Ack>> inFlight = new ArrayDeque<>();
    // Each publish waits ACK_WAIT_MS from its send, not from when its turn to settle
    // comes: waiting 2 s per missing ack in turn made a round with k lost acks (sent to
    // a leader that died) last 2k s before the next round resent them.
    ArrayDeque<Long> due = new ArrayDeque<>();
    for (int k = 0; k < todo.size(); k++) {
      int i = todo.get(k);
      Map<String, String> headers = new LinkedHashMap<>(4);
      headers.put("Nats-Msg-Id", batch.ids.get(i));
      if (!epoch.isEmpty()) {
        headers.put("Spanflow-Epoch", epoch);
      }
      try {
        inFlight.add(client.publishToStream(batch.subjects.get(i), headers,
            batch.payloads.get(i)));
        order.add(i);
        due.add(System.currentTimeMillis() + ACK_WAIT_MS);
      } catch (IOException exc) { // the connection is gone: the rest waits for the next round
        last[0] = exc;
        missing.addAll(todo.subList(k, todo.size()));
        break;
      }
      if (inFlight.size() >= maxInFlight) {
        while (inFlight.size() > maxInFlight / 2) {
          settle(inFlight.poll(), order.poll(), due.poll(), acked, missing, last);
        }
      }
    }
    while (!inFlight.isEmpty()) {
      settle(inFlight.poll(), order.poll(), due.poll(), acked, missing, last);
    }
    return missing;
  }

  private void settle(CompletableFuture<NatsClient.Ack> ack, int index, long dueAt,
      long[] acked, List<Integer> missing, IOException[] last) throws IOException {
    NatsClient.Ack answer;
    try {
      long left = Math.max(1, dueAt - System.currentTimeMillis());
      answer = JetStream.publishAck(ack, left, sink, subject);
    } catch (IOException exc) {
      if (exc.getCause() instanceof NatsClient.Refused) {
        throw exc;
      }
      last[0] = exc;
      missing.add(index);
      return;
    }
    if (answer.duplicate) {
      acked[0]++;
    }
    acked[1] = Math.max(acked[1], answer.seq);
  }

  private static void sleep(long ms) throws IOException {
    try {
      Thread.sleep(ms);
    } catch (InterruptedException exc) {
      Thread.currentThread().interrupt();
      throw new IOException("interrupted while publishing", exc);
    }
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
