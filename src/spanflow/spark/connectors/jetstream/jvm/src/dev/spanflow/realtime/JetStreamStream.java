package dev.spanflow.realtime;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.HashMap;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.PartitionOffset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.SupportsAdmissionControl;
import org.apache.spark.sql.connector.read.streaming.SupportsRealTimeMode;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Offsets are stream sequences ({@link SeqOffset}: the next one to read). A micro-batch
 * reads the exact range [start, end) its offsets name, so a replayed batch reads the same
 * records. In Real-Time Mode a batch starts at its start offset and its one task reads on
 * until Spark ends the batch; the offset it reached is logged when the batch ends, and a
 * crashed batch is read again from its start.
 */
final class JetStreamStream implements MicroBatchStream, SupportsAdmissionControl,
    SupportsRealTimeMode {
  private static final Logger LOG = LoggerFactory.getLogger(JetStreamStream.class);
  private final HashMap<String, String> options;
  private final SourceOptions source;
  private NatsClient driverClient;
  private boolean durableKnown;

  JetStreamStream(HashMap<String, String> options) {
    this.options = options;
    this.source = new SourceOptions(options);
  }

  private synchronized long[] bounds() {
    try {
      if (driverClient == null || !driverClient.isOpen()) {
        driverClient = NatsClient.connect(source.url, "spanflow-rt-driver-" + source.pipeline);
      }
      return JetStream.bounds(driverClient, source.stream);
    } catch (IOException exc) {
      if (driverClient != null) {
        driverClient.close();
        driverClient = null;
      }
      throw new UncheckedIOException("JetStream stream " + source.stream + ": " + exc.getMessage(),
          exc);
    }
  }

  @Override
  public Offset initialOffset() {
    long[] b = bounds();
    return new SeqOffset("latest".equals(source.start) ? b[1] + 1 : b[0]);
  }

  @Override
  public Offset deserializeOffset(String json) {
    return SeqOffset.parse(json);
  }

  @Override
  public ReadLimit getDefaultReadLimit() {
    return ReadLimit.maxRows(source.maxRows);
  }

  @Override
  public Offset latestOffset() {
    return new SeqOffset(bounds()[1] + 1);
  }

  @Override
  public Offset latestOffset(Offset startOffset, ReadLimit limit) {
    long start = ((SeqOffset) startOffset).seq;
    long[] b = bounds();
    long begin = Math.max(start, b[0]);
    long end = b[1] + 1;
    if (limit instanceof ReadMaxRows) {
      end = Math.min(end, begin + ((ReadMaxRows) limit).maxRows());
    }
    return new SeqOffset(Math.max(end, start));
  }

  @Override
  public Offset reportLatestOffset() {
    return latestOffset();
  }

  @Override
  public InputPartition[] planInputPartitions(Offset start, Offset end) {
    return new InputPartition[] {
      new SeqPartition(((SeqOffset) start).seq, ((SeqOffset) end).seq, options)
    };
  }

  @Override
  public InputPartition[] planInputPartitions(Offset start) {
    return new InputPartition[] {new SeqPartition(((SeqOffset) start).seq, Long.MAX_VALUE, options)};
  }

  @Override
  public Offset mergeOffsets(PartitionOffset[] offsets) {
    long seq = 0;
    for (PartitionOffset offset : offsets) {
      seq = Math.max(seq, ((SeqOffset) offset).seq);
    }
    return new SeqOffset(seq);
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new ReaderFactory();
  }

  /** The query's progress is its offset and commit logs; the durable consumer mirrors it
   * for NATS tools and interest retention, so failing to move it only logs a warning. */
  @Override
  public synchronized void commit(Offset end) {
    try {
      bounds(); // (re)connects the driver's client
      durableKnown = JetStream.advanceDurable(driverClient, source.stream, source.consumer,
          "spanflow progress of " + source.pipeline + "/" + source.step, ((SeqOffset) end).seq,
          durableKnown);
    } catch (IOException | RuntimeException exc) {
      durableKnown = false;
      LOG.warn("could not advance consumer {} on {}: {}", source.consumer, source.stream,
          exc.getMessage());
    }
  }

  @Override
  public synchronized void stop() {
    if (driverClient != null) {
      driverClient.close();
      driverClient = null;
    }
  }

  static final class ReaderFactory implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;

    @Override
    public org.apache.spark.sql.connector.read.PartitionReader<
        org.apache.spark.sql.catalyst.InternalRow> createReader(InputPartition partition) {
      return new JetStreamPartitionReader((SeqPartition) partition);
    }
  }
}
