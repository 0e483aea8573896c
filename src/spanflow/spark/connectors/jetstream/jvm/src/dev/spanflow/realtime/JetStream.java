package dev.spanflow.realtime;

import io.nats.client.api.AckPolicy;
import io.nats.client.api.ConsumerConfiguration;
import io.nats.client.api.ConsumerInfo;
import io.nats.client.api.DeliverPolicy;
import io.nats.client.api.ReplayPolicy;
import io.nats.client.api.StreamState;
import java.io.IOException;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CompletableFuture;

/** The few JetStream calls the JVM source and sinks need, through jnats's JetStream
 * management API ({@link NatsClient#management}). */
final class JetStream {

  private JetStream() {}

  /**
   * The answer to a publish, once it comes (within {@code timeoutMs}); an IOException
   * naming the sink when none comes, no stream captures {@code subject} or JetStream
   * refuses the message. A duplicate is an answer like any other.
   */
  static NatsClient.Ack publishAck(CompletableFuture<NatsClient.Ack> ack, long timeoutMs,
      String sink, String subject) throws IOException {
    try {
      return NatsClient.await(ack, timeoutMs, "a record to " + subject);
    } catch (IOException exc) {
      throw new IOException("sink " + sink + ": " + exc.getMessage(), exc);
    }
  }

  /** {first sequence, last sequence} of a stream (first is at least 1). */
  static long[] bounds(NatsClient nc, String stream) throws IOException {
    StreamState state = NatsClient.call("stream " + stream,
        () -> nc.management().getStreamInfo(stream)).getStreamState();
    return new long[] {Math.max(1, state.getFirstSequence()), state.getLastSequence()};
  }

  /**
   * An ephemeral push consumer delivering every message from {@code startSeq} on, in
   * order, without acks (the query's offsets say what was read, not the server), with
   * flow control and idle heartbeats so a stalled or lost consumer is noticed.
   * Returns the consumer's name and how many matching messages were pending.
   */
  static String[] createOrdered(NatsClient nc, String stream, List<String> filters, long startSeq,
      String deliverSubject, long heartbeatMs, String description) throws IOException {
    ConsumerConfiguration.Builder config = ConsumerConfiguration.builder()
        .deliverPolicy(DeliverPolicy.ByStartSequence)
        .startSequence(Math.max(1, startSeq))
        .ackPolicy(AckPolicy.None)
        .maxDeliver(1)
        .replayPolicy(ReplayPolicy.Instant)
        .deliverSubject(deliverSubject)
        .flowControl(heartbeatMs) // with idle heartbeats every heartbeatMs
        .memStorage(true)
        .numReplicas(1)
        .inactiveThreshold(Duration.ofMinutes(1))
        .description(description);
    if (filters.size() == 1) {
      config.filterSubject(filters.get(0));
    } else if (filters.size() > 1) {
      config.filterSubjects(filters);
    }
    ConsumerInfo made = NatsClient.call("consumer on " + stream,
        () -> nc.management().addOrUpdateConsumer(stream, config.build()));
    return new String[] {made.getName(), Long.toString(made.getNumPending())};
  }

  /**
   * Move the durable consumer that shows a pipeline's progress to {@code nextSeq} (the
   * next sequence to read), as the Python source does, so that {@code num_pending} is the
   * pipeline's lag in any NATS tool and streams with interest retention release what the
   * pipeline has committed. {@code known}: the consumer was seen before; otherwise it is
   * looked up and created when missing first (a reset of a missing consumer gets no
   * answer). Returns true once the consumer is known to exist.
   */
  static boolean advanceDurable(NatsClient nc, String stream, String consumer,
      String description, long nextSeq, boolean known) throws IOException {
    String what = "consumer " + consumer + " on " + stream;
    if (!known && !exists(nc, stream, consumer, what)) {
      ConsumerConfiguration durable = ConsumerConfiguration.builder()
          .durable(consumer)
          .deliverPolicy(DeliverPolicy.All)
          .ackPolicy(AckPolicy.All)
          .description(description)
          .build();
      NatsClient.call(what, () -> nc.management().addOrUpdateConsumer(stream, durable));
    }
    NatsClient.call("reset of " + what,
        () -> nc.management().resetConsumer(stream, consumer, Math.max(1, nextSeq)));
    return true;
  }

  private static boolean exists(NatsClient nc, String stream, String consumer, String what)
      throws IOException {
    try {
      NatsClient.call(what, () -> nc.management().getConsumerInfo(stream, consumer));
      return true;
    } catch (NatsClient.Refused exc) {
      if (exc.code == 404) {
        return false;
      }
      throw exc;
    }
  }

  /** Delete a consumer (it expires after its inactive threshold anyway). */
  static void deleteQuietly(NatsClient nc, String stream, String consumer) {
    try {
      nc.management().deleteConsumer(stream, consumer);
    } catch (Exception ignored) {
      // the consumer expires after its inactive threshold
    }
  }

  /** The stream sequence, timestamp (ns) and pending count in a JetStream delivery's reply
   * subject ({@code $JS.ACK.[domain.account.]stream.consumer.delivered.sseq.cseq.ts.pending[.token]}),
   * or null when it is not one. */
  static long[] deliveryInfo(String reply) {
    if (reply == null || !reply.startsWith("$JS.ACK.")) {
      return null;
    }
    String[] t = reply.split("\\.");
    int base;
    if (t.length == 9) {
      base = 2; // $JS.ACK.stream.consumer.delivered.sseq.cseq.ts.pending
    } else if (t.length >= 11) {
      base = 4; // $JS.ACK.domain.account.stream.consumer....
    } else {
      return null;
    }
    try {
      long streamSeq = Long.parseLong(t[base + 3]);
      long consumerSeq = Long.parseLong(t[base + 4]);
      long timestamp = Long.parseLong(t[base + 5]);
      long pending = Long.parseLong(t[base + 6]);
      return new long[] {streamSeq, consumerSeq, timestamp, pending};
    } catch (NumberFormatException exc) {
      return null;
    }
  }
}
