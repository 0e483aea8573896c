package dev.spanflow.realtime;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;

/**
 * A small client of the NATS text protocol: CONNECT, PUB/HPUB, SUB/UNSUB, MSG/HMSG,
 * PING/PONG, and request/reply over one wildcard inbox.
 *
 * <p>Why our own: no Java NATS client is available from the registries this project may
 * use, and the part of the protocol the real-time source and sink need is small and stable
 * (docs/realtime.md). One reader thread parses what the server sends and hands each
 * message to its subscription's handler; handlers must not block on this client (a
 * request made from a handler would wait for a reply only the same thread can read).
 * The client does not reconnect: a broken connection fails the Spark task, and Spark's
 * replay from the last committed offsets plus JetStream's de-duplication keep output
 * exactly once.
 */
public final class NatsClient implements AutoCloseable {
  /** One message as the server delivered it. {@code status} is 0 for ordinary messages. */
  public static final class Msg {
    public final String subject;
    public final String reply;
    public final int status;
    public final String description;
    public final Map<String, String> headers;
    public final byte[] data;

    Msg(String subject, String reply, int status, String description,
        Map<String, String> headers, byte[] data) {
      this.subject = subject;
      this.reply = reply;
      this.status = status;
      this.description = description;
      this.headers = headers;
      this.data = data;
    }
  }

  private static final byte[] CRLF = {'\r', '\n'};

  private final Socket socket;
  private final InputStream in;
  private final OutputStream out;
  private final Thread reader;
  private final Map<Long, Consumer<Msg>> handlers = new ConcurrentHashMap<>();
  private final Map<String, CompletableFuture<Msg>> replies = new ConcurrentHashMap<>();
  private final AtomicLong nextSid = new AtomicLong(1);
  private final AtomicLong nextToken = new AtomicLong(1);
  private final String inbox = "_INBOX." + UUID.randomUUID().toString().replace("-", "");
  private volatile IOException failure;
  private volatile boolean closed;

  private NatsClient(Socket plain, String host, int port, boolean tls, String user,
      String password, String token, String name) throws IOException {
    NatsTls identity = NatsTls.fromEnv();
    if (user == null && token == null && identity != null) {
      // Locked servers take the user from the client certificate (verify_and_map) and
      // check the password against it: an empty user name keeps their log quiet.
      user = "";
      password = identity.password;
    }
    InputStream plainIn = new BufferedInputStream(plain.getInputStream(), 1 << 16);
    String info = readLine(plainIn);
    if (info == null || !info.startsWith("INFO")) {
      throw new IOException("not a NATS server (first line: " + info + ")");
    }
    if (tls || info.contains("\"tls_required\":true")) {
      if (identity == null) {
        throw new IOException("NATS at " + host + ":" + port + " requires TLS: this process has "
            + "no secrets (SPANFLOW_SECRETS; see docs/security.md)");
      }
      Socket secured;
      try {
        secured = NatsTls.upgrade(identity.context(), plain, host, port);
      } catch (IOException exc) {
        plain.close();
        throw new IOException("NATS at " + host + ":" + port + " refused TLS for user "
            + identity.user + ": " + exc.getMessage(), exc);
      }
      this.socket = secured;
      this.in = new BufferedInputStream(secured.getInputStream(), 1 << 16);
    } else {
      this.socket = plain;
      this.in = plainIn;
    }
    this.out = new BufferedOutputStream(socket.getOutputStream(), 1 << 16);
    StringBuilder connect = new StringBuilder("{\"verbose\":false,\"pedantic\":false,")
        .append("\"headers\":true,\"no_responders\":true,\"protocol\":1,")
        .append("\"lang\":\"java-spanflow\",\"version\":\"1\",\"name\":")
        .append(Json.quote(name));
    if (user != null) {
      connect.append(",\"user\":").append(Json.quote(user))
          .append(",\"pass\":").append(Json.quote(password == null ? "" : password));
    }
    if (token != null) {
      connect.append(",\"auth_token\":").append(Json.quote(token));
    }
    connect.append('}');
    synchronized (out) {
      out.write(("CONNECT " + connect + "\r\nPING\r\n").getBytes(StandardCharsets.UTF_8));
      out.flush();
    }
    String answer = readLine();
    while (answer != null && (answer.startsWith("INFO") || answer.equals("+OK"))) {
      answer = readLine();
    }
    if (answer == null || !answer.equals("PONG")) {
      throw new IOException("NATS at " + host + ":" + port + " refused "
          + (user == null ? "a client without credentials"
              : "user " + (user.isEmpty() && identity != null ? identity.user : user))
          + ": " + answer);
    }
    reader = new Thread(this::readLoop, "spanflow-nats-reader");
    reader.setDaemon(true);
    reader.start();
    subscribe(inbox + ".*", this::onReply);
  }

  /** Connect to the first reachable server of a comma-separated list of nats:// URLs. */
  public static NatsClient connect(String urls, String name) throws IOException {
    IOException last = null;
    for (String raw : urls.split(",")) {
      String url = raw.trim();
      if (url.isEmpty()) {
        continue;
      }
      try {
        URI uri = URI.create(url.contains("://") ? url : "nats://" + url);
        String user = null;
        String password = null;
        String token = null;
        String info = uri.getUserInfo();
        if (info != null) {
          int colon = info.indexOf(':');
          if (colon >= 0) {
            user = info.substring(0, colon);
            password = info.substring(colon + 1);
          } else {
            token = info;
          }
        }
        Socket socket = new Socket();
        socket.setTcpNoDelay(true);
        int port = uri.getPort() < 0 ? 4222 : uri.getPort();
        socket.connect(new InetSocketAddress(uri.getHost(), port), 5000);
        boolean tls = "tls".equals(uri.getScheme());
        return new NatsClient(socket, uri.getHost(), port, tls, user, password, token, name);
      } catch (IOException | IllegalArgumentException exc) {
        last = exc instanceof IOException ? (IOException) exc : new IOException(exc.getMessage());
      }
    }
    throw new IOException("could not connect to NATS at " + urls + ": "
        + (last == null ? "no server given" : last.getMessage()), last);
  }

  /** A fresh subject under this client's inbox. */
  public String newInbox() {
    return inbox + "." + nextToken.getAndIncrement() + "x";
  }

  public long subscribe(String subject, Consumer<Msg> handler) throws IOException {
    long sid = nextSid.getAndIncrement();
    handlers.put(sid, handler);
    write(("SUB " + subject + " " + sid + "\r\n").getBytes(StandardCharsets.UTF_8), null);
    return sid;
  }

  public void unsubscribe(long sid) {
    handlers.remove(sid);
    try {
      write(("UNSUB " + sid + "\r\n").getBytes(StandardCharsets.UTF_8), null);
    } catch (IOException ignored) {
      // the connection is gone, and the subscription with it
    }
  }

  /** Publish; {@code headers} may be null. Written and flushed before returning. */
  public void publish(String subject, String reply, Map<String, String> headers, byte[] data)
      throws IOException {
    publish(subject, reply, headers, data, true);
  }

  /**
   * Publish; with {@code flush} false the message may wait in the buffer until the next
   * {@link #flush} (or a full buffer): a batch of publishes then costs a write per buffer,
   * not one per message.
   */
  public void publish(String subject, String reply, Map<String, String> headers, byte[] data,
      boolean flush) throws IOException {
    String replyPart = reply == null ? "" : " " + reply;
    if (headers == null || headers.isEmpty()) {
      byte[] line = ("PUB " + subject + replyPart + " " + data.length + "\r\n")
          .getBytes(StandardCharsets.UTF_8);
      write(line, data, flush);
      return;
    }
    StringBuilder h = new StringBuilder("NATS/1.0\r\n");
    for (Map.Entry<String, String> e : headers.entrySet()) {
      h.append(e.getKey()).append(": ").append(e.getValue()).append("\r\n");
    }
    h.append("\r\n");
    byte[] head = h.toString().getBytes(StandardCharsets.UTF_8);
    byte[] line = ("HPUB " + subject + replyPart + " " + head.length + " "
        + (head.length + data.length) + "\r\n").getBytes(StandardCharsets.UTF_8);
    byte[] body = new byte[head.length + data.length];
    System.arraycopy(head, 0, body, 0, head.length);
    System.arraycopy(data, 0, body, head.length, data.length);
    write(line, body, flush);
  }

  /** Write out whatever publishes wait in the buffer. */
  public void flush() throws IOException {
    write(new byte[0], null, true);
  }

  /** Publish with a reply subject of our inbox; the future completes with the reply. */
  public CompletableFuture<Msg> publishForReply(String subject, Map<String, String> headers,
      byte[] data) throws IOException {
    return publishForReply(subject, headers, data, true);
  }

  /** As {@link #publishForReply(String, Map, byte[])}; {@code flush}: as in {@link #publish}. */
  public CompletableFuture<Msg> publishForReply(String subject, Map<String, String> headers,
      byte[] data, boolean flush) throws IOException {
    String reply = newInbox();
    CompletableFuture<Msg> future = new CompletableFuture<>();
    replies.put(reply, future);
    try {
      publish(subject, reply, headers, data, flush);
    } catch (IOException exc) {
      replies.remove(reply);
      throw exc;
    }
    return future;
  }

  /** Request/reply; fails on timeout or when no one answers (status 503). */
  public Msg request(String subject, byte[] data, long timeoutMs) throws IOException {
    CompletableFuture<Msg> future = publishForReply(subject, null, data);
    try {
      Msg msg = future.get(timeoutMs, TimeUnit.MILLISECONDS);
      if (msg.status == 503) {
        throw new IOException("no responders on " + subject);
      }
      return msg;
    } catch (TimeoutException exc) {
      throw new IOException("no answer on " + subject + " within " + timeoutMs + " ms");
    } catch (InterruptedException exc) {
      Thread.currentThread().interrupt();
      throw new IOException("interrupted waiting on " + subject);
    } catch (ExecutionException exc) {
      throw new IOException(exc.getCause().getMessage(), exc.getCause());
    } finally {
      replies.values().remove(future); // no longer waited for (after a timeout)
    }
  }

  public boolean isOpen() {
    return !closed && failure == null;
  }

  @Override
  public void close() {
    closed = true;
    try {
      socket.close();
    } catch (IOException ignored) {
      // closing anyway
    }
    IOException gone = new IOException("connection closed");
    replies.values().forEach(f -> f.completeExceptionally(gone));
  }

  private void write(byte[] line, byte[] payload) throws IOException {
    write(line, payload, true);
  }

  private void write(byte[] line, byte[] payload, boolean flush) throws IOException {
    IOException broken = failure;
    if (broken != null) {
      throw new IOException("NATS connection lost: " + broken.getMessage(), broken);
    }
    if (closed) {
      throw new IOException("NATS connection closed");
    }
    synchronized (out) {
      out.write(line);
      if (payload != null) {
        out.write(payload);
        out.write(CRLF);
      }
      if (flush) {
        out.flush();
      }
    }
  }

  private void onReply(Msg msg) {
    CompletableFuture<Msg> future = replies.remove(msg.subject);
    if (future != null) {
      future.complete(msg);
    }
  }

  private void readLoop() {
    try {
      while (!closed) {
        String line = readLine();
        if (line == null) {
          throw new IOException("server closed the connection");
        }
        if (line.startsWith("MSG ")) {
          deliver(line.substring(4), false);
        } else if (line.startsWith("HMSG ")) {
          deliver(line.substring(5), true);
        } else if (line.equals("PING")) {
          write("PONG\r\n".getBytes(StandardCharsets.UTF_8), null);
        } else if (line.startsWith("-ERR")) {
          String text = line.substring(4).trim();
          if (!text.toLowerCase().contains("permissions violation")) {
            throw new IOException("NATS error: " + text);
          }
        }
        // PONG, INFO updates and +OK need no action
      }
    } catch (IOException exc) {
      if (!closed) {
        failure = exc;
        replies.values().forEach(f -> f.completeExceptionally(exc));
        try {
          socket.close();
        } catch (IOException ignored) {
          // already failing
        }
      }
    }
  }

  private void deliver(String args, boolean withHeaders) throws IOException {
    String[] parts = args.trim().split(" +");
    String subject = parts[0];
    long sid = Long.parseLong(parts[1]);
    String reply;
    int headerBytes = 0;
    int total;
    if (withHeaders) {
      reply = parts.length == 5 ? parts[2] : null;
      headerBytes = Integer.parseInt(parts[parts.length - 2]);
      total = Integer.parseInt(parts[parts.length - 1]);
    } else {
      reply = parts.length == 4 ? parts[2] : null;
      total = Integer.parseInt(parts[parts.length - 1]);
    }
    byte[] body = readExactly(total);
    readExactly(2); // CRLF
    int status = 0;
    String description = "";
    Map<String, String> headers = Map.of();
    byte[] data = body;
    if (withHeaders) {
      String head = new String(body, 0, headerBytes, StandardCharsets.UTF_8);
      String[] lines = head.split("\r\n");
      String first = lines.length > 0 ? lines[0] : "";
      if (first.length() > 9) { // "NATS/1.0 100 Idle Heartbeat"
        String rest = first.substring(9).trim();
        int space = rest.indexOf(' ');
        String code = space < 0 ? rest : rest.substring(0, space);
        try {
          status = Integer.parseInt(code);
        } catch (NumberFormatException ignored) {
          status = 0;
        }
        description = space < 0 ? "" : rest.substring(space + 1);
      }
      Map<String, String> parsed = new LinkedHashMap<>();
      for (int i = 1; i < lines.length; i++) {
        int colon = lines[i].indexOf(':');
        if (colon > 0) {
          parsed.put(lines[i].substring(0, colon).trim(), lines[i].substring(colon + 1).trim());
        }
      }
      headers = parsed;
      data = new byte[total - headerBytes];
      System.arraycopy(body, headerBytes, data, 0, data.length);
    }
    Consumer<Msg> handler = handlers.get(sid);
    if (handler != null) {
      handler.accept(new Msg(subject, reply, status, description, headers, data));
    }
  }

  private byte[] readExactly(int n) throws IOException {
    byte[] buf = new byte[n];
    int off = 0;
    while (off < n) {
      int got = in.read(buf, off, n - off);
      if (got < 0) {
        throw new IOException("server closed the connection");
      }
      off += got;
    }
    return buf;
  }

  private String readLine() throws IOException {
    return readLine(in);
  }

  private static String readLine(InputStream in) throws IOException {
    ByteArrayOutputStream line = new ByteArrayOutputStream(128);
    int b;
    while ((b = in.read()) >= 0) {
      if (b == '\n') {
        byte[] bytes = line.toByteArray();
        int len = bytes.length > 0 && bytes[bytes.length - 1] == '\r' ? bytes.length - 1 : bytes.length;
        return new String(bytes, 0, len, StandardCharsets.UTF_8);
      }
      line.write(b);
    }
    return null;
  }
}
