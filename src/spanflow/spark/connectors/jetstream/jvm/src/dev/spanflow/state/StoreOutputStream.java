package dev.spanflow.state;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import dev.spanflow.realtime.NatsClient;
import java.io.IOException;
import java.io.OutputStream;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.zip.CRC32C;

/**
 * Writes a file's bytes as chunks (acks pipelined, {@link Store#IN_FLIGHT} at a time) and,
 * on close, its metadata: until then readers see the previous file or none.
 */
final class StoreOutputStream extends OutputStream {
  private static final class Pending {
    final byte[] data;
    final CompletableFuture<NatsClient.Ack> ack;

    Pending(byte[] data, CompletableFuture<NatsClient.Ack> ack) {
      this.data = data;
      this.ack = ack;
    }
  }

  private final Store store;
  private final String path;
  private final long expect;
  private final Store.Meta previous;
  private final String id = UUID.randomUUID().toString().replace("-", "");
  private final byte[] buffer;
  private int filled;
  private long length;
  private final Deque<Pending> inFlight = new ArrayDeque<>();
  private final List<Long> seqs = new ArrayList<>();
  private final List<Long> crcs = new ArrayList<>();
  private boolean closed;

  /** {@code expect}: as {@link Store#putMeta}; {@code previous}: the file this replaces. */
  StoreOutputStream(Store store, String path, int chunkBytes, long expect, Store.Meta previous) {
    this.store = store;
    this.path = path;
    this.expect = expect;
    this.previous = previous;
    this.buffer = new byte[chunkBytes];
  }

  @Override
  public void write(int b) throws IOException {
    ensureOpen();
    buffer[filled++] = (byte) b;
    if (filled == buffer.length) {
      ship();
    }
  }

  @Override
  public void write(byte[] b, int off, int len) throws IOException {
    ensureOpen();
    while (len > 0) {
      int n = Math.min(len, buffer.length - filled);
      System.arraycopy(b, off, buffer, filled, n);
      filled += n;
      off += n;
      len -= n;
      if (filled == buffer.length) {
        ship();
      }
    }
  }

  @Override
  public void close() throws IOException {
    if (closed) {
      return;
    }
    closed = true;
    if (filled > 0) {
      ship();
    }
    while (!inFlight.isEmpty()) {
      settle(inFlight.removeFirst());
    }
    ObjectNode doc = Store.JSON.createObjectNode();
    doc.put("id", id);
    doc.put("len", length);
    doc.put("chunk", buffer.length);
    ArrayNode seqList = doc.putArray("seqs");
    seqs.forEach(seqList::add);
    ArrayNode crcList = doc.putArray("crcs");
    crcs.forEach(crcList::add);
    doc.put("mtime", System.currentTimeMillis());
    long seq = store.putMeta(path, doc, expect);
    if (seq < 0) {
      store.purgeData(id);
      throw new org.apache.hadoop.fs.FileAlreadyExistsException(
          "jetstream://" + store.name + path + " was created by another writer meanwhile");
    }
    if (previous != null && !previous.isDir() && !previous.id().isEmpty()) {
      store.purgeData(previous.id());
    }
  }

  private void ship() throws IOException {
    byte[] chunk = java.util.Arrays.copyOf(buffer, filled);
    CRC32C crc = new CRC32C();
    crc.update(chunk);
    crcs.add(crc.getValue());
    length += filled;
    filled = 0;
    if (inFlight.size() >= Store.IN_FLIGHT) {
      settle(inFlight.removeFirst());
    }
    inFlight.addLast(new Pending(chunk, store.publishChunk(id, chunk)));
  }

  /** Wait for a chunk's ack; publish it again (and wait) when the first try was lost. */
  private void settle(Pending pending) throws IOException {
    String what = "chunk " + (seqs.size() + 1) + " of jetstream://" + store.name + path;
    try {
      seqs.add(store.awaitAck(pending.ack, what).seq);
      return;
    } catch (Store.ApiError exc) {
      if (!exc.transientError()) {
        throw exc;
      }
    } catch (IOException lost) {
      // the connection broke or the answer did not come: publish again below
    }
    seqs.add(store.retry("writing " + what,
        c -> store.awaitAck(c.publishToStream(store.dataSubject(id), null, pending.data),
            what).seq));
  }

  private void ensureOpen() throws IOException {
    if (closed) {
      throw new IOException("jetstream://" + store.name + path + " is closed");
    }
  }
}
