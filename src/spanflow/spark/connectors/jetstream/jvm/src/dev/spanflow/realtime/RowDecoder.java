package dev.spanflow.realtime;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.time.format.DateTimeParseException;
import java.util.Iterator;
import java.util.Map;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * JSON message → a row of the declared schema, or the reason it does not fit.
 *
 * <p>The same rules as the Python source's decoder (spanflow.spark.formats): integers may
 * come as integral numbers or text, numbers as text, booleans as true/false/1/0 text,
 * timestamps as ISO-8601 text (UTC when it has no offset) or epoch seconds (milliseconds
 * above 1e11); a field whose type ends in "?" may be missing or null. After the fields
 * come the metadata columns _subject, _seq, _published and _heartbeat.
 */
final class RowDecoder {
  /** Thrown for a message that does not fit; its message is the dead letter's reason. */
  static final class Rejected extends Exception {
    Rejected(String reason) {
      super(reason, null, false, false);
    }
  }

  private final String[] names;
  private final String[] types;
  private final boolean[] optional;
  private final String scalarField;
  private final boolean tombstones;

  /** {@code schema}: a JSON object of field name → spanflow type, in column order. */
  RowDecoder(String schema, String scalarField, boolean tombstones) throws java.io.IOException {
    JsonNode fields = Json.MAPPER.readTree(schema);
    int n = fields.size();
    names = new String[n];
    types = new String[n];
    optional = new boolean[n];
    int i = 0;
    for (Iterator<Map.Entry<String, JsonNode>> it = fields.properties().iterator(); it.hasNext(); i++) {
      Map.Entry<String, JsonNode> e = it.next();
      String declared = e.getValue().asText();
      names[i] = e.getKey();
      optional[i] = declared.endsWith("?");
      types[i] = optional[i] ? declared.substring(0, declared.length() - 1) : declared;
    }
    this.scalarField = scalarField == null || scalarField.isEmpty() ? null : scalarField;
    this.tombstones = tombstones;
  }

  InternalRow decode(byte[] data, String subject, long seq, long publishedNanos) throws Rejected {
    Object[] values = new Object[names.length + 4];
    if (!(tombstones && data.length == 0)) {
      JsonNode record;
      try {
        record = Json.MAPPER.readTree(data);
      } catch (com.fasterxml.jackson.core.JsonProcessingException exc) {
        String text = String.valueOf(exc.getOriginalMessage());
        throw new Rejected("not valid json: " + text.substring(0, Math.min(200, text.length())));
      } catch (java.io.IOException exc) {
        String text = String.valueOf(exc.getMessage());
        throw new Rejected("not valid json: " + text.substring(0, Math.min(200, text.length())));
      }
      if (record == null || record.isMissingNode()) {
        throw new Rejected("not valid json: empty message");
      }
      if (scalarField != null && record.isValueNode() && !record.isNull()) {
        record = Json.object().set(scalarField, record);
      }
      if (!record.isObject()) {
        throw new Rejected("expected a json object, got " + pythonType(record));
      }
      for (int i = 0; i < names.length; i++) {
        JsonNode value = record.get(names[i]);
        if (value == null || value.isNull()) {
          if (!optional[i]) {
            throw new Rejected("field '" + names[i] + "': required field is missing");
          }
          continue;
        }
        try {
          values[i] = convert(types[i], value);
        } catch (Rejected exc) {
          throw new Rejected("field '" + names[i] + "': " + exc.getMessage());
        }
      }
    }
    int n = names.length;
    values[n] = UTF8String.fromString(subject);
    values[n + 1] = seq;
    values[n + 2] = publishedNanos / 1000L;
    values[n + 3] = false;
    return new GenericInternalRow(values);
  }

  private static Object convert(String type, JsonNode v) throws Rejected {
    switch (type) {
      case "string":
        if (v.isTextual()) {
          return UTF8String.fromString(v.asText());
        }
        throw new Rejected("expected string, got " + pythonType(v));
      case "long":
        return toLong(v);
      case "double":
        return toDouble(v);
      case "boolean":
        if (v.isBoolean()) {
          return v.booleanValue();
        }
        if (v.isTextual()) {
          String t = v.asText().toLowerCase();
          if (t.equals("true") || t.equals("1")) {
            return true;
          }
          if (t.equals("false") || t.equals("0")) {
            return false;
          }
        }
        throw new Rejected("expected boolean, got " + repr(v));
      case "timestamp":
        return toMicros(v);
      case "binary":
        if (v.isTextual()) {
          return v.asText().getBytes(java.nio.charset.StandardCharsets.UTF_8);
        }
        throw new Rejected("expected bytes or text, got " + pythonType(v));
      default:
        throw new Rejected("unsupported type " + type);
    }
  }

  private static long toLong(JsonNode v) throws Rejected {
    if (v.isIntegralNumber() && v.canConvertToLong()) {
      return v.longValue();
    }
    if (v.isFloatingPointNumber()) {
      double d = v.doubleValue();
      if (d == Math.rint(d) && !Double.isInfinite(d) && Math.abs(d) < 9.2e18) {
        return (long) d;
      }
    }
    if (v.isTextual()) {
      try {
        return Long.parseLong(v.asText().trim());
      } catch (NumberFormatException ignored) {
        // rejected below
      }
    }
    throw new Rejected("expected integer, got " + repr(v));
  }

  private static double toDouble(JsonNode v) throws Rejected {
    if (v.isNumber()) {
      return v.doubleValue();
    }
    if (v.isTextual()) {
      Double d = parseDouble(v.asText());
      if (d != null) {
        return d;
      }
    }
    throw new Rejected("expected number, got " + repr(v));
  }

  private static Double parseDouble(String text) {
    String t = text.trim().toLowerCase();
    switch (t) {
      case "nan":
      case "+nan":
      case "-nan":
        return Double.NaN;
      case "inf":
      case "+inf":
      case "infinity":
      case "+infinity":
        return Double.POSITIVE_INFINITY;
      case "-inf":
      case "-infinity":
        return Double.NEGATIVE_INFINITY;
      default:
        break;
    }
    if (t.isEmpty() || t.endsWith("d") || t.endsWith("f") || t.startsWith("0x")) {
      return null; // Java accepts these; Python's float() does not
    }
    try {
      return Double.parseDouble(t);
    } catch (NumberFormatException exc) {
      return null;
    }
  }

  /** Microseconds since the epoch. */
  private static long toMicros(JsonNode v) throws Rejected {
    if (v.isNumber()) {
      return epochMicros(v.doubleValue());
    }
    if (!v.isTextual()) {
      throw new Rejected("expected timestamp, got " + pythonType(v));
    }
    String text = v.asText().trim();
    Long iso = isoMicros(text);
    if (iso != null) {
      return iso;
    }
    Double number = parseDouble(text);
    if (number != null && !number.isNaN() && !number.isInfinite()) {
      return epochMicros(number);
    }
    throw new Rejected("expected ISO-8601 time or epoch number, got " + repr(v));
  }

  private static long epochMicros(double value) {
    double seconds = Math.abs(value) > 1e11 ? value / 1000.0 : value;
    return Math.round(seconds * 1_000_000.0);
  }

  private static Long isoMicros(String text) {
    String t = text.length() > 10 && text.charAt(10) == ' '
        ? text.substring(0, 10) + "T" + text.substring(11) : text;
    if (t.endsWith("z")) {
      t = t.substring(0, t.length() - 1) + "Z";
    }
    try {
      return micros(OffsetDateTime.parse(t).toInstant());
    } catch (DateTimeParseException ignored) {
      // try without an offset
    }
    try {
      return micros(LocalDateTime.parse(t).toInstant(ZoneOffset.UTC));
    } catch (DateTimeParseException ignored) {
      // try a date alone
    }
    try {
      return micros(LocalDate.parse(t).atStartOfDay().toInstant(ZoneOffset.UTC));
    } catch (DateTimeParseException ignored) {
      return null;
    }
  }

  private static long micros(java.time.Instant instant) {
    return Math.addExact(Math.multiplyExact(instant.getEpochSecond(), 1_000_000L),
        instant.getNano() / 1000L);
  }

  private static String pythonType(JsonNode v) {
    if (v.isTextual()) {
      return "str";
    }
    if (v.isIntegralNumber()) {
      return "int";
    }
    if (v.isNumber()) {
      return "float";
    }
    if (v.isBoolean()) {
      return "bool";
    }
    if (v.isArray()) {
      return "list";
    }
    if (v.isObject()) {
      return "dict";
    }
    return "NoneType";
  }

  private static String repr(JsonNode v) {
    String text = v.isTextual() ? "'" + v.asText() + "'" : v.toString();
    return text.length() > 100 ? text.substring(0, 100) : text;
  }
}
