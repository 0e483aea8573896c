package dev.spanflow.realtime;

import java.io.IOException;
import java.util.List;
import java.util.concurrent.LinkedBlockingQueue;
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

  private static final Object RESET = new Object();
  private static final long HEARTBEAT_MS = 2000;

  private final NatsClient nc;
  private final String stream;
  private final List<String> filters;
  private final String description;
  private final LinkedBlockingQueue<Object> queue = new LinkedBlockingQueue<>();
  private long nextSeq;
  private long generation;
  private long sid = -1;
  private String consumer;
  private String deliverSubject;
  private volatile long lastHeard;
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

  /** The next record, or null when none came within {@code timeoutMs}. */
  Record poll(long timeoutMs) throws IOException {
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(Math.max(0, timeoutMs));
    while (true) {
      long left = deadline - System.nanoTime();
      Object item;
      try {
        item = left > 0 ? queue.poll(left, TimeUnit.NANOSECONDS) : queue.poll();
      } catch (InterruptedException exc) {
        Thread.currentThread().interrupt();
        throw new IOException("interrupted while reading " + stream);
      }
      if (item == null) {
        if (System.currentTimeMillis() - lastHeard > 3 * HEARTBEAT_MS) {
          subscribe(); // heartbeats stopped: the consumer or the connection is gone
        }
        return null;
      }
      if (item == RESET) {
        subscribe();
        continue;
      }
      Delivery d = (Delivery) item;
      if (d.generation != generation) {
        continue; // from a consumer we replaced
      }
      if (d.flowControlReply != null) {
        nc.publish(d.flowControlReply, null, null, new byte[0]);
        continue;
      }
      if (d.record.seq < nextSeq) {
        continue;
      }
      nextSeq = d.record.seq + 1;
      return d.record;
    }
  }

  @Override
  public void close() {
    if (sid >= 0) {
      nc.unsubscribe(sid);
    }
    if (consumer != null) {
      JetStream.deleteQuietly(nc, stream, consumer);
    }
  }

  private static final class Delivery {
    final long generation;
    final Record record;
    final String flowControlReply;

    Delivery(long generation, Record record, String flowControlReply) {
      this.generation = generation;
      this.record = record;
      this.flowControlReply = flowControlReply;
    }
  }

  private void subscribe() throws IOException {
    close();
    queue.clear();
    generation++;
    final long gen = generation;
    deliverSubject = nc.newInbox();
    final long[] expected = {1};
    sid = nc.subscribe(deliverSubject, msg -> {
      lastHeard = System.currentTimeMillis();
      if (msg.status == 100) {
        handleControl(gen, msg);
        return;
      }
      long[] info = JetStream.deliveryInfo(msg.reply);
      if (info == null) {
        return;
      }
      if (info[1] != expected[0]) {
        queue.add(RESET); // a gap: start again after the last record handed out
        expected[0] = Long.MAX_VALUE;
        return;
      }
      expected[0]++;
      queue.add(new Delivery(gen, new Record(msg, info[0], info[2], info[3]), null));
    });
    lastHeard = System.currentTimeMillis();
    String[] made = JetStream.createOrdered(nc, stream, filters, nextSeq, deliverSubject,
        HEARTBEAT_MS, description);
    consumer = made[0];
    if (gen == 1) {
      initialPending = Long.parseLong(made[1]);
    }
  }

  private void handleControl(long gen, NatsClient.Msg msg) {
    if (msg.description.toLowerCase().contains("flow")) {
      if (msg.reply != null) {
        queue.add(new Delivery(gen, null, msg.reply)); // answered in order, from poll()
      }
      return;
    }
    String stalled = msg.headers.get("Nats-Consumer-Stalled");
    if (stalled != null) {
      queue.add(new Delivery(gen, null, stalled));
    }
  }
}
