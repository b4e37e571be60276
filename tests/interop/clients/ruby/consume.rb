# frozen_string_literal: true

# Interop consumer on Bunny / amq-protocol: for each queue named on the command line, get one
# message (auto-ack) and print what the client decoded as one canonical JSON line.
#
#   ruby consume.rb AMQP_URL QUEUE...
#
# The line format is the one every client in tests/interop/clients prints (see
# tests/interop/canonical.py). amq-protocol raises on a tag it does not know, in Bunny's
# reader thread; that is reported for the queue and a new connection serves the next one.
# Ruby has one String type: a byte array and a long string both arrive as "string".

require "bigdecimal"
require "bunny"
require "openssl"
require "json"
require "logger"

def text(bytes)
  s = bytes.dup.force_encoding(Encoding::UTF_8)
  s.valid_encoding? ? s : { "hex" => bytes.unpack1("H*") }
end

def number(f)
  return "NaN" if f.nan?
  return (f.positive? ? "Infinity" : "-Infinity") if f.infinite?

  f
end

def value(v)
  case v
  when nil then ["void", nil]
  when true, false then ["bool", v]
  when Integer then ["int", v]
  when Float then ["float", number(v)]
  when BigDecimal then ["decimal", v.to_s("E")]
  when String then ["string", text(v)]
  when Time then ["time", v.to_i]
  when Hash then ["table", table(v)]
  when Array then ["array", v.map { |item| value(item) }]
  else ["unknown:#{v.class}", v.to_s]
  end
end

def table(t)
  (t || {}).keys.sort.to_h { |k| [text(k), value(t[k])] }
end

PROPERTIES = {
  "app_id" => :app_id, "cluster_id" => :cluster_id, "content_encoding" => :content_encoding,
  "content_type" => :content_type, "correlation_id" => :correlation_id,
  "delivery_mode" => :delivery_mode, "expiration" => :expiration, "message_id" => :message_id,
  "priority" => :priority, "reply_to" => :reply_to, "timestamp" => :timestamp, "type" => :type,
  "user_id" => :user_id
}.freeze

# basic_get hands over the properties as a Hash of symbols.
def properties(p)
  out = {}
  PROPERTIES.each do |name, getter|
    v = p[getter]
    next if v.nil? || v == "" || v == 0

    out[name] = v.is_a?(Time) ? v.to_i : (v.is_a?(String) ? text(v) : v)
  end
  out
end

def connect(url)
  session = Bunny.new(url, automatically_recover: false, heartbeat: 0,
                           continuation_timeout: 15_000, logger: Logger.new(nil))
  session.start
  session
end

# Bunny decodes frames in its reader thread. When amq-protocol raises there (a tag it does
# not know), that thread ends with the error and basic_get would only time out; so the get
# runs in a worker thread, and the reader thread's own exception is the result if it dies.
def get(session, queue)
  reader = session.send(:reader_loop).instance_variable_get(:@thread)
  channel = session.create_channel
  worker = Thread.new { channel.basic_get(queue, manual_ack: false) }
  worker.report_on_exception = false
  loop do
    return worker.value if worker.join(0.02)
    next if reader.nil? || reader.alive?

    worker.kill
    reader.join # raises what ended the reader thread
    raise "Bunny's reader thread stopped"
  end
end

def canonical(obj)
  case obj
  when Hash then obj.keys.sort.to_h { |k| [k, canonical(obj[k])] }
  when Array then obj.map { |item| canonical(item) }
  else obj
  end
end

url = ARGV[0]
session = nil
$stdout.sync = true
Thread.report_on_exception = false
ARGV[1..].each do |queue|
  result =
    begin
      session = connect(url) if session.nil? || !session.open?
      info, props, body = get(session, queue)
      if info.nil?
        { "queue" => queue, "ok" => false, "error" => "queue is empty" }
      else
        { "queue" => queue, "ok" => true, "body" => text(body),
          "properties" => properties(props), "headers" => table(props[:headers]) }
      end
    rescue Exception => e # rubocop:disable Lint/RescueException -- Bunny raises what its reader thread met
      # Its reader thread is gone, so a clean close would wait for a close-ok nobody reads.
      begin
        session&.transport&.close
      rescue StandardError
        nil
      end
      session = nil
      { "queue" => queue, "ok" => false, "error" => "#{e.class}: #{e.message}"[0, 2000] }
    end
  puts JSON.generate(canonical(result))
end
session&.close
