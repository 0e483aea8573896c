package dev.spanflow.realtime;

import java.util.EnumSet;
import java.util.HashMap;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code spark.readStream.format("spanflow_jetstream_rt")}: a JetStream stream as a Spark
 * source that serves both micro-batch triggers and Real-Time Mode. The schema is the
 * {@code ddl} option (record fields, then _subject, _seq, _published, _heartbeat).
 */
public final class JetStreamSourceProvider implements TableProvider, DataSourceRegister {
  public static final String NAME = "spanflow_jetstream_rt";

  @Override
  public String shortName() {
    return NAME;
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    String ddl = options.get("ddl");
    if (ddl == null || ddl.isEmpty()) {
      throw new IllegalArgumentException("the JetStream source needs the option ddl");
    }
    return StructType.fromDDL(ddl);
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new JetStreamTable(schema);
  }

  static final class JetStreamTable implements SupportsRead {
    private final StructType schema;

    JetStreamTable(StructType schema) {
      this.schema = schema;
    }

    @Override
    public String name() {
      return NAME;
    }

    @Override
    public StructType schema() {
      return schema;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.MICRO_BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      HashMap<String, String> copy = SourceOptions.copy(options.asCaseSensitiveMap());
      new SourceOptions(copy); // validate now, on the driver, with a clear message
      return () -> new Scan() {
        @Override
        public StructType readSchema() {
          return schema;
        }

        @Override
        public String description() {
          return "JetStream " + copy.get("stream");
        }

        @Override
        public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
          return new JetStreamStream(copy);
        }
      };
    }
  }
}
