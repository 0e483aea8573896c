package dev.spanflow.state;

import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.net.URI;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.ParentNotDirectoryException;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.PathIsNotEmptyDirectoryException;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.util.Progressable;

/**
 * {@code jetstream://<store>/<path>}: a Hadoop file system kept in the site's JetStream
 * (see {@link Store} for the layout), so that Spark checkpoints — offsets, commits,
 * RocksDB snapshots and changelogs — live in a store every node of a site already
 * reaches, replicated with the site's streams. A node that replaces a dead one resumes
 * from them with its own empty disk.
 *
 * <p>Semantics: files appear whole on close; {@code rename} of a file is atomic and
 * replaces an existing file (as on a local disk); creating without overwrite and renaming
 * onto a path created meanwhile fail (compare-and-set on the path's metadata). Directories
 * exist while they hold files or were made with {@code mkdirs}.
 *
 * <p>Settings (Hadoop configuration, {@code spark.hadoop.*} in Spark): {@code
 * fs.jetstream.servers} (comma-separated NATS URLs), {@code fs.jetstream.domain},
 * {@code fs.jetstream.replicas} (copies when the store's stream is created; 0: one per
 * server, up to three), {@code
 * fs.jetstream.chunk.bytes}, {@code fs.jetstream.timeout.ms}, {@code
 * fs.jetstream.patience.ms} (how long a call retries through reconnects). Credentials:
 * the process's spanflow secrets, as for the real-time client.
 */
public final class JetStreamFileSystem extends FileSystem {
  public static final String SCHEME = "jetstream";
  static final int DEFAULT_CHUNK = 256 * 1024;

  private URI uri;
  private Store store;
  private int chunkBytes;
  private Path workingDir;

  @Override
  public void initialize(URI name, Configuration conf) throws IOException {
    super.initialize(name, conf);
    setConf(conf);
    String authority = name.getAuthority() == null ? "" : name.getAuthority();
    String storeName = authority.substring(authority.indexOf('@') + 1);
    storeName = storeName.isEmpty() ? "spanflow" : storeName;
    if (!storeName.matches("[A-Za-z0-9_-]+")) {
      throw new IOException("jetstream://" + storeName + ": a store name is letters, digits, "
          + "'_' and '-'");
    }
    this.uri = URI.create(SCHEME + "://"
        + (name.getUserInfo() != null ? name.getUserInfo() + "@" : "") + storeName);
    String servers = conf.get("fs.jetstream." + storeName + ".servers",
        conf.get("fs.jetstream.servers", "nats://127.0.0.1:4222"));
    // jetstream://<domain>@<store>/...: the store of another JetStream domain (e.g. the
    // hub's, for a savepoint that moves a fragment between sites) over the leaf link.
    String domain = name.getUserInfo() != null ? name.getUserInfo()
        : conf.get("fs.jetstream.domain");
    this.store = new Store(storeName, servers, domain,
        conf.getInt("fs.jetstream.replicas", 0), conf.getLong("fs.jetstream.timeout.ms", 5000),
        conf.getLong("fs.jetstream.patience.ms", 60_000));
    this.chunkBytes = conf.getInt("fs.jetstream.chunk.bytes", DEFAULT_CHUNK);
    this.workingDir = new Path(uri.toString() + "/");
  }

  @Override
  public String getScheme() {
    return SCHEME;
  }

  @Override
  public URI getUri() {
    return uri;
  }

  @Override
  public Path getWorkingDirectory() {
    return workingDir;
  }

  @Override
  public void setWorkingDirectory(Path dir) {
    workingDir = makeQualified(dir);
  }

  private String pathOf(Path p) {
    Path qualified = makeQualified(p);
    String path = qualified.toUri().getPath();
    return path == null || path.isEmpty() ? "/" : path;
  }

  private Path qualify(String path) {
    return new Path(uri.toString() + (path.startsWith("/") ? path : "/" + path));
  }

  private String url(String path) {
    return uri + path;
  }

  @Override
  public FSDataInputStream open(Path f, int bufferSize) throws IOException {
    String path = pathOf(f);
    Store.Meta meta = store.meta(path);
    if (meta == null || meta.isDir()) {
      throw new FileNotFoundException(url(path) + (meta == null ? " does not exist"
          : " is a directory"));
    }
    return new FSDataInputStream(new StoreInputStream(store, path, meta));
  }

  @Override
  public FSDataOutputStream create(Path f, FsPermission permission, boolean overwrite,
      int bufferSize, short replication, long blockSize, Progressable progress)
      throws IOException {
    String path = pathOf(f);
    Store.Meta existing = store.meta(path);
    if (existing != null && existing.isDir()) {
      throw new FileAlreadyExistsException(url(path) + " is a directory");
    }
    if (existing == null && store.anyUnder(path)) {
      throw new FileAlreadyExistsException(url(path) + " is a directory");
    }
    if (existing != null && !overwrite) {
      throw new FileAlreadyExistsException(url(path) + " already exists");
    }
    long expect = overwrite ? -1 : 0;
    StoreOutputStream out = new StoreOutputStream(store, path, chunkBytes, expect, existing);
    return new FSDataOutputStream(out, statistics);
  }

  @Override
  public FSDataOutputStream append(Path f, int bufferSize, Progressable progress)
      throws IOException {
    throw new UnsupportedOperationException("jetstream:// files cannot be appended to");
  }

  @Override
  public boolean rename(Path src, Path dst) throws IOException {
    String from = pathOf(src);
    String to = pathOf(dst);
    if (from.equals("/") || from.equals(to)) {
      return from.equals(to) && store.meta(from) != null;
    }
    Store.Meta meta = store.meta(from);
    if (meta == null && !store.anyUnder(from)) {
      return false;
    }
    FileStatus target = statusOrNull(to);
    if (target != null && target.isDirectory()) {
      to = (to.endsWith("/") ? to : to + "/") + src.getName();
      target = statusOrNull(to);
    }
    if (to.startsWith(from + "/")) {
      return false; // into itself
    }
    if (meta == null || meta.isDir()) {
      return renameDirectory(from, to, meta);
    }
    return renameFile(from, to, meta);
  }

  /**
   * Point {@code to} at {@code from}'s data, then drop {@code from}. The source is first
   * marked as moving, so that deleting a source left behind by a crash between the two
   * steps does not delete the data its target now holds.
   */
  private boolean renameFile(String from, String to, Store.Meta meta) throws IOException {
    Store.Meta old = store.meta(to);
    if (old != null && old.isDir()) {
      return false;
    }
    ObjectNode moving = meta.doc.deepCopy();
    moving.put("moved_to", to);
    if (store.putMeta(from, moving, meta.seq) < 0) {
      return false; // changed meanwhile
    }
    ObjectNode moved = meta.doc.deepCopy();
    moved.remove("moved_to");
    if (store.putMeta(to, moved, old == null ? 0 : old.seq) < 0) {
      store.putMeta(from, meta.doc, -1);
      return false;
    }
    store.purgeMeta(from);
    if (old != null && !old.id().isEmpty() && !old.id().equals(meta.id())) {
      store.purgeData(old.id());
    }
    return true;
  }

  private boolean renameDirectory(String from, String to, Store.Meta marker) throws IOException {
    for (String[] rel : store.under(from)) {
      String child = String.join("/", decodeAll(rel));
      Store.Meta meta = store.meta(from + "/" + child);
      if (meta == null) {
        continue;
      }
      if (meta.isDir()) {
        store.putMeta(to + "/" + child, meta.doc, -1);
        store.purgeMeta(from + "/" + child);
      } else if (!renameFile(from + "/" + child, to + "/" + child, meta)) {
        return false;
      }
    }
    if (marker != null || store.meta(to) == null) {
      ObjectNode dir = Store.JSON.createObjectNode();
      dir.put("dir", true);
      dir.put("mtime", System.currentTimeMillis());
      store.putMeta(to, dir, -1);
    }
    store.purgeMeta(from);
    return true;
  }

  @Override
  public boolean delete(Path f, boolean recursive) throws IOException {
    String path = pathOf(f);
    Store.Meta meta = path.equals("/") ? null : store.meta(path);
    if (meta != null && !meta.isDir()) {
      deleteFile(path, meta);
      return true;
    }
    List<String[]> children = store.under(path);
    if (meta == null && children.isEmpty()) {
      return false;
    }
    if (!children.isEmpty() && !recursive) {
      throw new PathIsNotEmptyDirectoryException(url(path));
    }
    List<String> files = new ArrayList<>();
    for (String[] rel : children) {
      files.add(join(path, String.join("/", decodeAll(rel))));
    }
    List<Store.Meta> metas = store.metas(files);
    for (int i = 0; i < files.size(); i++) {
      Store.Meta child = metas.get(i);
      if (child != null && !child.isDir()) {
        deleteFile(files.get(i), child);
      }
    }
    if (!path.equals("/")) {
      store.purgeMeta(path);
    }
    store.purgeMetaUnder(path);
    return true;
  }

  private void deleteFile(String path, Store.Meta meta) throws IOException {
    String movedTo = meta.movedTo();
    boolean shared = false;
    if (movedTo != null) {
      Store.Meta target = store.meta(movedTo);
      shared = target != null && meta.id().equals(target.id());
    }
    store.purgeMeta(path);
    if (!shared && !meta.id().isEmpty()) {
      store.purgeData(meta.id());
    }
  }

  @Override
  public FileStatus[] listStatus(Path f) throws IOException {
    String path = pathOf(f);
    Store.Meta meta = path.equals("/") ? null : store.meta(path);
    if (meta != null && !meta.isDir()) {
      return new FileStatus[] {status(path, meta)};
    }
    List<String[]> under = store.under(path);
    if (meta == null && under.isEmpty() && !path.equals("/")) {
      throw new FileNotFoundException(url(path) + " does not exist");
    }
    Set<String> dirs = new LinkedHashSet<>();
    List<String> files = new ArrayList<>();
    for (String[] rel : under) {
      String name = StorePaths.decode(rel[0]);
      if (rel.length > 1) {
        dirs.add(name);
      } else {
        files.add(name);
      }
    }
    Map<String, FileStatus> out = new LinkedHashMap<>();
    List<String> paths = new ArrayList<>();
    files.forEach(name -> paths.add(join(path, name)));
    List<Store.Meta> metas = store.metas(paths);
    for (int i = 0; i < files.size(); i++) {
      if (metas.get(i) != null) {
        out.put(files.get(i), status(paths.get(i), metas.get(i)));
      }
    }
    for (String name : dirs) {
      out.putIfAbsent(name, directory(join(path, name), 0));
    }
    return out.values().toArray(new FileStatus[0]);
  }

  @Override
  public boolean mkdirs(Path f, FsPermission permission) throws IOException {
    String path = pathOf(f);
    if (path.equals("/")) {
      return true;
    }
    FileStatus existing = statusOrNull(path);
    if (existing != null) {
      if (existing.isDirectory()) {
        return true;
      }
      throw new FileAlreadyExistsException(url(path) + " is a file");
    }
    List<String> ancestors = new ArrayList<>();
    String[] parts = path.substring(1).split("/");
    StringBuilder at = new StringBuilder();
    for (int i = 0; i < parts.length - 1; i++) {
      at.append('/').append(parts[i]);
      ancestors.add(at.toString());
    }
    for (Store.Meta m : store.metas(ancestors)) {
      if (m != null && !m.isDir()) {
        throw new ParentNotDirectoryException(url(path) + ": a parent is a file");
      }
    }
    ObjectNode dir = Store.JSON.createObjectNode();
    dir.put("dir", true);
    dir.put("mtime", System.currentTimeMillis());
    store.putMeta(path, dir, -1);
    return true;
  }

  @Override
  public FileStatus getFileStatus(Path f) throws IOException {
    String path = pathOf(f);
    FileStatus status = statusOrNull(path);
    if (status == null) {
      throw new FileNotFoundException(url(path) + " does not exist");
    }
    return status;
  }

  private FileStatus statusOrNull(String path) throws IOException {
    if (path.equals("/")) {
      return directory(path, 0);
    }
    Store.Meta meta = store.meta(path);
    if (meta != null) {
      return status(path, meta);
    }
    return store.anyUnder(path) ? directory(path, 0) : null;
  }

  private FileStatus status(String path, Store.Meta meta) {
    if (meta.isDir()) {
      return directory(path, meta.mtime());
    }
    return new FileStatus(meta.length(), false, 1, chunkBytes, meta.mtime(), qualify(path));
  }

  private FileStatus directory(String path, long mtime) {
    return new FileStatus(0, true, 1, 0, mtime, qualify(path));
  }

  private static String join(String dir, String name) {
    return dir.endsWith("/") ? dir + name : dir + "/" + name;
  }

  private static String[] decodeAll(String[] tokens) {
    String[] out = new String[tokens.length];
    for (int i = 0; i < tokens.length; i++) {
      out[i] = StorePaths.decode(tokens[i]);
    }
    return out;
  }

  @Override
  public void close() throws IOException {
    try {
      super.close();
    } finally {
      if (store != null) {
        store.close();
      }
    }
  }
}
