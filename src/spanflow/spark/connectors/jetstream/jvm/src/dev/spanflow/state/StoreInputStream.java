package dev.spanflow.state;

import com.fasterxml.jackson.databind.JsonNode;
import dev.spanflow.realtime.NatsClient;
import java.io.EOFException;
import java.io.IOException;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.zip.CRC32C;
import org.apache.hadoop.fs.FSInputStream;

/**
 * Reads a file chunk by chunk, asking for the next few chunks ahead of a sequential
 * reader. Every chunk is checked against the CRC-32C its metadata recorded: a missing or
 * altered chunk is an error naming the file, never short or wrong data.
 */
final class StoreInputStream extends FSInputStream {
  private static final int AHEAD = 8;

  private final Store store;
  private final String url;
  private final String dataSubject;
  private final long length;
  private final int chunkBytes;
  private final long[] seqs;
  private final long[] crcs;
  private final Map<Integer, CompletableFuture<NatsClient.Msg>> asked = new HashMap<>();
  private long pos;
  private int current = -1;
  private byte[] chunk;
  private boolean closed;

  StoreInputStream(Store store, String path, Store.Meta meta) throws IOException {
    this.store = store;
    this.url = "jetstream://" + store.name + path;
    this.dataSubject = store.dataSubject(meta.id());
    this.length = meta.length();
    this.chunkBytes = meta.doc.path("chunk").asInt(1);
    JsonNode seqList = meta.doc.path("seqs");
    JsonNode crcList = meta.doc.path("crcs");
    this.seqs = new long[seqList.size()];
    this.crcs = new long[crcList.size()];
    for (int i = 0; i < seqs.length; i++) {
      seqs[i] = seqList.get(i).asLong();
    }
    for (int i = 0; i < crcs.length; i++) {
      crcs[i] = crcList.get(i).asLong();
    }
    long expected = length == 0 ? 0 : (length + chunkBytes - 1) / chunkBytes;
    if (seqs.length != expected || crcs.length != seqs.length) {
      throw new IOException(url + " is corrupt: its metadata lists " + seqs.length
          + " chunks for " + length + " bytes in chunks of " + chunkBytes);
    }
  }

  @Override
  public int read() throws IOException {
    byte[] one = new byte[1];
    int n = read(one, 0, 1);
    return n < 0 ? -1 : one[0] & 0xff;
  }

  @Override
  public int read(byte[] b, int off, int len) throws IOException {
    if (closed) {
      throw new IOException(url + " is closed");
    }
    if (len == 0) {
      return 0;
    }
    if (pos >= length) {
      return -1;
    }
    int index = (int) (pos / chunkBytes);
    load(index);
    int within = (int) (pos - (long) index * chunkBytes);
    int n = Math.min(len, chunk.length - within);
    System.arraycopy(chunk, within, b, off, n);
    pos += n;
    return n;
  }

  @Override
  public void seek(long target) throws IOException {
    if (target < 0 || target > length) {
      throw new EOFException(url + ": cannot seek to " + target + " of " + length + " bytes");
    }
    pos = target;
  }

  @Override
  public long getPos() {
    return pos;
  }

  @Override
  public boolean seekToNewSource(long targetPos) {
    return false;
  }

  @Override
  public int available() {
    return (int) Math.min(Integer.MAX_VALUE, length - pos);
  }

  @Override
  public void close() {
    closed = true;
    asked.values().forEach(f -> f.cancel(false));
    asked.clear();
    chunk = null;
  }

  private void load(int index) throws IOException {
    if (index == current) {
      return;
    }
    for (int i = index; i < Math.min(seqs.length, index + AHEAD); i++) {
      if (!asked.containsKey(i)) {
        asked.put(i, store.requestDirect(seqs[i]));
      }
    }
    asked.keySet().removeIf(i -> i < index);
    CompletableFuture<NatsClient.Msg> reply = asked.remove(index);
    String what = "chunk " + (index + 1) + " of " + seqs.length + " of " + url;
    byte[] data;
    try {
      data = Store.directData(store.await(reply, what), dataSubject);
    } catch (IOException lost) { // connection lost: the leader, with the store's patience
      data = null;
    }
    if (data == null) { // a replica without it, direct reads off, or no answer
      data = store.retry("reading " + what, c -> store.chunkData(
          store.await(store.requestChunk(seqs[index]), what), dataSubject, what));
    }
    if (data == null) {
      throw new IOException(url + " is damaged: " + what + " (stream " + store.stream
          + " sequence " + seqs[index] + ") is missing");
    }
    CRC32C crc = new CRC32C();
    crc.update(data);
    long expectedLength = Math.min(chunkBytes, length - (long) index * chunkBytes);
    if (crc.getValue() != crcs[index] || data.length != expectedLength) {
      throw new IOException(url + " is damaged: " + what + " (stream " + store.stream
          + " sequence " + seqs[index] + ") does not match its checksum");
    }
    chunk = data;
    current = index;
  }
}
