package dev.spanflow.state;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/**
 * File paths as NATS subject tokens: one token per path segment, so that a directory's
 * files are the subjects under its prefix ({@code <dir tokens>.>}) and the server lists
 * them. Bytes outside a small safe set (dots, wildcards, spaces, non-ASCII) are written
 * {@code %XX}, which keeps names such as {@code offsets/0} readable in NATS tools.
 */
public final class StorePaths {
  private StorePaths() {}

  /** The segments of an absolute path ({@code /a/b/c} → a, b, c; {@code /} → none). */
  public static List<String> segments(String path) {
    List<String> out = new ArrayList<>();
    for (String part : path.split("/")) {
      if (!part.isEmpty()) {
        out.add(part);
      }
    }
    return out;
  }

  public static String encode(String segment) {
    StringBuilder out = new StringBuilder(segment.length() + 8);
    for (byte b : segment.getBytes(StandardCharsets.UTF_8)) {
      int c = b & 0xff;
      if (safe(c)) {
        out.append((char) c);
      } else {
        out.append('%').append(Character.toUpperCase(Character.forDigit(c >> 4, 16)))
            .append(Character.toUpperCase(Character.forDigit(c & 15, 16)));
      }
    }
    return out.toString();
  }

  public static String decode(String token) {
    ByteArrayOutputStream out = new ByteArrayOutputStream(token.length());
    for (int i = 0; i < token.length(); i++) {
      char c = token.charAt(i);
      if (c == '%' && i + 2 < token.length()) {
        out.write(Integer.parseInt(token.substring(i + 1, i + 3), 16));
        i += 2;
      } else {
        out.write(c);
      }
    }
    return out.toString(StandardCharsets.UTF_8);
  }

  /** The tokens of a path joined with dots ("" for the root). */
  public static String tokens(String path) {
    StringBuilder out = new StringBuilder();
    for (String segment : segments(path)) {
      if (out.length() > 0) {
        out.append('.');
      }
      out.append(encode(segment));
    }
    return out.toString();
  }

  private static boolean safe(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
        || c == '_' || c == '-' || c == '=' || c == '+' || c == ',' || c == '~' || c == '@';
  }
}
