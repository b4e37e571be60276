// Interop consumer on the RabbitMQ Java client: for each queue named on the command line, get
// one message (auto-ack) and print what the client decoded as one canonical JSON line.
//
//   java -cp amqp-client.jar:slf4j-api.jar:. InteropConsumer AMQP_URL QUEUE...
//
// Line format (shared by every client in tests/interop/clients, see tests/interop/canonical.py):
//   {"queue": Q, "ok": true, "body": TEXT, "properties": {...}, "headers": {NAME: VALUE}}
//   {"queue": Q, "ok": false, "error": "what the client raised"}
// VALUE is [KIND, V]: KIND names the type this client handed over (int8 ... table), V is
// the value in JSON. A decode failure kills the connection here; it is reported for that
// queue and a new connection serves the next one.

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.GetResponse;
import com.rabbitmq.client.LongString;
import java.math.BigDecimal;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Date;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

public final class InteropConsumer {
    private InteropConsumer() {}

    public static void main(String[] args) throws Exception {
        ConnectionFactory factory = new ConnectionFactory();
        factory.setUri(args[0]);
        factory.setAutomaticRecoveryEnabled(false);
        factory.setRequestedHeartbeat(0);
        Connection connection = null;
        for (int i = 1; i < args.length; i++) {
            String queue = args[i];
            StringBuilder line = new StringBuilder();
            try {
                if (connection == null || !connection.isOpen()) {
                    connection = factory.newConnection();
                }
                Channel channel = connection.createChannel();
                GetResponse response = channel.basicGet(queue, true);
                if (response == null) {
                    failure(line, queue, "queue is empty");
                } else {
                    success(line, queue, response);
                }
                channel.close();
            } catch (Exception e) {
                failure(line, queue, describe(e));
                if (connection != null) {
                    connection.abort();
                }
                connection = null;
            }
            System.out.println(line);
            System.out.flush();
        }
        if (connection != null && connection.isOpen()) {
            connection.close();
        }
    }

    private static String describe(Throwable e) {
        StringBuilder text = new StringBuilder();
        for (Throwable t = e; t != null; t = t.getCause()) {
            if (text.length() > 0) {
                text.append(" <- ");
            }
            text.append(t.getClass().getName()).append(": ").append(t.getMessage());
        }
        return text.toString();
    }

    private static void failure(StringBuilder out, String queue, String error) {
        out.append("{\"error\":");
        string(out, error);
        out.append(",\"ok\":false,\"queue\":");
        string(out, queue);
        out.append('}');
    }

    private static void success(StringBuilder out, String queue, GetResponse response) {
        AMQP.BasicProperties p = response.getProps();
        Map<String, Object> props = new TreeMap<>();
        put(props, "app_id", p.getAppId());
        put(props, "cluster_id", p.getClusterId());
        put(props, "content_encoding", p.getContentEncoding());
        put(props, "content_type", p.getContentType());
        put(props, "correlation_id", p.getCorrelationId());
        put(props, "delivery_mode", p.getDeliveryMode());
        put(props, "expiration", p.getExpiration());
        put(props, "message_id", p.getMessageId());
        put(props, "priority", p.getPriority());
        put(props, "reply_to", p.getReplyTo());
        Date timestamp = p.getTimestamp();
        put(props, "timestamp", timestamp == null ? null : Long.valueOf(Math.floorDiv(timestamp.getTime(), 1000L)));
        put(props, "type", p.getType());
        put(props, "user_id", p.getUserId());
        out.append("{\"body\":");
        text(out, response.getBody());
        out.append(",\"headers\":");
        Map<String, Object> headers = p.getHeaders();
        table(out, headers == null ? Map.of() : headers);
        out.append(",\"ok\":true,\"properties\":{");
        boolean first = true;
        for (Map.Entry<String, Object> e : props.entrySet()) {
            if (!first) {
                out.append(',');
            }
            first = false;
            string(out, e.getKey());
            out.append(':');
            Object v = e.getValue();
            if (v instanceof String) {
                string(out, (String) v);
            } else {
                out.append(v);
            }
        }
        out.append("},\"queue\":");
        string(out, queue);
        out.append('}');
    }

    // A property is printed when present and not empty (Go cannot tell absent from "").
    private static void put(Map<String, Object> props, String name, Object value) {
        if (value == null || "".equals(value) || Integer.valueOf(0).equals(value)) {
            return;
        }
        props.put(name, value);
    }

    private static void table(StringBuilder out, Map<String, Object> table) {
        out.append('{');
        boolean first = true;
        for (Map.Entry<String, Object> e : new TreeMap<>(table).entrySet()) {
            if (!first) {
                out.append(',');
            }
            first = false;
            string(out, e.getKey());
            out.append(':');
            value(out, e.getValue());
        }
        out.append('}');
    }

    private static void pair(StringBuilder out, String kind) {
        out.append("[\"").append(kind).append("\",");
    }

    @SuppressWarnings("unchecked")
    private static void value(StringBuilder out, Object v) {
        if (v == null) {
            out.append("[\"void\",null]");
        } else if (v instanceof Boolean) {
            pair(out, "bool");
            out.append(v).append(']');
        } else if (v instanceof Byte) {
            pair(out, "int8");
            out.append(v).append(']');
        } else if (v instanceof Short) {
            pair(out, "int16");
            out.append(v).append(']');
        } else if (v instanceof Integer) {
            pair(out, "int32");
            out.append(v).append(']');
        } else if (v instanceof Long) {
            pair(out, "int64");
            out.append(v).append(']');
        } else if (v instanceof Float) {
            pair(out, "float32");
            number(out, ((Float) v).doubleValue());
            out.append(']');
        } else if (v instanceof Double) {
            pair(out, "float64");
            number(out, (Double) v);
            out.append(']');
        } else if (v instanceof BigDecimal) {
            BigDecimal d = (BigDecimal) v;
            pair(out, "decimal");
            string(out, d.unscaledValue() + "E-" + d.scale());
            out.append(']');
        } else if (v instanceof LongString) {
            pair(out, "string");
            text(out, ((LongString) v).getBytes());
            out.append(']');
        } else if (v instanceof byte[]) {
            pair(out, "bytes");
            text(out, (byte[]) v);
            out.append(']');
        } else if (v instanceof Date) {
            pair(out, "time");
            out.append(Math.floorDiv(((Date) v).getTime(), 1000L)).append(']');
        } else if (v instanceof Map) {
            pair(out, "table");
            table(out, (Map<String, Object>) v);
            out.append(']');
        } else if (v instanceof List) {
            pair(out, "array");
            out.append('[');
            boolean first = true;
            for (Object item : (List<Object>) v) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                value(out, item);
            }
            out.append("]]");
        } else {
            pair(out, "unknown:" + v.getClass().getName());
            string(out, v.toString());
            out.append(']');
        }
    }

    private static void number(StringBuilder out, double d) {
        if (Double.isNaN(d)) {
            out.append("\"NaN\"");
        } else if (Double.isInfinite(d)) {
            out.append(d > 0 ? "\"Infinity\"" : "\"-Infinity\"");
        } else {
            out.append(Double.toString(d));
        }
    }

    // Bytes as a JSON string when they are valid UTF-8, else {"hex": "..."}.
    private static void text(StringBuilder out, byte[] bytes) {
        try {
            String s = StandardCharsets.UTF_8.newDecoder()
                .onMalformedInput(CodingErrorAction.REPORT)
                .onUnmappableCharacter(CodingErrorAction.REPORT)
                .decode(ByteBuffer.wrap(bytes))
                .toString();
            string(out, s);
        } catch (CharacterCodingException e) {
            StringBuilder hex = new StringBuilder();
            for (byte b : bytes) {
                hex.append(String.format("%02x", b & 0xff));
            }
            out.append("{\"hex\":\"").append(hex).append("\"}");
        }
    }

    private static void string(StringBuilder out, String s) {
        out.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20 || c > 0x7e) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        out.append('"');
    }
}
