package dev.spanflow.realtime;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.streaming.PartitionOffset;
import org.apache.spark.sql.connector.read.streaming.SupportsRealTimeRead;

/**
 * Reads one {@link SeqPartition}: up to its end in a micro-batch, or for as long as Spark
 * asks in Real-Time Mode. Malformed messages are dead-lettered and skipped; the offset
 * still moves past them.
 */
final class JetStreamPartitionReader implements SupportsRealTimeRead<InternalRow> {
  private static final long MICRO_BATCH_POLL_MS = 1000;
  private static final long RANGE_STALL_MS = 60_000;
  /** The local property Spark's stream execution sets to the query's id. */
  private static final String QUERY_ID = "sql.streaming.queryId";

  private final SeqPartition partition;
  private final SourceOptions source;
  private NatsClient nc;
  private OrderedReader reader;
  private RowDecoder decoder;
  private DeadLetters deadLetters;
  private InternalRow current;
  private LiveProgress.Reader live;
  private long nextSeq;
  private boolean exhausted;

  JetStreamPartitionReader(SeqPartition partition) {
    this.partition = partition;
    this.source = new SourceOptions(partition.options);
    this.nextSeq = partition.start;
  }

  private void open() throws IOException {
    if (reader != null) {
      return;
    }
    nc = NatsClient.connect(source.url, "spanflow-rt-" + source.pipeline + "-" + source.step);
    decoder = new RowDecoder(source.schema, source.scalarField, source.tombstones);
    deadLetters = new DeadLetters(nc, source.pipeline, source.step, source.stream);
    reader = new OrderedReader(nc, source.stream, source.filters, partition.start,
        "spanflow real-time read of " + source.pipeline + "/" + source.step);
    if (reader.initialPending() == 0 && partition.end != Long.MAX_VALUE) {
      exhausted = true; // nothing matches from the start on: the range is empty
    }
    TaskContext task = TaskContext.get();
    String query = task == null ? null : task.getLocalProperty(QUERY_ID);
    if (query != null && partition.end == Long.MAX_VALUE) { // real time: show progress live
      live = LiveProgress.reader(query, source.pipeline + "/" + source.step);
      live.pending = reader.initialPending();
    }
  }

  /** Micro-batch: the next record of [start, end), or false at its end. */
  @Override
  public boolean next() throws IOException {
    if (partition.end <= partition.start) {
      return false;
    }
    open();
    long quietSince = System.currentTimeMillis();
    while (!exhausted && nextSeq < partition.end) {
      OrderedReader.Record r = reader.poll(MICRO_BATCH_POLL_MS);
      if (r == null) {
        if (System.currentTimeMillis() - quietSince > RANGE_STALL_MS) {
          throw new IOException("stream " + source.stream + " gave nothing from sequence "
              + nextSeq + " for " + RANGE_STALL_MS / 1000 + " s (purged or deleted?)");
        }
        continue;
      }
      quietSince = System.currentTimeMillis();
      if (r.seq >= partition.end) {
        exhausted = true;
        break;
      }
      nextSeq = r.seq + 1;
      if (r.pending == 0) {
        exhausted = true; // the last matching record there is (the range was planned earlier)
      }
      if (accept(r)) {
        return true;
      }
    }
    return false;
  }

  @Override
  public RecordStatus nextWithTimeout(Long timeoutMs) throws IOException {
    open();
    long deadline = System.currentTimeMillis() + timeoutMs;
    while (true) {
      long left = deadline - System.currentTimeMillis();
      OrderedReader.Record r = reader.poll(Math.max(0, left));
      if (r == null) {
        return RecordStatus.newStatusWithoutArrivalTime(false);
      }
      nextSeq = r.seq + 1;
      if (live != null) {
        live.records++; // this task's thread is the only writer
        live.pending = r.pending;
        live.lastPublishedMs = r.publishedNanos / 1_000_000L;
      }
      if (accept(r)) {
        return RecordStatus.newStatusWithArrivalTimeMs(r.publishedNanos / 1_000_000L);
      }
      if (left <= 0) {
        return RecordStatus.newStatusWithoutArrivalTime(false);
      }
    }
  }

  /**
   * A site's watermark beat (spanflow.spark.watermark_beats): never a record here. Only on
   * a cut subject, where agents alone publish; the same bytes elsewhere are a record.
   */
  private static final byte[] BEAT = "{\"_watermark\":".getBytes(StandardCharsets.UTF_8);

  private static final String CUT_PREFIX = "spanflow.cut.";

  static boolean isBeat(String subject, byte[] data) {
    if (subject == null || !subject.startsWith(CUT_PREFIX)) {
      return false;
    }
    if (data == null || data.length < BEAT.length) {
      return false;
    }
    for (int i = 0; i < BEAT.length; i++) {
      if (data[i] != BEAT[i]) {
        return false;
      }
    }
    return true;
  }

  /** Decode into {@link #current}; dead-letter and return false when it does not fit. */
  private boolean accept(OrderedReader.Record r) throws IOException {
    if (isBeat(r.msg.subject, r.msg.data)) {
      return false;
    }
    try {
      current = decoder.decode(r.msg.data, r.msg.subject, r.seq, r.publishedNanos);
      return true;
    } catch (RowDecoder.Rejected exc) {
      deadLetters.send(r.msg.data, exc.getMessage(), r.msg.subject, r.seq);
      return false;
    }
  }

  @Override
  public InternalRow get() {
    return current;
  }

  @Override
  public PartitionOffset getOffset() {
    return new SeqOffset(nextSeq);
  }

  @Override
  public void close() throws IOException {
    try {
      if (deadLetters != null) {
        deadLetters.drain(30_000);
      }
    } finally {
      if (reader != null) {
        reader.close();
      }
      if (nc != null) {
        nc.close();
      }
    }
  }
}
