package dev.spanflow.realtime;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.CompletableFuture;

/** The few JetStream API calls the JVM source and sinks need, over {@link NatsClient}. */
final class JetStream {
  static final long API_TIMEOUT_MS = 5000;
  static final long NANOS_PER_MS = 1_000_000L;

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
    NatsClient.Msg msg = nc.request("$JS.API.STREAM.INFO." + stream, new byte[0], API_TIMEOUT_MS);
    JsonNode state = Json.apiAnswer(msg, "stream " + stream).path("state");
    return new long[] {Math.max(1, state.path("first_seq").asLong(1)), state.path("last_seq").asLong(0)};
  }

  /**
   * An ephemeral push consumer delivering every message from {@code startSeq} on, in
   * order, without acks (the query's offsets say what was read, not the server), with
   * flow control and idle heartbeats so a stalled or lost consumer is noticed.
   * Returns the consumer's name and how many matching messages were pending.
   */
  static String[] createOrdered(NatsClient nc, String stream, List<String> filters, long startSeq,
      String deliverSubject, long heartbeatMs, String description) throws IOException {
    ObjectNode config = Json.object();
    config.put("deliver_policy", "by_start_sequence");
    config.put("opt_start_seq", Math.max(1, startSeq));
    config.put("ack_policy", "none");
    config.put("max_deliver", 1);
    config.put("replay_policy", "instant");
    config.put("deliver_subject", deliverSubject);
    config.put("flow_control", true);
    config.put("idle_heartbeat", heartbeatMs * NANOS_PER_MS);
    config.put("mem_storage", true);
    config.put("num_replicas", 1);
    config.put("inactive_threshold", 60_000L * NANOS_PER_MS);
    config.put("description", description);
    if (filters.size() == 1) {
      config.put("filter_subject", filters.get(0));
    } else if (filters.size() > 1) {
      ArrayNode subjects = config.putArray("filter_subjects");
      filters.forEach(subjects::add);
    }
    ObjectNode request = Json.object();
    request.put("stream_name", stream);
    request.set("config", config);
    NatsClient.Msg msg = nc.request("$JS.API.CONSUMER.CREATE." + stream, Json.bytes(request),
        API_TIMEOUT_MS);
    JsonNode answer = Json.apiAnswer(msg, "consumer on " + stream);
    return new String[] {answer.path("name").asText(), answer.path("num_pending").asText("0")};
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
    if (!known) {
      NatsClient.Msg info = nc.request("$JS.API.CONSUMER.INFO." + stream + "." + consumer,
          new byte[0], API_TIMEOUT_MS);
      if (Json.parse(info.data).path("error").path("code").asInt(0) == 404) {
        ObjectNode config = Json.object();
        config.put("durable_name", consumer);
        config.put("deliver_policy", "all");
        config.put("ack_policy", "all");
        config.put("description", description);
        ObjectNode request = Json.object();
        request.put("stream_name", stream);
        request.set("config", config);
        Json.apiAnswer(nc.request("$JS.API.CONSUMER.CREATE." + stream + "." + consumer,
            Json.bytes(request), API_TIMEOUT_MS), "consumer " + consumer + " on " + stream);
      } else {
        Json.apiAnswer(info, "consumer " + consumer + " on " + stream);
      }
    }
    byte[] body = ("{\"seq\":" + Math.max(1, nextSeq) + "}").getBytes(StandardCharsets.UTF_8);
    Json.apiAnswer(nc.request("$JS.API.CONSUMER.RESET." + stream + "." + consumer, body,
        API_TIMEOUT_MS), "reset of consumer " + consumer + " on " + stream);
    return true;
  }

  /** Delete a consumer without waiting for the answer (it expires anyway). */
  static void deleteQuietly(NatsClient nc, String stream, String consumer) {
    try {
      nc.publishForReply("$JS.API.CONSUMER.DELETE." + stream + "." + consumer, null, new byte[0]);
    } catch (IOException ignored) {
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
