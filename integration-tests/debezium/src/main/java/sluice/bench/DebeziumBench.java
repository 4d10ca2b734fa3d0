package sluice.bench;

import java.io.IOException;
import java.io.InputStream;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogManager;
import java.util.logging.Logger;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.format.Json;

/**
 * Debezium's embedded engine as a peer of Sluice's worker in the bench: one binlog connector
 * (MySQL, or MariaDB) reads a server's binlog from its beginning, without a snapshot, and every
 * change event, serialized as Debezium's JSON without schemas, is sent to Kafka with a
 * KafkaProducer set up as Sluice's producer is. It counts the row events (values whose op is
 * c, u, d or r) Kafka acknowledged and, when they reach --events, prints one JSON line with
 * the time taken and the process's own peak RSS and CPU time, then exits 0.
 *
 * <pre>
 * DebeziumBench --port P --user U --password W --topic-prefix T --work-dir D --events N
 *   [--connector mysql|mariadb] [--host H] [--server-id ID] [--database DBS] [--table TABLES]
 *   [--bootstrap HOST:PORT] [--timeout-s S] [--progress-s S] [--hold]
 *   [--set ENGINE_KEY=VALUE]... [--producer-set PRODUCER_KEY=VALUE]...
 * </pre>
 *
 * Each option may come from the environment instead: DEBEZIUM_BENCH_ and its name in upper
 * case with underscores (DEBEZIUM_BENCH_TOPIC_PREFIX). Exit codes: 0 done, 1 an error of the
 * engine or of Kafka, 2 a usage error, 3 the timeout.
 */
public final class DebeziumBench {

    private static final String USAGE = "usage: DebeziumBench --port P --user U --password W --topic-prefix T"
            + " --work-dir D --events N [--connector mysql|mariadb] [--host H] [--server-id ID]"
            + " [--database DBS] [--table TABLES] [--bootstrap HOST:PORT] [--timeout-s S]"
            + " [--progress-s S] [--hold] [--set KEY=VALUE]... [--producer-set KEY=VALUE]...";

    private static final class UsageException extends Exception {
        UsageException(String message) {
            super(message);
        }
    }

    /** The command line, each option falling back to its DEBEZIUM_BENCH_ variable. */
    private static final class Options {
        final Map<String, String> values = new LinkedHashMap<>();
        final List<String> engineSets = new ArrayList<>();
        final List<String> producerSets = new ArrayList<>();
        boolean hold;

        static Options parse(String[] args) throws UsageException {
            Options o = new Options();
            for (int i = 0; i < args.length; i++) {
                String arg = args[i];
                if (!arg.startsWith("--")) {
                    throw new UsageException("unexpected argument " + arg);
                }
                String name = arg.substring(2);
                String value = null;
                int eq = name.indexOf('=');
                if (eq >= 0) {
                    value = name.substring(eq + 1);
                    name = name.substring(0, eq);
                }
                if (name.equals("hold")) {
                    o.hold = true;
                    continue;
                }
                if (name.equals("help")) {
                    throw new UsageException("");
                }
                if (value == null) {
                    if (i + 1 >= args.length) {
                        throw new UsageException("--" + name + " needs a value");
                    }
                    value = args[++i];
                }
                switch (name) {
                    case "set":
                        o.engineSets.add(value);
                        break;
                    case "producer-set":
                        o.producerSets.add(value);
                        break;
                    default:
                        o.values.put(name, value);
                }
            }
            return o;
        }

        private static String envName(String name) {
            return "DEBEZIUM_BENCH_" + name.toUpperCase(Locale.ROOT).replace('-', '_');
        }

        String get(String name, String fallback) {
            String v = values.get(name);
            if (v == null) {
                v = System.getenv(envName(name));
            }
            return v == null || v.isEmpty() ? fallback : v;
        }

        String required(String name) throws UsageException {
            String v = get(name, null);
            if (v == null) {
                throw new UsageException("--" + name + " (or " + envName(name) + ") is required");
            }
            return v;
        }

        long number(String name, String fallback) throws UsageException {
            String v = fallback == null ? required(name) : get(name, fallback);
            try {
                return Long.parseLong(v);
            }
            catch (NumberFormatException e) {
                throw new UsageException("--" + name + ": not a number: " + v);
            }
        }

        static void putAll(Properties props, List<String> sets, String option) throws UsageException {
            for (String kv : sets) {
                int eq = kv.indexOf('=');
                if (eq <= 0) {
                    throw new UsageException(option + " " + kv + ": expected KEY=VALUE");
                }
                props.setProperty(kv.substring(0, eq), kv.substring(eq + 1));
            }
        }
    }

    public static void main(String[] args) {
        quietJavaUtilLogging();
        int code;
        try {
            code = new DebeziumBench().run(Options.parse(args));
        }
        catch (UsageException e) {
            if (!e.getMessage().isEmpty()) {
                System.err.println("debezium-bench: " + e.getMessage());
            }
            System.err.println(USAGE);
            code = 2;
        }
        catch (Throwable e) {
            System.err.println("debezium-bench: ERROR: " + describe(e));
            e.printStackTrace(System.err);
            code = 1;
        }
        System.out.flush();
        System.err.flush();
        System.exit(code);
    }

    /**
     * The binlog client logs through java.util.logging (INFO lines at every connection):
     * held at the level slf4j-simple is given (run.sh: DEBEZIUM_LOG_LEVEL, default warn).
     */
    private static void quietJavaUtilLogging() {
        String level = System.getProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn").toLowerCase(Locale.ROOT);
        Level jul;
        switch (level) {
            case "trace":
            case "debug":
                jul = Level.FINE;
                break;
            case "info":
                jul = Level.INFO;
                break;
            case "error":
                jul = Level.SEVERE;
                break;
            default:
                jul = Level.WARNING;
        }
        Logger root = LogManager.getLogManager().getLogger("");
        root.setLevel(jul);
        for (Handler h : root.getHandlers()) {
            h.setLevel(jul);
        }
    }

    // What the engine's threads and the producer's callbacks report to the main thread.
    private final AtomicLong rowsAcked = new AtomicLong();
    private final AtomicLong recordsSeen = new AtomicLong();
    private final AtomicReference<Throwable> failure = new AtomicReference<>();
    private final CountDownLatch finished = new CountDownLatch(1);
    private volatile long startNanos;
    private volatile long firstEventNanos;
    private volatile long doneNanos;
    private long target;

    private int run(Options o) throws Exception {
        String connector = o.get("connector", "mysql");
        String connectorClass;
        switch (connector) {
            case "mysql":
                connectorClass = "io.debezium.connector.mysql.MySqlConnector";
                break;
            case "mariadb":
                connectorClass = "io.debezium.connector.mariadb.MariaDbConnector";
                break;
            default:
                throw new UsageException("--connector: mysql or mariadb, not " + connector);
        }
        target = o.number("events", null);
        if (target <= 0) {
            throw new UsageException("--events must be positive");
        }
        long timeoutS = o.number("timeout-s", "3600");
        long progressS = o.number("progress-s", "2");
        String topicPrefix = o.required("topic-prefix");
        Path work = Paths.get(o.required("work-dir")).toAbsolutePath();
        Files.createDirectories(work);
        Path offsets = work.resolve("offsets.dat");
        Path history = work.resolve("schema-history.dat");
        // Always from the binlog's beginning: what an earlier run left is forgotten.
        for (Path p : new Path[]{ offsets, history }) {
            if (Files.deleteIfExists(p)) {
                System.err.println("debezium-bench: removed " + p + " of an earlier run");
            }
        }

        Properties engine = new Properties();
        engine.setProperty("name", "sluice-debezium-bench");
        engine.setProperty("connector.class", connectorClass);
        engine.setProperty("database.hostname", o.get("host", "127.0.0.1"));
        engine.setProperty("database.port", o.required("port"));
        engine.setProperty("database.user", o.required("user"));
        engine.setProperty("database.password", o.get("password", ""));
        engine.setProperty("database.server.id", Long.toString(o.number("server-id", "184054")));
        engine.setProperty("topic.prefix", topicPrefix);
        String databases = o.get("database", null);
        if (databases != null) {
            engine.setProperty("database.include.list", databases);
        }
        String tables = o.get("table", null);
        if (tables != null) {
            engine.setProperty("table.include.list", tables);
        }
        engine.setProperty("offset.storage", "org.apache.kafka.connect.storage.FileOffsetBackingStore");
        engine.setProperty("offset.storage.file.filename", offsets.toString());
        engine.setProperty("schema.history.internal", "io.debezium.storage.file.history.FileSchemaHistory");
        engine.setProperty("schema.history.internal.file.filename", history.toString());
        // No snapshot: Debezium 3.6 dropped snapshot.mode=never; the configuration-based mode
        // with no schema, no data and streaming on is its replacement. Without offsets the
        // binlog is read from its first file, and the schema built from the DDL found there.
        engine.setProperty("snapshot.mode", "configuration_based");
        engine.setProperty("snapshot.mode.configuration.based.snapshot.schema", "false");
        engine.setProperty("snapshot.mode.configuration.based.snapshot.data", "false");
        engine.setProperty("snapshot.mode.configuration.based.start.stream", "true");
        // Debezium's JSON without the schema in every message (Sluice's topics carry none).
        engine.setProperty("converter.schemas.enable", "false");
        engine.setProperty("key.converter.schemas.enable", "false");
        engine.setProperty("value.converter.schemas.enable", "false");
        Options.putAll(engine, o.engineSets, "--set");

        // Sluice's producer (crates/kafka, producer()): idempotent, acks=all, 5 in flight,
        // 5 ms linger, no compression; librdkafka's batches are up to 1,000,000 bytes and
        // 10,000 messages, the Java client's are bounded in bytes only.
        Properties producerProps = new Properties();
        producerProps.setProperty(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, o.get("bootstrap", "127.0.0.1:19092"));
        producerProps.setProperty(ProducerConfig.CLIENT_ID_CONFIG, "sluice-debezium-bench");
        producerProps.setProperty(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        producerProps.setProperty(ProducerConfig.ACKS_CONFIG, "all");
        producerProps.setProperty(ProducerConfig.MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION, "5");
        producerProps.setProperty(ProducerConfig.LINGER_MS_CONFIG, "5");
        producerProps.setProperty(ProducerConfig.BATCH_SIZE_CONFIG, "1000000");
        producerProps.setProperty(ProducerConfig.COMPRESSION_TYPE_CONFIG, "none");
        producerProps.setProperty(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        producerProps.setProperty(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        Options.putAll(producerProps, o.producerSets, "--producer-set");

        KafkaProducer<String, String> producer = new KafkaProducer<>(producerProps);

        DebeziumEngine<ChangeEvent<String, String>> dbz = DebeziumEngine.create(Json.class)
                .using(engine)
                .notifying((records, committer) -> handleBatch(producer, records, committer))
                .using((success, message, error) -> {
                    // The engine stopped: before the target, that is a failure.
                    if (finished.getCount() > 0) {
                        fail(error != null ? error
                                : new IllegalStateException("the engine stopped" + (success ? "" : " with an error")
                                        + (message != null ? ": " + message : "")));
                    }
                })
                .build();

        ExecutorService engineThread = Executors.newSingleThreadExecutor(r -> {
            Thread t = new Thread(r, "debezium-engine");
            t.setDaemon(true);
            return t;
        });
        double jvmStartupS = ManagementFactory.getRuntimeMXBean().getUptime() / 1000.0;
        startNanos = System.nanoTime();
        engineThread.execute(dbz);

        long deadline = startNanos + TimeUnit.SECONDS.toNanos(timeoutS);
        while (!finished.await(Math.max(1, progressS), TimeUnit.SECONDS)) {
            long now = System.nanoTime();
            System.out.printf(Locale.ROOT, "progress: %d row events acknowledged (%d records seen) at %.1f s%n",
                    rowsAcked.get(), recordsSeen.get(), seconds(now - startNanos));
            System.out.flush();
            if (now > deadline) {
                System.err.printf(Locale.ROOT, "debezium-bench: ERROR: timed out after %d s with %d of %d row events acknowledged%n",
                        timeoutS, rowsAcked.get(), target);
                return 3;
            }
        }
        Throwable error = failure.get();
        if (error != null) {
            System.err.println("debezium-bench: ERROR: " + describe(error));
            error.printStackTrace(System.err);
            return 1;
        }

        double secs = seconds(doneNanos - startNanos);
        Map<String, Long> status = procStatus();
        StringBuilder json = new StringBuilder();
        json.append("{\"events\":").append(target);
        json.append(",\"seconds\":").append(fmt(secs));
        json.append(",\"events_per_s\":").append(fmt(target / secs));
        json.append(",\"first_event_s\":").append(fmt(firstEventNanos == 0 ? -1 : seconds(firstEventNanos - startNanos)));
        json.append(",\"records\":").append(recordsSeen.get());
        json.append(",\"peak_rss_kib\":").append(status.getOrDefault("VmHWM", -1L));
        json.append(",\"rss_kib\":").append(status.getOrDefault("VmRSS", -1L));
        json.append(",\"cpu_s\":").append(fmt(processCpuSeconds()));
        json.append(",\"jvm_startup_s\":").append(fmt(jvmStartupS));
        json.append(",\"heap_max_mib\":").append(Runtime.getRuntime().maxMemory() >> 20);
        json.append(",\"connector\":\"").append(connector).append('"');
        json.append(",\"debezium\":\"").append(System.getProperty("sluice.debezium.version", "unknown")).append('"');
        json.append('}');
        System.out.println(json);
        System.out.flush();

        if (o.hold) {
            // Kept alive for a reader of /proc/<pid>, until stdin closes.
            InputStream in = System.in;
            byte[] buf = new byte[256];
            while (in.read(buf) >= 0) {
                // discard
            }
        }
        // A clean stop (the offsets file is written), bounded: the figures are printed.
        Thread closer = new Thread(() -> {
            try {
                dbz.close();
                producer.close(java.time.Duration.ofSeconds(5));
            }
            catch (IOException | RuntimeException e) {
                System.err.println("debezium-bench: closing: " + describe(e));
            }
        }, "closer");
        closer.setDaemon(true);
        closer.start();
        closer.join(10_000);
        return 0;
    }

    /**
     * One batch of the engine: every record is sent; the batch's offsets are committed only
     * once Kafka acknowledged all of them (as a Kafka Connect worker commits), so the engine
     * has one batch in Kafka's hands at a time, as many as max.batch.size records.
     */
    private void handleBatch(KafkaProducer<String, String> producer, List<ChangeEvent<String, String>> records,
                             DebeziumEngine.RecordCommitter<ChangeEvent<String, String>> committer)
            throws InterruptedException {
        CountDownLatch acks = new CountDownLatch(records.size());
        for (ChangeEvent<String, String> r : records) {
            recordsSeen.incrementAndGet();
            boolean row = isRowEvent(r.value());
            if (row && firstEventNanos == 0) {
                firstEventNanos = System.nanoTime();
            }
            producer.send(new ProducerRecord<>(r.destination(), r.key(), r.value()), (metadata, e) -> {
                if (e != null) {
                    fail(new IllegalStateException("Kafka did not take a record for " + r.destination(), e));
                }
                else if (row) {
                    rowAcked();
                }
                acks.countDown();
            });
        }
        acks.await();
        Throwable error = failure.get();
        if (error != null) {
            throw new IllegalStateException("stopping: " + describe(error), error);
        }
        for (ChangeEvent<String, String> r : records) {
            committer.markProcessed(r);
        }
        committer.markBatchFinished();
    }

    private void rowAcked() {
        if (rowsAcked.incrementAndGet() == target) {
            doneNanos = System.nanoTime();
            finished.countDown();
        }
    }

    private void fail(Throwable e) {
        if (failure.compareAndSet(null, e)) {
            finished.countDown();
        }
    }

    /**
     * A data change event: Debezium's envelope ({"before":...,"after":...,"source":...,
     * "transaction":...,"op":"c",...}, or that as the payload after its schema) with op c,
     * u, d or r. Schema changes, heartbeats,
     * transaction markers and tombstones (null values) are not. The envelope's op follows the
     * row images and the source block, and no later field holds text, so its last "op" key
     * is the envelope's.
     */
    static boolean isRowEvent(String value) {
        // Without schemas the envelope is the value; with them, the value's payload.
        if (value == null || !(value.startsWith("{\"before\":")
                || (value.startsWith("{\"schema\":") && value.contains(",\"payload\":{\"before\":")))) {
            return false;
        }
        int at = value.lastIndexOf("\"op\":\"");
        if (at < 0 || at + 6 >= value.length()) {
            return false;
        }
        char op = value.charAt(at + 6);
        return (op == 'c' || op == 'u' || op == 'd' || op == 'r') && value.charAt(at + 7) == '"';
    }

    /** The kB figures of /proc/self/status (VmHWM, VmRSS, ...). */
    private static Map<String, Long> procStatus() {
        Map<String, Long> out = new LinkedHashMap<>();
        try {
            for (String line : Files.readAllLines(Paths.get("/proc/self/status"), StandardCharsets.UTF_8)) {
                if (line.startsWith("Vm") && line.endsWith(" kB")) {
                    int colon = line.indexOf(':');
                    out.put(line.substring(0, colon), Long.parseLong(line.substring(colon + 1, line.length() - 3).trim()));
                }
            }
        }
        catch (IOException | RuntimeException e) {
            System.err.println("debezium-bench: /proc/self/status: " + describe(e));
        }
        return out;
    }

    /** User and system CPU time of the whole process (every thread, the JVM's own too). */
    private static double processCpuSeconds() {
        java.lang.management.OperatingSystemMXBean os = ManagementFactory.getOperatingSystemMXBean();
        if (os instanceof com.sun.management.OperatingSystemMXBean) {
            return ((com.sun.management.OperatingSystemMXBean) os).getProcessCpuTime() / 1e9;
        }
        return -1;
    }

    private static double seconds(long nanos) {
        return nanos / 1e9;
    }

    private static String fmt(double v) {
        return String.format(Locale.ROOT, "%.3f", v);
    }

    private static String describe(Throwable e) {
        StringBuilder s = new StringBuilder(String.valueOf(e));
        for (Throwable c = e.getCause(); c != null && c != c.getCause(); c = c.getCause()) {
            s.append(" <- ").append(c);
        }
        return s.toString();
    }
}
