package dev.spanflow.realtime;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/** Subject templates like {@code alerts.{device}}, filled from a row (both JetStream sinks). */
final class Subjects {
  private Subjects() {}

  /**
   * {@code template} with each {field} replaced by the row's value as a token; a missing
   * or null field becomes "_". With {@code hiddenToo} false, fields whose names start
   * with "_" (not published) count as missing.
   */
  static String fill(String template, Row row, StructType schema, boolean hiddenToo) {
    if (template.indexOf('{') < 0) {
      return template;
    }
    StringBuilder out = new StringBuilder();
    int i = 0;
    while (i < template.length()) {
      char c = template.charAt(i);
      int close = c == '{' ? template.indexOf('}', i) : -1;
      if (close < 0) {
        out.append(c);
        i++;
        continue;
      }
      String field = template.substring(i + 1, close);
      int index = !hiddenToo && field.startsWith("_") ? -1 : fieldIndex(schema, field);
      Object value = index < 0 ? null : row.get(index);
      out.append(value == null ? "_" : token(text(value)));
      i = close + 1;
    }
    return out.toString();
  }

  static int fieldIndex(StructType schema, String name) {
    StructField[] fields = schema.fields();
    for (int i = 0; i < fields.length; i++) {
      if (fields[i].name().equals(name)) {
        return i;
      }
    }
    return -1;
  }

  /** Letters, digits, '-' and '_' kept, anything else '_' (spanflow.nats.streams.token). */
  static String token(String value) {
    StringBuilder out = new StringBuilder(value.length());
    for (int i = 0; i < value.length(); i++) {
      char ch = value.charAt(i);
      out.append(Character.isLetterOrDigit(ch) || ch == '-' || ch == '_' ? ch : '_');
    }
    return out.length() == 0 ? "_" : out.toString();
  }

  /** A value as Python's str() spells it, where the two differ in a way a token keeps. */
  private static String text(Object value) {
    if (value instanceof Boolean) {
      return (Boolean) value ? "True" : "False";
    }
    return String.valueOf(value);
  }
}
