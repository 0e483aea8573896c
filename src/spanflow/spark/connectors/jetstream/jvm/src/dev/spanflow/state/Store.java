package dev.spanflow.state;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import dev.spanflow.realtime.NatsClient;
import io.nats.client.JetStreamManagement;
import io.nats.client.PurgeOptions;
import io.nats.client.api.StorageType;
import io.nats.client.api.StreamConfiguration;
import io.nats.client.api.StreamInfo;
import io.nats.client.api.StreamInfoOptions;
import io.nats.client.api.Subject;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * A file store in one JetStream stream: the NATS calls {@link JetStreamFileSystem} makes.
 *
 * <p>Layout (stream {@code SPANFLOW_FS_<store>}, subjects {@code $SFS.<store>.>}):
 * <ul>
 *   <li>{@code $SFS.<store>.M.<path tokens>}: the file's metadata, one JSON message (kept
 *       alone by a roll-up header): its data id, length, chunk size, and the stream
 *       sequence and CRC-32C of every chunk. A directory marker has {@code "dir": true}.
 *   <li>{@code $SFS.<store>.D.<id>}: the file's bytes in chunks, written before its
 *       metadata, so a file appears complete or not at all.
 * </ul>
 * Writes that must not race (create without overwrite, rename) are compare-and-set on the
 * metadata subject's last sequence ({@code Nats-Expected-Last-Subject-Sequence}); reads go
 * to the stream leader ({@code STREAM.MSG.GET}), so a file written on one node is seen at
 * once on every other. Publishes, acks and the stream's management go through jnats; the
 * reads are requests of our own over it: jnats's {@code getMessage} takes a Direct Get
 * whenever the stream allows one (answered by any replica, which may lag: stale metadata)
 * and waits for each answer, where chunk reads are pipelined. Every call retries through reconnects and leader elections for up
 * to {@code patienceMs}: a restarting server delays a checkpoint, it does not fail it.
 */
final class Store implements AutoCloseable {
  static final ObjectMapper JSON = new ObjectMapper();
  static final int NOT_FOUND = 404;
  static final int WRONG_LAST_SEQUENCE = 10071;
  static final int IN_FLIGHT = 16;

  /** A JetStream API error: {@code code} is HTTP-like, {@code errCode} JetStream's own. */
  static final class ApiError extends IOException {
    final int code;
    final int errCode;

    ApiError(String message, int code, int errCode) {
      super(message);
      this.code = code;
      this.errCode = errCode;
    }

    boolean transientError() {
      return code >= 500 || code == 408;
    }
  }

  /** One metadata message: a file, or a directory marker. */
  static final class Meta {
    final long seq;
    final JsonNode doc;

    Meta(long seq, JsonNode doc) {
      this.seq = seq;
      this.doc = doc;
    }

    boolean isDir() {
      return doc.path("dir").asBoolean(false);
    }

    String id() {
      return doc.path("id").asText("");
    }

    long length() {
      return doc.path("len").asLong(0);
    }

    long mtime() {
      return doc.path("mtime").asLong(0);
    }

    String movedTo() {
      return doc.path("moved_to").asText(null);
    }
  }

  interface Call<T> {
    T run(NatsClient nc) throws IOException;
  }

  final String name;
  final String stream;
  /** The stream's subject prefix, read from the stream (unique per stream, so that the
   * stores of two JetStream domains joined by a leaf link never capture each other's
   * messages). Set by the first call. */
  private volatile String root;
  private final String api;
  private final String domain;
  private final String urls;
  private final int replicas;
  final long timeoutMs;
  private final long patienceMs;
  private NatsClient nc;
  private volatile boolean streamKnown;

  Store(String name, String urls, String domain, int replicas, long timeoutMs,
      long patienceMs) {
    this.name = name;
    this.stream = "SPANFLOW_FS_" + name;
    this.api = domain == null || domain.isEmpty() ? "$JS.API" : "$JS." + domain + ".API";
    this.domain = domain;
    this.urls = urls;
    this.replicas = Math.max(0, replicas);
    this.timeoutMs = timeoutMs;
    this.patienceMs = patienceMs;
  }

  /** Where the store is, for messages. */
  String where() {
    return stream + " at " + urls;
  }

  String metaSubject(String path) {
    String tokens = StorePaths.tokens(path);
    return tokens.isEmpty() ? root + ".M" : root + ".M." + tokens;
  }

  String dataSubject(String id) {
    return root + ".D." + id;
  }

  synchronized NatsClient client() throws IOException {
    if (nc == null || !nc.isOpen()) {
      if (nc != null) {
        nc.close();
      }
      nc = NatsClient.connect(urls, "spanflow-state-" + name);
    }
    return nc;
  }

  /** Run a call, reconnecting and retrying transient failures until the patience runs out. */
  <T> T retry(String what, Call<T> call) throws IOException {
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(patienceMs);
    long pause = 50;
    while (true) {
      try {
        ensureStream();
        return call.run(client());
      } catch (ApiError exc) {
        if (!exc.transientError() || System.nanoTime() > deadline) {
          throw exc;
        }
      } catch (IOException exc) {
        if (System.nanoTime() > deadline) {
          throw new IOException(what + " on the checkpoint store " + stream + " at " + urls
              + " failed for " + patienceMs + " ms: " + exc.getMessage(), exc);
        }
      }
      sleep(pause);
      pause = Math.min(1000, pause * 2);
    }
  }

  private void ensureStream() throws IOException {
    if (streamKnown) {
      return;
    }
    JetStreamManagement jsm = management(client());
    try {
      root = rootOf(manage("stream " + stream, () -> jsm.getStreamInfo(stream)));
      streamKnown = true;
      return;
    } catch (ApiError missing) {
      if (missing.code != NOT_FOUND) {
        throw missing;
      }
    }
    String fresh = "$SFS." + java.util.UUID.randomUUID().toString().replace("-", "")
        .substring(0, 12) + "." + name;
    ApiError error = null;
    // replicas 0: one copy per server of the cluster, up to three (a cluster of fewer
    // servers refuses the larger counts)
    for (int copies = replicas > 0 ? replicas : 3; copies >= 1; copies--) {
      StreamConfiguration config = StreamConfiguration.builder()
          .name(stream)
          .subjects(fresh + ".>")
          .storageType(StorageType.File)
          .allowRollup(true)
          .allowDirect(true) // chunks by sequence as raw bytes (see directChunk)
          .description("spanflow checkpoints and savepoints (jetstream://" + name + ")")
          .replicas(copies)
          .build();
      try {
        manage("creating stream " + stream, () -> jsm.addStream(config));
        error = null;
        break;
      } catch (ApiError exc) {
        error = exc;
        if (replicas > 0 || exc.errCode == 10058) {
          break;
        }
      }
    }
    if (error != null && error.errCode != 10058) { // 10058: made meanwhile by another node
      throw error;
    }
    if (error != null) {
      ensureStream();
      return;
    }
    root = fresh;
    streamKnown = true;
  }

  private String rootOf(StreamInfo info) throws IOException {
    List<String> subjects = info.getConfiguration().getSubjects();
    String subject = subjects.isEmpty() ? "" : subjects.get(0);
    if (!subject.startsWith("$SFS.") || !subject.endsWith(".>")) {
      throw new IOException("stream " + stream + " is not a spanflow state store (subjects "
          + subjects + ")");
    }
    return subject.substring(0, subject.length() - 2);
  }

  /** jnats's JetStream management API for this store's domain. */
  private JetStreamManagement management(NatsClient c) throws IOException {
    return c.management(domain, Duration.ofMillis(timeoutMs));
  }

  /** A JetStream management call; JetStream's refusal as an {@link ApiError}. */
  private static <T> T manage(String what, NatsClient.ApiCall<T> call) throws IOException {
    try {
      return NatsClient.call(what, call);
    } catch (NatsClient.Refused exc) {
      throw new ApiError(exc.getMessage(), exc.code, exc.errCode);
    }
  }

  /** The JetStream API's answer as JSON, or an {@link ApiError}. */
  JsonNode answer(NatsClient.Msg msg, String what) throws IOException {
    if (msg.status == 503) {
      throw new IOException("no JetStream responders for " + what);
    }
    ApiError error = errorOf(msg);
    if (error != null) {
      throw new ApiError(what + ": " + error.getMessage(), error.code, error.errCode);
    }
    return JSON.readTree(msg.data);
  }

  private static ApiError errorOf(NatsClient.Msg msg) throws IOException {
    if (msg.data.length == 0) {
      return new ApiError("empty answer", 503, 0);
    }
    JsonNode doc = JSON.readTree(msg.data);
    JsonNode error = doc.get("error");
    if (error == null || error.isNull()) {
      return null;
    }
    return new ApiError(error.path("description").asText(error.toString()),
        error.path("code").asInt(500), error.path("err_code").asInt(0));
  }

  /** A stored message by a MSG.GET request; null when there is none. */
  private JsonNode getMessage(NatsClient c, ObjectNode request, String what) throws IOException {
    NatsClient.Msg msg = c.request(api + ".STREAM.MSG.GET." + stream, bytes(request), timeoutMs);
    try {
      return answer(msg, what).path("message");
    } catch (ApiError exc) {
      if (exc.code == NOT_FOUND) {
        return null;
      }
      throw exc;
    }
  }

  /** The metadata of a path, or null. */
  Meta meta(String path) throws IOException {
    return retry("reading " + path, c -> {
      ObjectNode request = JSON.createObjectNode();
      request.put("last_by_subj", metaSubject(path));
      JsonNode message = getMessage(c, request, "metadata of " + path);
      return message == null ? null : toMeta(message);
    });
  }

  /** Metadata of many paths at once (requests pipelined); null entries for missing ones. */
  List<Meta> metas(List<String> paths) throws IOException {
    return retry("reading " + paths.size() + " files", c -> {
      List<CompletableFuture<NatsClient.Msg>> replies = new ArrayList<>();
      for (String path : paths) {
        ObjectNode request = JSON.createObjectNode();
        request.put("last_by_subj", metaSubject(path));
        replies.add(c.publishForReply(api + ".STREAM.MSG.GET." + stream, null, bytes(request)));
      }
      List<Meta> out = new ArrayList<>();
      for (int i = 0; i < paths.size(); i++) {
        NatsClient.Msg msg = await(replies.get(i), "metadata of " + paths.get(i));
        try {
          out.add(toMeta(answer(msg, "metadata of " + paths.get(i)).path("message")));
        } catch (ApiError exc) {
          if (exc.code != NOT_FOUND) {
            throw exc;
          }
          out.add(null);
        }
      }
      return out;
    });
  }

  /** Whether any metadata lies under a path (an implicit directory). */
  boolean anyUnder(String path) throws IOException {
    return retry("listing " + path, c -> {
      ObjectNode request = JSON.createObjectNode();
      request.put("seq", 1);
      request.put("next_by_subj", metaSubject(path) + ".>");
      return getMessage(c, request, "files under " + path) != null;
    });
  }

  /** Every metadata subject under a path, as the path tokens after the path's own. */
  List<String[]> under(String path) throws IOException {
    return retry("listing " + path, c -> {
      String prefix = metaSubject(path) + ".";
      JetStreamManagement jsm = management(c);
      StreamInfo info = manage("listing " + path, () -> jsm.getStreamInfo(stream,
          StreamInfoOptions.filterSubjects(prefix + ">"))); // jnats pages through them
      List<String[]> out = new ArrayList<>();
      for (Subject subject : info.getStreamState().getSubjects()) {
        out.add(subject.getName().substring(prefix.length()).split("\\."));
      }
      return out;
    });
  }

  /**
   * Publish a path's metadata, replacing what the path had. {@code expect}: the subject's
   * last sequence the write requires (0: no file there), or -1 for none. Returns the new
   * message's sequence, or -1 when the expectation failed.
   */
  long putMeta(String path, JsonNode doc, long expect) throws IOException {
    byte[] body = bytes(doc);
    Map<String, String> headers = new LinkedHashMap<>();
    headers.put("Nats-Rollup", "sub");
    if (expect >= 0) {
      headers.put("Nats-Expected-Last-Subject-Sequence", Long.toString(expect));
    }
    boolean[] retried = {false};
    return retry("writing " + path, c -> {
      boolean again = retried[0];
      retried[0] = true;
      try {
        return awaitAck(c.publishToStream(metaSubject(path), headers, body),
            "writing " + path).seq;
      } catch (ApiError exc) {
        if (exc.errCode != WRONG_LAST_SEQUENCE) {
          throw exc;
        }
        if (again) { // the first attempt may have landed and lost only its answer
          Meta now = meta(path);
          if (now != null && now.doc.equals(doc)) {
            return now.seq;
          }
        }
        return -1L;
      }
    });
  }

  /** Remove a path's metadata. */
  void purgeMeta(String path) throws IOException {
    purge("deleting " + path, () -> metaSubject(path));
  }

  /** Remove the metadata of everything under a path. */
  void purgeMetaUnder(String path) throws IOException {
    purge("deleting under " + path, () -> metaSubject(path) + ".>");
  }

  /** Remove a file's data. */
  void purgeData(String id) throws IOException {
    purge("deleting data " + id, () -> dataSubject(id));
  }

  private void purge(String what, java.util.function.Supplier<String> subject)
      throws IOException {
    retry(what, c -> {
      String filter = subject.get();
      JetStreamManagement jsm = management(c);
      manage("purging " + filter, () -> jsm.purgeStream(stream, PurgeOptions.subject(filter)));
      return null;
    });
  }

  /** Publish one chunk of data; the future completes with JetStream's ack. */
  CompletableFuture<NatsClient.Ack> publishChunk(String id, byte[] data) throws IOException {
    return retry("writing a chunk", c -> c.publishToStream(dataSubject(id), null, data));
  }

  /** A publish's ack; JetStream's refusal as an {@link ApiError} (retried when transient). */
  NatsClient.Ack awaitAck(CompletableFuture<NatsClient.Ack> ack, String what)
      throws IOException {
    try {
      return NatsClient.await(ack, timeoutMs, what);
    } catch (NatsClient.Refused exc) {
      throw new ApiError(what + ": " + exc.getMessage(), exc.code, exc.errCode);
    } catch (NatsClient.NoStream exc) {
      throw new IOException("no JetStream responders for " + what, exc);
    }
  }

  /**
   * Ask for a stored chunk by sequence with a Direct Get: the bytes as they are, not
   * base64 in JSON (reads about twice as fast), answered by any replica. Complete with
   * {@link #directData}; a replica that lags answers "not found", and the caller then
   * asks the leader ({@link #requestChunk}).
   */
  CompletableFuture<NatsClient.Msg> requestDirect(long seq) throws IOException {
    byte[] request = ("{\"seq\":" + seq + "}").getBytes(StandardCharsets.UTF_8);
    return retry("reading a chunk", c ->
        c.publishForReply(api + ".DIRECT.GET." + stream, null, request));
  }

  /** A chunk's bytes from a Direct Get answer; null when this replica has no such
   * message (or the stream allows no direct reads): ask the leader. */
  static byte[] directData(NatsClient.Msg reply, String expectSubject) {
    if (reply.status != 0) {
      return null; // 404 not found, 503 no responders (direct reads off), 408 ...
    }
    String subject = reply.headers.get("Nats-Subject");
    return expectSubject.equals(subject) ? reply.data : null;
  }

  /** Ask for a stored chunk by sequence; complete with {@link #chunkData}. */
  CompletableFuture<NatsClient.Msg> requestChunk(long seq) throws IOException {
    ObjectNode request = JSON.createObjectNode();
    request.put("seq", seq);
    return retry("reading a chunk", c ->
        c.publishForReply(api + ".STREAM.MSG.GET." + stream, null, bytes(request)));
  }

  /** A chunk's bytes from its MSG.GET answer, or null when the message is gone. */
  byte[] chunkData(NatsClient.Msg reply, String expectSubject, String what) throws IOException {
    JsonNode message;
    try {
      message = answer(reply, what).path("message");
    } catch (ApiError exc) {
      if (exc.code == NOT_FOUND) {
        return null;
      }
      throw exc;
    }
    if (!expectSubject.equals(message.path("subject").asText())) {
      return null;
    }
    String data = message.path("data").asText("");
    return Base64.getDecoder().decode(data);
  }

  NatsClient.Msg await(CompletableFuture<NatsClient.Msg> future, String what) throws IOException {
    try {
      NatsClient.Msg msg = future.get(timeoutMs, TimeUnit.MILLISECONDS);
      if (msg.status == 503) {
        throw new IOException("no JetStream responders for " + what);
      }
      return msg;
    } catch (TimeoutException exc) {
      future.cancel(false);
      throw new IOException("no answer for " + what + " within " + timeoutMs + " ms");
    } catch (InterruptedException exc) {
      Thread.currentThread().interrupt();
      throw new IOException("interrupted: " + what);
    } catch (ExecutionException exc) {
      throw new IOException(what + ": " + exc.getCause().getMessage(), exc.getCause());
    }
  }

  private static Meta toMeta(JsonNode message) throws IOException {
    byte[] data = Base64.getDecoder().decode(message.path("data").asText(""));
    return new Meta(message.path("seq").asLong(), JSON.readTree(data));
  }

  static byte[] bytes(JsonNode node) {
    try {
      return JSON.writeValueAsBytes(node);
    } catch (IOException exc) {
      throw new IllegalStateException(exc);
    }
  }

  static String text(byte[] data) {
    return new String(data, StandardCharsets.UTF_8);
  }

  private static void sleep(long ms) throws IOException {
    try {
      Thread.sleep(ms);
    } catch (InterruptedException exc) {
      Thread.currentThread().interrupt();
      throw new IOException("interrupted");
    }
  }

  @Override
  public synchronized void close() {
    if (nc != null) {
      nc.close();
      nc = null;
    }
  }
}
