package dev.spanflow.realtime;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;

/** Jackson (on Spark's class path) for the JetStream API's small JSON documents. */
final class Json {
  static final ObjectMapper MAPPER = new ObjectMapper();

  private Json() {}

  static String quote(String text) {
    try {
      return MAPPER.writeValueAsString(text);
    } catch (JsonProcessingException exc) {
      throw new IllegalStateException(exc);
    }
  }

  static ObjectNode object() {
    return MAPPER.createObjectNode();
  }

  static byte[] bytes(JsonNode node) {
    try {
      return MAPPER.writeValueAsBytes(node);
    } catch (JsonProcessingException exc) {
      throw new IllegalStateException(exc);
    }
  }

  static JsonNode parse(byte[] data) throws IOException {
    return MAPPER.readTree(data);
  }

  /** The JetStream API's answer, or an IOException with its error description. */
  static JsonNode apiAnswer(NatsClient.Msg msg, String what) throws IOException {
    JsonNode answer = parse(msg.data);
    JsonNode error = answer.get("error");
    if (error != null && !error.isNull()) {
      throw new IOException(what + ": " + error.path("description").asText(error.toString())
          + " (code " + error.path("err_code").asText("?") + ")");
    }
    return answer;
  }
}
