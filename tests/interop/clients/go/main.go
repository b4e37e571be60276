// Interop consumer on amqp091-go: for each queue named on the command line, get one message
// (auto-ack) and print what the client decoded as one canonical JSON line.
//
//	interop-go AMQP_URL QUEUE...
//
// The line format is the one every client in tests/interop/clients prints (see
// tests/interop/canonical.py). amqp091-go closes the connection on a table it cannot read;
// that is reported for the queue and a new connection serves the next one.
package main

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
)

type line map[string]interface{}

func main() {
	url := os.Args[1]
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	var conn *amqp.Connection
	for _, queue := range os.Args[2:] {
		result, err := get(&conn, url, queue)
		if err != nil {
			result = line{"queue": queue, "ok": false, "error": err.Error()}
			if conn != nil {
				conn.Close()
			}
			conn = nil
		}
		encoder := json.NewEncoder(out)
		encoder.SetEscapeHTML(false)
		if err := encoder.Encode(result); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		out.Flush()
	}
	if conn != nil {
		conn.Close()
	}
}

func get(conn **amqp.Connection, url, queue string) (line, error) {
	if *conn == nil || (*conn).IsClosed() {
		c, err := amqp.DialConfig(url, amqp.Config{Heartbeat: 0})
		if err != nil {
			return nil, err
		}
		*conn = c
	}
	ch, err := (*conn).Channel()
	if err != nil {
		return nil, err
	}
	d, ok, err := ch.Get(queue, true)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("queue is empty")
	}
	ch.Close()
	props := map[string]interface{}{}
	put := func(name string, v interface{}) {
		switch x := v.(type) {
		case string:
			if x == "" {
				return
			}
		case uint8:
			if x == 0 {
				return
			}
		}
		props[name] = v
	}
	put("app_id", d.AppId)
	put("content_encoding", d.ContentEncoding)
	put("content_type", d.ContentType)
	put("correlation_id", d.CorrelationId)
	put("delivery_mode", d.DeliveryMode)
	put("expiration", d.Expiration)
	put("message_id", d.MessageId)
	put("priority", d.Priority)
	put("reply_to", d.ReplyTo)
	if !d.Timestamp.IsZero() {
		props["timestamp"] = d.Timestamp.Unix()
	}
	put("type", d.Type)
	put("user_id", d.UserId)
	return line{
		"queue":      queue,
		"ok":         true,
		"body":       text([]byte(d.Body)),
		"properties": props,
		"headers":    table(d.Headers),
	}, nil
}

func table(t amqp.Table) map[string]interface{} {
	out := map[string]interface{}{}
	for k, v := range t {
		out[k] = value(v)
	}
	return out
}

// text is a JSON string for valid UTF-8, else {"hex": "..."}.
func text(b []byte) interface{} {
	if utf8.Valid(b) {
		return string(b)
	}
	return map[string]string{"hex": hex.EncodeToString(b)}
}

func number(f float64) interface{} {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	text := strconv.FormatFloat(f, 'g', -1, 64)
	if !strings.ContainsAny(text, ".e") {
		text += ".0" // a JSON reader would take "1" or "-0" for an integer
	}
	return json.RawMessage(text)
}

func value(v interface{}) []interface{} {
	switch x := v.(type) {
	case nil:
		return []interface{}{"void", nil}
	case bool:
		return []interface{}{"bool", x}
	case int8:
		return []interface{}{"int8", x}
	case uint8:
		return []interface{}{"uint8", x}
	case int16:
		return []interface{}{"int16", x}
	case int32:
		return []interface{}{"int32", x}
	case int64:
		return []interface{}{"int64", x}
	case float32:
		return []interface{}{"float32", number(float64(x))}
	case float64:
		return []interface{}{"float64", number(x)}
	case amqp.Decimal:
		return []interface{}{"decimal", fmt.Sprintf("%dE-%d", x.Value, x.Scale)}
	case string:
		return []interface{}{"string", text([]byte(x))}
	case []byte:
		return []interface{}{"bytes", text(x)}
	case time.Time:
		return []interface{}{"time", x.Unix()}
	case amqp.Table:
		return []interface{}{"table", table(x)}
	case []interface{}:
		items := []interface{}{}
		for _, item := range x {
			items = append(items, value(item))
		}
		return []interface{}{"array", items}
	}
	return []interface{}{fmt.Sprintf("unknown:%T", v), fmt.Sprint(v)}
}
