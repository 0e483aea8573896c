package dev.spanflow.realtime;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.net.InetAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.SecureRandom;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.Base64;
import javax.net.ssl.KeyManager;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLContextSpi;
import javax.net.ssl.SSLEngine;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLServerSocketFactory;
import javax.net.ssl.SSLSessionContext;
import javax.net.ssl.SSLSocket;
import javax.net.ssl.SSLSocketFactory;
import javax.net.ssl.TrustManager;
import javax.net.ssl.TrustManagerFactory;

/**
 * This process's NATS identity in locked mode, read as the Python side reads it
 * (docs/security.md): the system property {@code spanflow.secrets} (set by the driver;
 * on a cluster, pass {@code -Dspanflow.secrets=...} to the executors) or else
 * {@code SPANFLOW_SECRETS} names the secrets directory, and {@code spanflow.role} /
 * {@code SPANFLOW_ROLE} the role (default agent). The password comes from
 * {@code credentials.json}, the TLS files from {@code ca.crt} and
 * {@code clients/<role>.crt|.key} (PEM, PKCS#8 EC key). A node's bundle names its
 * node ({@code "node"}): its user is {@code agent.<node>} and its replies come back on
 * {@code _INBOX_NODE.<node>}, the only inbox its user may read. Nothing here is logged.
 */
final class NatsTls {
  final String user;
  final String password;
  /** Where replies come back; null: jnats' default {@code _INBOX}. */
  final String inboxPrefix;
  private final Path root;
  private final String role;

  private NatsTls(Path root, String role, String password, String node) {
    this.root = root;
    this.role = role;
    this.password = password;
    boolean own = node != null && role.equals("agent");
    this.user = own ? "agent." + node : role;
    this.inboxPrefix = own ? "_INBOX_NODE." + node : null;
  }

  /** The identity of this process, or null in open mode. */
  static NatsTls fromEnv() throws IOException {
    String dir = setting("spanflow.secrets", "SPANFLOW_SECRETS");
    if (dir == null || dir.isEmpty()) {
      return null;
    }
    String role = setting("spanflow.role", "SPANFLOW_ROLE");
    if (role == null || role.isEmpty()) {
      role = "agent";
    }
    Path root = Paths.get(dir);
    JsonNode creds = Json.MAPPER.readTree(Files.readAllBytes(root.resolve("credentials.json")));
    JsonNode password = creds.path("nats").path(role);
    if (!password.isTextual()) {
      throw new IOException(root.resolve("credentials.json") + " has no password for role " + role);
    }
    JsonNode node = creds.path("node");
    return new NatsTls(root, role, password.asText(), node.isTextual() ? node.asText() : null);
  }

  /** A system property (set by the Python driver at run time), else the environment. */
  private static String setting(String property, String env) {
    String value = System.getProperty(property);
    return value != null ? value : System.getenv(env);
  }

  /** A TLS context trusting the deployment's CA and presenting this role's certificate. */
  SSLContext context() throws IOException {
    try {
      CertificateFactory x509 = CertificateFactory.getInstance("X.509");
      KeyStore trust = KeyStore.getInstance("PKCS12");
      trust.load(null, null);
      trust.setCertificateEntry("ca", read(x509, root.resolve("ca.crt")));
      TrustManagerFactory tmf =
          TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
      tmf.init(trust);
      KeyStore keys = KeyStore.getInstance("PKCS12");
      keys.load(null, null);
      Certificate cert = read(x509, root.resolve("clients").resolve(role + ".crt"));
      PrivateKey key = privateKey(root.resolve("clients").resolve(role + ".key"));
      char[] none = new char[0];
      keys.setKeyEntry("client", key, none, new Certificate[] {cert});
      KeyManagerFactory kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
      kmf.init(keys, none);
      SSLContext ctx = SSLContext.getInstance("TLS");
      ctx.init(kmf.getKeyManagers(), tmf.getTrustManagers(), null);
      return ctx;
    } catch (GeneralSecurityException exc) {
      throw new IOException("TLS files in " + root + " for role " + role + ": " + exc.getMessage(), exc);
    }
  }

  /**
   * The same context, whose client sockets check the server's name against its
   * certificate: jnats leaves endpoint identification off, and a certificate signed by
   * the deployment's CA for another host must not pass for this one.
   */
  static SSLContext checkingServerName(SSLContext ctx) {
    return new SSLContext(new NameCheckingSpi(ctx), ctx.getProvider(), ctx.getProtocol()) {};
  }

  private static <S extends Socket> S checkName(S socket) {
    SSLSocket ssl = (SSLSocket) socket;
    SSLParameters params = ssl.getSSLParameters();
    params.setEndpointIdentificationAlgorithm("HTTPS");
    ssl.setSSLParameters(params);
    return socket;
  }

  private static SSLEngine checkName(SSLEngine engine) {
    SSLParameters params = engine.getSSLParameters();
    params.setEndpointIdentificationAlgorithm("HTTPS");
    engine.setSSLParameters(params);
    return engine;
  }

  /** Everything from the wrapped context; client sockets and engines check the name. */
  private static final class NameCheckingSpi extends SSLContextSpi {
    private final SSLContext ctx;

    NameCheckingSpi(SSLContext ctx) {
      this.ctx = ctx;
    }

    @Override
    protected void engineInit(KeyManager[] km, TrustManager[] tm, SecureRandom random) {
      throw new UnsupportedOperationException("the wrapped context is initialised already");
    }

    @Override
    protected SSLSocketFactory engineGetSocketFactory() {
      return new NameCheckingFactory(ctx.getSocketFactory());
    }

    @Override
    protected SSLServerSocketFactory engineGetServerSocketFactory() {
      return ctx.getServerSocketFactory();
    }

    @Override
    protected SSLEngine engineCreateSSLEngine() {
      return checkName(ctx.createSSLEngine());
    }

    @Override
    protected SSLEngine engineCreateSSLEngine(String host, int port) {
      return checkName(ctx.createSSLEngine(host, port));
    }

    @Override
    protected SSLSessionContext engineGetServerSessionContext() {
      return ctx.getServerSessionContext();
    }

    @Override
    protected SSLSessionContext engineGetClientSessionContext() {
      return ctx.getClientSessionContext();
    }
  }

  private static final class NameCheckingFactory extends SSLSocketFactory {
    private final SSLSocketFactory factory;

    NameCheckingFactory(SSLSocketFactory factory) {
      this.factory = factory;
    }

    @Override
    public String[] getDefaultCipherSuites() {
      return factory.getDefaultCipherSuites();
    }

    @Override
    public String[] getSupportedCipherSuites() {
      return factory.getSupportedCipherSuites();
    }

    @Override
    public Socket createSocket(Socket plain, String host, int port, boolean autoClose)
        throws IOException {
      return checkName(factory.createSocket(plain, host, port, autoClose));
    }

    @Override
    public Socket createSocket(String host, int port) throws IOException {
      return checkName(factory.createSocket(host, port));
    }

    @Override
    public Socket createSocket(String host, int port, InetAddress local, int localPort)
        throws IOException {
      return checkName(factory.createSocket(host, port, local, localPort));
    }

    @Override
    public Socket createSocket(InetAddress host, int port) throws IOException {
      return checkName(factory.createSocket(host, port));
    }

    @Override
    public Socket createSocket(InetAddress host, int port, InetAddress local, int localPort)
        throws IOException {
      return checkName(factory.createSocket(host, port, local, localPort));
    }
  }

  private static Certificate read(CertificateFactory x509, Path path) throws IOException,
      GeneralSecurityException {
    return x509.generateCertificate(new ByteArrayInputStream(Files.readAllBytes(path)));
  }

  private static PrivateKey privateKey(Path path) throws IOException, GeneralSecurityException {
    String pem = new String(Files.readAllBytes(path), StandardCharsets.US_ASCII);
    String body = pem.replaceAll("-----(BEGIN|END) PRIVATE KEY-----", "").replaceAll("\\s", "");
    byte[] der = Base64.getDecoder().decode(body);
    return KeyFactory.getInstance("EC").generatePrivate(new PKCS8EncodedKeySpec(der));
  }
}
