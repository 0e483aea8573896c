package dev.spanflow.realtime;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;

/**
 * Malformed input to the dead-letter stream, as spanflow.spark.deadletter does it: the
 * original bytes, the reason and origin in headers, and a {@code Nats-Msg-Id} from where
 * the message came from, so a replayed batch does not dead-letter it twice.
 */
final class DeadLetters {
  private final NatsClient nc;
  private final String pipeline;
  private final String step;
  private final String stream;
  private final List<CompletableFuture<NatsClient.Ack>> inFlight = new ArrayList<>();

  DeadLetters(NatsClient nc, String pipeline, String step, String stream) {
    this.nc = nc;
    this.pipeline = pipeline;
    this.step = step;
    this.stream = stream;
  }

  void send(byte[] data, String reason, String subject, long seq) throws IOException {
    Map<String, String> headers = new LinkedHashMap<>();
    headers.put("Nats-Msg-Id", pipeline + ":" + step + ":" + seq);
    headers.put("Spanflow-Reason", clean(reason));
    headers.put("Spanflow-Pipeline", pipeline);
    headers.put("Spanflow-Step", step);
    headers.put("Spanflow-Stream", stream);
    headers.put("Spanflow-Subject", subject);
    headers.put("Spanflow-Seq", Long.toString(seq));
    headers.put("Spanflow-Time", Instant.now().truncatedTo(ChronoUnit.SECONDS).toString());
    inFlight.add(nc.publishToStream("spanflow.dlq." + pipeline + "." + step, headers, data));
    if (inFlight.size() > 1000) {
      drain(30_000);
    }
  }

  /** Wait until JetStream has stored every dead letter sent so far. */
  void drain(long timeoutMs) throws IOException {
    long deadline = System.currentTimeMillis() + timeoutMs;
    for (CompletableFuture<NatsClient.Ack> f : inFlight) {
      try {
        NatsClient.await(f, Math.max(1, deadline - System.currentTimeMillis()), "a dead letter");
      } catch (NatsClient.NoStream exc) {
        throw new IOException("no dead-letter stream captures spanflow.dlq." + pipeline, exc);
      } catch (IOException exc) {
        throw new IOException("dead letter not stored: " + exc.getMessage(), exc);
      }
    }
    inFlight.clear();
  }

  private static String clean(String reason) {
    String text = reason.replace('\r', ' ').replace('\n', ' ');
    byte[] bytes = text.getBytes(StandardCharsets.UTF_8);
    return bytes.length <= 1000 ? text : text.substring(0, Math.min(text.length(), 1000));
  }
}
