package dev.spanflow.realtime;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.DoubleAdder;
import java.util.concurrent.atomic.LongAdder;

/**
 * What each real-time query's readers have read so far, for the driver to see while a
 * batch runs: Real-Time Mode reports progress only when a batch ends, minutes apart, so
 * without this a node's load score, its dashboard and the rebalancer would see nothing
 * of a real-time query between batches.
 *
 * <p>Keyed by the streaming query's id (stable across restarts from its checkpoint) and
 * the source it reads. Counters are cumulative over the query's batches. spanflow runs
 * Spark in local mode, so tasks share the driver's JVM and this registry; on a cluster
 * the executors' counts would not reach the driver and {@link #snapshot} reports none.
 *
 * <p>A real-time query's sink counts here too ({@link #writer}): the records it published
 * and their end-to-end latency (publish time minus the source's {@code _published}), into
 * the buckets every spanflow histogram uses.
 */
public final class LiveProgress {
  /** One source's reader: written by its task thread alone, read by the driver. */
  static final class Reader {
    volatile long records;
    volatile long pending;
    volatile long lastPublishedMs;
  }

  /** Upper bounds (seconds) of the latency histogram: spanflow.protocol.metrics.LATENCY_BUCKETS. */
  public static final double[] BUCKETS = {
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0
  };

  /** A query's sink: written by its tasks (several partitions at once), read by the driver. */
  static final class Writer {
    final LongAdder records = new LongAdder();
    final LongAdder[] counts = new LongAdder[BUCKETS.length + 1];
    final DoubleAdder sum = new DoubleAdder();

    Writer() {
      for (int i = 0; i < counts.length; i++) {
        counts[i] = new LongAdder();
      }
    }

    /** One record published, {@code seconds} after its source stored it (< 0: unknown). */
    void wrote(double seconds) {
      records.increment();
      if (seconds < 0) {
        return;
      }
      int i = 0;
      while (i < BUCKETS.length && seconds > BUCKETS[i]) {
        i++;
      }
      counts[i].increment();
      sum.add(seconds);
    }
  }

  private static final Map<String, Map<String, Reader>> BY_QUERY = new ConcurrentHashMap<>();
  private static final Map<String, Writer> WRITERS = new ConcurrentHashMap<>();

  private LiveProgress() {}

  /** The counters of {@code source} in {@code queryId}: the same object across batches. */
  static Reader reader(String queryId, String source) {
    return BY_QUERY.computeIfAbsent(queryId, q -> new ConcurrentHashMap<>())
        .computeIfAbsent(source, s -> new Reader());
  }

  /** {@code {"readers":n,"records":r,"pending":p,"last_published_ms":t}} summed over the
   * query's sources (t is the latest), or {@code {"readers":0}} when none has read yet. */
  public static String snapshot(String queryId) {
    Map<String, Reader> readers = BY_QUERY.get(queryId);
    if (readers == null || readers.isEmpty()) {
      return "{\"readers\":0}";
    }
    long records = 0;
    long pending = 0;
    long last = 0;
    for (Reader r : readers.values()) {
      records += r.records;
      pending += r.pending;
      last = Math.max(last, r.lastPublishedMs);
    }
    return "{\"readers\":" + readers.size() + ",\"records\":" + records + ",\"pending\":"
        + pending + ",\"last_published_ms\":" + last + "}";
  }

  /** The sink counters of {@code queryId}: the same object across batches and tasks. */
  static Writer writer(String queryId) {
    return WRITERS.computeIfAbsent(queryId, q -> new Writer());
  }

  /** {@code {"records":n,"counts":[...],"sum":s}} of the query's sink, or {@code {}} when
   * it has written nothing yet. */
  public static String written(String queryId) {
    Writer w = WRITERS.get(queryId);
    if (w == null) {
      return "{}";
    }
    StringBuilder counts = new StringBuilder();
    for (int i = 0; i < w.counts.length; i++) {
      counts.append(i == 0 ? "" : ",").append(w.counts[i].sum());
    }
    return "{\"records\":" + w.records.sum() + ",\"counts\":[" + counts + "],\"sum\":"
        + w.sum.sum() + "}";
  }

  /** Drop a stopped query's counters. */
  public static void forget(String queryId) {
    BY_QUERY.remove(queryId);
    WRITERS.remove(queryId);
  }
}
