package dev.spanflow.realtime;

import java.io.IOException;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * Reads a stream in sequence order from a given sequence on, as an ordered consumer does:
 * an ephemeral push consumer per attempt; a gap in its delivery sequence, a missed
 * heartbeat or a lost consumer makes a new one from the next unread sequence. Flow-control
 * requests are answered only once the caller has taken every message before them, so the
 * server never runs ahead of the query by more than its flow-control window.
 */
final class OrderedReader implements AutoCloseable {
  /** A delivered record with its place in the stream. */
  static final class Record {
    final NatsClient.Msg msg;
    final long seq;
    final long publishedNanos;
    final long pending;

    Record(NatsClient.Msg msg, long seq, long publishedNanos, long pending) {
      this.msg = msg;
      this.seq = seq;
      this.publishedNanos = publishedNanos;
      this.pending = pending;
    }
  }

  private static final long HEARTBEAT_MS = 2000;

  private final NatsClient nc;
  private final String stream;
  private final List<String> filters;
  private final String description;
  private long nextSeq;
  private long attempts;
  private NatsClient.Inbox inbox;
  private long expected;
  private String consumer;
  private long lastHeard;
  private long initialPending;

  OrderedReader(NatsClient nc, String stream, List<String> filters, long startSeq, String description)
      throws IOException {
    this.nc = nc;
    this.stream = stream;
    this.filters = filters;
    this.description = description;
    this.nextSeq = startSeq;
    subscribe();
  }

  /** Matching messages the server had from the start sequence on when the (first)
   * consumer was made. */
  long initialPending() {
    return initialPending;
  }

  /** The next record, or null when none came within {@code timeoutMs}. Read on the
   * caller's thread, straight from the connection's reader: no hand-off in between. */
  Record poll(long timeoutMs) throws IOException {
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(Math.max(0, timeoutMs));
    while (true) {
      NatsClient.Msg msg;
      try {
        msg = inbox.next(deadline - System.nanoTime());
      } catch (InterruptedException exc) {
        Thread.currentThread().interrupt();
        throw new IOException("interrupted while reading " + stream);
      }
      if (msg == null) {
        if (System.currentTimeMillis() - lastHeard > 3 * HEARTBEAT_MS) {
          subscribe(); // heartbeats stopped: the consumer or the connection is gone
        }
        return null;
      }
      lastHeard = System.currentTimeMillis();
      if (msg.status == 100) {
        answerControl(msg);
        continue;
      }
      long[] info = JetStream.deliveryInfo(msg.reply);
      if (info == null) {
        continue;
      }
      if (info[1] != expected) {
        subscribe(); // a gap: start again after the last record handed out
        continue;
      }
      expected++;
      if (info[0] < nextSeq) {
        continue;
      }
      nextSeq = info[0] + 1;
      return new Record(msg, info[0], info[2], info[3]);
    }
  }

  @Override
  public void close() {
    if (inbox != null) {
      inbox.close();
      inbox = null;
    }
    if (consumer != null) {
      JetStream.deleteQuietly(nc, stream, consumer);
      consumer = null;
    }
  }

  private void subscribe() throws IOException {
    close();
    attempts++;
    String deliverSubject = nc.newInbox();
    inbox = nc.subscribeSync(deliverSubject);
    expected = 1;
    lastHeard = System.currentTimeMillis();
    String[] made = JetStream.createOrdered(nc, stream, filters, nextSeq, deliverSubject,
        HEARTBEAT_MS, description);
    consumer = made[0];
    if (attempts == 1) {
      initialPending = Long.parseLong(made[1]);
    }
  }

  /** A flow-control request is answered when it is read: every message before it has
   * been handed out by then. A stalled consumer is told to go on the same way. */
  private void answerControl(NatsClient.Msg msg) throws IOException {
    if (msg.description.toLowerCase().contains("flow")) {
      if (msg.reply != null) {
        nc.publish(msg.reply, null, null, new byte[0]);
      }
      return;
    }
    String stalled = msg.headers.get("Nats-Consumer-Stalled");
    if (stalled != null) {
      nc.publish(stalled, null, null, new byte[0]);
    }
  }
}
