package dev.spanflow.realtime;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

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
 */
public final class LiveProgress {
  /** One source's reader: written by its task thread alone, read by the driver. */
  static final class Reader {
    volatile long records;
    volatile long pending;
    volatile long lastPublishedMs;
  }

  private static final Map<String, Map<String, Reader>> BY_QUERY = new ConcurrentHashMap<>();

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

  /** Drop a stopped query's counters. */
  public static void forget(String queryId) {
    BY_QUERY.remove(queryId);
  }
}
