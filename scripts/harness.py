#!/usr/bin/env python3
"""The independent harness: Herald between wrk and nginx, measured from the outside.

wrk (Debian package `wrk`) posts 1 KiB messages through the Svix API with 64 connections,
round-robin over 10 applications; nginx (Debian package `nginx`) receives every delivery
and answers 204. Nothing of Herald's own bench tool is involved, so Herald's CPU per
delivered message is measured without the bench's generator and receiver: CPU is read from
/proc for Herald's process (and, with --postgres, for every process of the throwaway
cluster), deliveries from nginx's own request counter.

    scripts/harness.py [--binary PATH] [--postgres]
                       [--destination http|redis|nats|rabbitmq|kafka|sqs|sns|eventbridge]
                       [--duration 20] [--connections 64] [--idempotency-keys] [--pg-profile]
                       [--pg-locale LOCALE] [--pg-steady [--warmup 15]] [--json]

With --pg-profile (implies --postgres), the cluster loads pg_stat_statements and the run ends
with the bytes each kind of PostgreSQL process wrote (from /proc), its statements ranked by
WAL bytes, the buffers written by the checkpointer, the
background writer and the backends, and each table's inserts, updates (HOT ones apart) and
deletes: where the database's writes come from.

The cluster takes the environment's locale (C.UTF-8 on the project's machines); --pg-locale
en_US.UTF-8 gives it a language's collation, as many deployments have (initdb's default on
a machine set up in English), where every comparison of a text column whose collation is
the database's goes through strcoll.

With --pg-steady (implies --postgres), the cluster is one that has been running, as in any
deployment: shared_buffers sized to the run's working set (1 GB), WAL segments kept for
reuse, a warm-up of the same load (--warmup seconds) drained and checkpointed before the
measured run, and a checkpoint at the run's end whose writes are counted. Without it, a
15-second run on a fresh cluster counts one-off costs (each new 16 MB WAL segment zeroed,
backends evicting pages from the default 128 MB of buffers) and leaves the run's dirty
pages unwritten and uncounted.

With --idempotency-keys, every message carries an `Idempotency-Key` of its own, as the
official Svix SDKs send with every POST.

With --destination redis, nats or rabbitmq, every endpoint is an event destination instead:
a Redis stream per application on a throwaway redis-server (AOF, `appendfsync everysec`), a
subject per application taken by one file-storage JetStream stream on a throwaway
nats-server, or a durable queue per application on a throwaway rabbitmq-server (Debian
packages `redis-server`, `nats-server`, `rabbitmq-server`); deliveries are counted at the
broker (`XLEN`, the JetStream monitoring endpoint's message count, a passive
queue.declare's message count) and the broker's CPU is reported apart from Herald's.
With --destination kafka, a topic per application (3 partitions) on a throwaway tansu (a
Kafka-protocol broker; scripts/test.sh builds it into ~/.cache/herald/tansu-libsql) on its
SQLite storage, counted by the partitions' high watermarks; this one needs confluent-kafka,
so run the harness with the test environment's Python (~/.cache/herald/venv/bin/python).
With --destination sqs, sns or eventbridge, every endpoint is an Amazon destination sent to
nginx standing in for the service (answering each call with the service's success shape,
counted by nginx): Herald's side of the call is measured, not an AWS emulator's.

A run: start nginx and Herald (SQLite in a temporary directory, or a throwaway PostgreSQL
cluster), create the applications and endpoints, post for --duration seconds, wait until
nginx has received every accepted message, and report: accepted and delivered messages,
delivered per second (over the load and the drain), Herald's CPU per delivered message
(user + system), the database's, bytes written per message (every process's writes to
disk, from /proc), with --postgres the WAL bytes per message (pg_stat_wal, the cluster's
own count), and wrk's latency.
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import string
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

TOKEN = "harness-admin-token"
APPS = 10


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    """User + system CPU of a process, in seconds (children not included)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def written_bytes(pid):
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


def descendants(pid):
    """Every live process whose ancestry reaches `pid` (the cluster's backends)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
            except OSError:
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


class Group:
    """CPU and bytes written of a set of processes, counting processes that came and went
    (PostgreSQL backends) by summing every sample's live members."""

    def __init__(self, root):
        self.root = root
        self.seen = {}
        self.names = {}

    def sample(self):
        for pid in descendants(self.root):
            try:
                self.seen[pid] = (cpu_seconds(pid), written_bytes(pid))
                if pid not in self.names:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        self.names[pid] = f.read().split(b"\0")[0].decode(errors="replace")
            except OSError:
                pass

    def totals(self):
        return sum(c for c, _ in self.seen.values()), sum(w for _, w in self.seen.values())

    def written_by_name(self, before):
        """Bytes written since `before` (a copy of `seen`), summed by process title, every
        connection's backend together ("postgres: walwriter", "postgres: client backends")."""
        out = {}
        for pid, (_, written) in self.seen.items():
            words = self.names.get(pid, "?").split()
            title = " ".join(words[:2])
            if title == "postgres: herald":
                title = "postgres: client backends"
            elif title == "postgres: autovacuum":
                title = " ".join(words[:3])
            out[title] = out.get(title, 0) + written - before.get(pid, (0, 0))[1]
        return out


def wait_for(what, check, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.05)
    sys.exit(f"timed out waiting for {what}")


def api(base, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {TOKEN}")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"null")


def start_nginx(workdir, answer="return 204;"):
    port = free_port()
    conf = os.path.join(workdir, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""
worker_processes 1;
error_log {workdir}/nginx-error.log warn;
pid {workdir}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {workdir}/nginx-body;
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port};
        location = /nginx_status {{ stub_status; }}
        location / {{ {answer} }}
    }}
}}
""")
    process = subprocess.Popen(["nginx", "-c", conf, "-g", "daemon off;"], stderr=subprocess.DEVNULL)
    wait_for("nginx", lambda: nginx_requests(port) >= 0)
    return process, port


def nginx_requests(port):
    """nginx's own count of requests handled (the status requests themselves included)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/nginx_status", timeout=5) as response:
        text = response.read().decode()
    return int(re.search(r"\n\s*\d+\s+\d+\s+(\d+)", text).group(1))


class Nginx:
    """HTTP deliveries, received by nginx and counted by its own request counter."""

    def __init__(self, workdir):
        self.process, self.port = start_nginx(workdir)
        self.before = nginx_requests(self.port)
        self.polls = 0

    def endpoint(self, i):
        return {"url": f"http://127.0.0.1:{self.port}/hook/{i}"}

    def delivered(self):
        # Each status request is counted by nginx too.
        self.polls += 1
        return nginx_requests(self.port) - self.before - self.polls


class Amazon:
    """SQS, SNS or EventBridge destinations, each application its own queue, topic or bus,
    sent to nginx standing in for the service: it answers every request with the service's
    success (without checking the signature), so what is measured is Herald's side of the
    call (the message, SigV4 signing, the request), not an emulator's."""

    ANSWERS = {
        "sqs": ("application/x-amz-json-1.0", '{"MessageId":"harness"}'),
        "sns": ("text/xml", "<PublishResponse><PublishResult><MessageId>harness</MessageId></PublishResult></PublishResponse>"),
        "eventbridge": ("application/x-amz-json-1.1", '{"FailedEntryCount":0,"Entries":[{"EventId":"harness"}]}'),
    }

    def __init__(self, workdir, kind):
        content_type, body = self.ANSWERS[kind]
        self.kind = kind
        self.process, self.port = start_nginx(workdir, f"default_type {content_type}; return 200 '{body}';")
        self.before = nginx_requests(self.port)
        self.polls = 0

    def endpoint(self, i):
        service = f"http://127.0.0.1:{self.port}"
        key = {"username": "AKIAHARNESS", "password": "harness-secret-access-key"}
        settings = {
            "sqs": {"type": "sqs", "queueUrl": f"{service}/123456789012/harness-{i}"},
            "sns": {"type": "sns", "topicArn": f"arn:aws:sns:us-east-1:123456789012:harness-{i}", "broker": service},
            "eventbridge": {"type": "eventBridge", "eventBus": f"harness-{i}", "broker": service},
        }[self.kind]
        return {"destination": {**settings, "region": "us-east-1", "credentials": key}}

    def delivered(self):
        self.polls += 1
        return nginx_requests(self.port) - self.before - self.polls


class Redis:
    """Redis Streams destinations, one stream per application, counted with XLEN."""

    def __init__(self, workdir):
        self.port = free_port()
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", workdir,
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--protected-mode", "no",
             "--logfile", os.path.join(workdir, "redis.log")])
        wait_for("redis-server", lambda: self.command("PING") == "PONG")

    def command(self, *args):
        """One command; its simple answer (a status, an integer or an error)."""
        frame = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(frame.encode())
            line = s.makefile("rb").readline().decode().rstrip()
        if line.startswith("-"):
            sys.exit(f"redis: {line}")
        return int(line[1:]) if line.startswith(":") else line[1:]

    def endpoint(self, i):
        return {"destination": {"type": "redisStreams", "broker": f"redis://127.0.0.1:{self.port}/0",
                                "stream": f"harness-{i}", "createStream": True}}

    def delivered(self):
        return sum(self.command("XLEN", f"harness-{i}") for i in range(APPS))


class Nats:
    """NATS JetStream destinations, a subject per application, one file-storage stream
    taking them all, counted by the server's monitoring endpoint."""

    def __init__(self, workdir):
        self.port, self.monitor = free_port(), free_port()
        self.process = subprocess.Popen(
            ["nats-server", "-a", "127.0.0.1", "-p", str(self.port), "-m", str(self.monitor), "-js",
             "-sd", os.path.join(workdir, "nats")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for("nats-server", lambda: self.delivered() >= 0)
        self.request("$JS.API.STREAM.CREATE.HARNESS",
                     {"name": "HARNESS", "subjects": ["harness.>"], "storage": "file"})

    def request(self, subject, body):
        """A JetStream API request over a plain NATS connection; its answer."""
        payload = json.dumps(body).encode()
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            reader = s.makefile("rb")
            reader.readline()
            s.sendall(b'CONNECT {"verbose":false}\r\nSUB _INBOX.harness 1\r\n'
                      + f"PUB {subject} _INBOX.harness {len(payload)}\r\n".encode() + payload + b"\r\n")
            while True:
                line = reader.readline()
                if line.startswith(b"PING"):
                    s.sendall(b"PONG\r\n")
                elif line.startswith(b"-ERR") or not line:
                    sys.exit(f"nats: {line!r}")
                elif line.startswith(b"MSG"):
                    answer = json.loads(reader.read(int(line.split()[-1])))
                    if "error" in answer:
                        sys.exit(f"nats: {answer}")
                    return answer

    def endpoint(self, i):
        return {"destination": {"type": "natsJetStream", "broker": f"nats://127.0.0.1:{self.port}",
                                "subject": f"harness.app{i}"}}

    def delivered(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor}/jsz", timeout=5) as response:
            return json.loads(response.read())["messages"]


class Rabbit:
    """RabbitMQ destinations through the default exchange, a durable queue per application
    (persistent messages, publisher confirms), counted with a passive queue.declare. The
    server runs as the `rabbitmq` user when the harness runs as root."""

    def __init__(self, workdir):
        self.port, dist = free_port(), free_port()
        data = os.path.join(workdir, "rabbitmq")
        os.mkdir(data)
        env = [f"HOME={data}", f"RABBITMQ_NODENAME=rabbit-{self.port}@localhost",
               "RABBITMQ_NODE_IP_ADDRESS=127.0.0.1", f"RABBITMQ_NODE_PORT={self.port}", f"RABBITMQ_DIST_PORT={dist}",
               f"RABBITMQ_MNESIA_BASE={data}/mnesia", f"RABBITMQ_LOG_BASE={data}/log",
               f"RABBITMQ_ENABLED_PLUGINS_FILE={data}/enabled_plugins", f"RABBITMQ_CONFIG_FILE={data}/rabbitmq"]
        command = ["env", *env, "/usr/lib/rabbitmq/bin/rabbitmq-server"]
        if os.geteuid() == 0:
            shutil.chown(data, user="rabbitmq")
            command = ["runuser", "-u", "rabbitmq", "--", *command]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        wait_for("rabbitmq-server", lambda: self.queue_messages("harness-0", declare=True) >= 0)
        for i in range(1, APPS):
            self.queue_messages(f"harness-{i}", declare=True)

    def queue_messages(self, queue, declare=False):
        """The messages waiting in `queue` (a durable queue made first if `declare`), over a
        minimal AMQP 0-9-1 conversation as `guest`."""
        def frame(kind, channel, payload):
            return struct.pack(">BHI", kind, channel, len(payload)) + payload + b"\xce"

        def method(channel, class_id, method_id, args=b""):
            return frame(1, channel, struct.pack(">HH", class_id, method_id) + args)

        def short(text):
            return struct.pack(">B", len(text)) + text.encode()

        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            reader = s.makefile("rb")

            def expect(class_id, method_id):
                while True:
                    kind, _, size = struct.unpack(">BHI", reader.read(7))
                    payload = reader.read(size + 1)[:-1]
                    if kind == 1 and struct.unpack(">HH", payload[:4]) == (class_id, method_id):
                        return payload[4:]
                    if kind == 1 and payload[:4] in (b"\x00\x0a\x00\x32", b"\x00\x14\x00\x28"):
                        sys.exit(f"rabbitmq closed the conversation: {payload[6:].decode(errors='replace')}")

            s.sendall(b"AMQP\x00\x00\x09\x01")
            expect(10, 10)
            response = b"\x00guest\x00guest"
            s.sendall(method(0, 10, 11, struct.pack(">I", 0) + short("PLAIN")
                             + struct.pack(">I", len(response)) + response + short("en_US")))
            channel_max, frame_max, _ = struct.unpack(">HIH", expect(10, 30)[:8])
            s.sendall(method(0, 10, 31, struct.pack(">HIH", channel_max, frame_max, 0)))
            s.sendall(method(0, 10, 40, short("/") + short("") + b"\x00"))
            expect(10, 41)
            s.sendall(method(1, 20, 10, short("")))
            expect(20, 11)
            flags = 2 if declare else 1  # durable, or passive
            s.sendall(method(1, 50, 10, struct.pack(">H", 0) + short(queue) + struct.pack(">BI", flags, 0)))
            answer = expect(50, 11)
            return struct.unpack(">I", answer[1 + answer[0]:5 + answer[0]])[0]

    def endpoint(self, i):
        return {"destination": {"type": "rabbitmq", "broker": f"amqp://127.0.0.1:{self.port}/",
                                "routingKey": f"harness-{i}"}}

    def delivered(self):
        return sum(self.queue_messages(f"harness-{i}") for i in range(APPS))


class Kafka:
    """Kafka destinations, a topic of three partitions per application on a throwaway tansu
    (SQLite storage, no SASL), counted by the partitions' high watermarks."""

    def __init__(self, workdir):
        from confluent_kafka.admin import AdminClient, NewTopic
        self.port = free_port()
        tansu = shutil.which("tansu") or os.path.expanduser("~/.cache/herald/tansu-libsql/bin/tansu")
        listener = f"tcp://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [tansu, "broker", "--listener-url", listener, "--advertised-listener-url", listener,
             "--storage-engine", "sqlite://tansu.db"],
            cwd=workdir, stdout=subprocess.DEVNULL, stderr=open(os.path.join(workdir, "tansu.log"), "w"))
        self.config = {"bootstrap.servers": f"127.0.0.1:{self.port}", "log_level": 3}
        wait_for("tansu", lambda: socket.create_connection(("127.0.0.1", self.port), timeout=1).close() is None)
        topics = [NewTopic(f"harness-{i}", num_partitions=3, replication_factor=1) for i in range(APPS)]
        admin = AdminClient(self.config)  # kept until the topics are made
        for future in admin.create_topics(topics).values():
            future.result(timeout=30)

    def endpoint(self, i):
        return {"destination": {"type": "kafka", "broker": f"kafka://127.0.0.1:{self.port}",
                                "topic": f"harness-{i}", "partitionKey": "messageId"}}

    def delivered(self):
        from confluent_kafka import Consumer, TopicPartition
        consumer = Consumer({**self.config, "group.id": "harness"})
        try:
            return sum(consumer.get_watermark_offsets(TopicPartition(f"harness-{i}", p), timeout=10)[1]
                       for i in range(APPS) for p in range(3))
        finally:
            consumer.close()


RECEIVERS = {"http": Nginx, "redis": Redis, "nats": Nats, "rabbitmq": Rabbit, "kafka": Kafka,
             "sqs": lambda workdir: Amazon(workdir, "sqs"), "sns": lambda workdir: Amazon(workdir, "sns"),
             "eventbridge": lambda workdir: Amazon(workdir, "eventbridge")}


# A cluster sized for the load (`--pg-steady`): the working set of a run fits in its
# buffers, WAL segments are kept for reuse, and no checkpoint falls inside a run (the run
# ends with one of its own, counted).
STEADY_SETTINGS = "-c shared_buffers=1GB -c min_wal_size=2GB -c max_wal_size=4GB -c checkpoint_timeout=1h"


def start_postgres(workdir, profile=False, locale=None, steady=False):
    """A throwaway cluster (initdb + postgres, in `locale` if given, else the environment's);
    as root it runs as the `postgres` user. With `profile`, pg_stat_statements is loaded
    (see `pg_profile`); with `steady`, STEADY_SETTINGS apply."""
    bindir = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
    if not bindir or not os.path.exists(os.path.join(bindir, "initdb")):
        candidates = sorted(d for d in os.listdir("/usr/lib/postgresql") if d.isdigit())
        bindir = f"/usr/lib/postgresql/{candidates[-1]}/bin"
    data = os.path.join(workdir, "pg")
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
    if os.getuid() == 0:
        shutil.chown(workdir, "postgres")
    subprocess.run(as_postgres + [f"{bindir}/initdb", "-D", data, "-U", "herald", "--auth=trust", "-N"]
                   + ([f"--locale={locale}"] if locale else []), check=True, capture_output=True)
    port = free_port()
    options = f"-p {port} -k {workdir} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=on"
    if profile:
        options += " -c shared_preload_libraries=pg_stat_statements -c track_io_timing=on"
    if steady:
        options += " " + STEADY_SETTINGS
    process = subprocess.Popen(as_postgres + [f"{bindir}/postgres", "-D", data] + options.split(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for("postgres", lambda: subprocess.run(
        [f"{bindir}/pg_isready", "-h", "127.0.0.1", "-p", str(port)], capture_output=True).returncode == 0)
    subprocess.run([f"{bindir}/createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "herald", "herald"], check=True)
    url = f"postgres://herald@127.0.0.1:{port}/herald"
    if profile:
        psql(url, "CREATE EXTENSION pg_stat_statements")
    return process, url


def psql(url, sql):
    return subprocess.run(["psql", url, "-AtF", "\t", "-c", sql], capture_output=True, text=True, check=True).stdout


# What the cluster did during the load, per delivered message: the statements by WAL volume
# and time, the buffers written by whom (8 KiB each), and each table's inserts, updates (and
# how many were HOT) and deletes.
PROFILE_RESET = "SELECT pg_stat_statements_reset(), pg_stat_reset_shared('bgwriter'), pg_stat_reset()"
PROFILE_STATEMENTS = """SELECT calls, round(wal_bytes / {n}), round((total_exec_time * 1000 / {n})::numeric, 1),
    round(shared_blks_dirtied::numeric / {n}, 3), regexp_replace(left(query, 110), '\s+', ' ', 'g')
    FROM pg_stat_statements ORDER BY wal_bytes DESC LIMIT 12"""
PROFILE_BUFFERS = """SELECT round(buffers_checkpoint * 8192.0 / {n}), round(buffers_clean * 8192.0 / {n}),
    round(buffers_backend * 8192.0 / {n}), checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"""
PROFILE_TABLES = """SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del,
    pg_size_pretty(pg_total_relation_size(relid)) FROM pg_stat_user_tables
    WHERE n_tup_ins + n_tup_upd + n_tup_del > 0 ORDER BY n_tup_ins + n_tup_upd DESC"""


def pg_profile(url, delivered, written_by_name):
    n = max(delivered, 1)
    print("bytes written to disk per message, by PostgreSQL process (/proc)")
    for name, written in sorted(written_by_name.items(), key=lambda kv: -kv[1]):
        print(f"{round(written / n)}\t{name}")
    print("statements by WAL: calls | WAL bytes/msg | exec µs/msg | buffers dirtied/msg | query")
    print(psql(url, PROFILE_STATEMENTS.format(n=n)))
    print("buffers written per message (bytes): checkpointer | bgwriter | backends | checkpoints")
    print(psql(url, PROFILE_BUFFERS.format(n=n)))
    print("tables: inserts | updates | HOT updates | deletes | size")
    print(psql(url, PROFILE_TABLES))


def wal_bytes(url):
    """The cluster's WAL bytes written so far (pg_stat_wal, PostgreSQL 14 and later)."""
    out = subprocess.run(["psql", url, "-Atc", "select wal_bytes from pg_stat_wal"],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip())


def event_payload(payload_bytes):
    """A payment event as a payment provider sends one: nested objects, ids that never
    repeat within it, amounts, an address; padded with line items to `payload_bytes`. It
    compresses as real webhook bodies do (zstd level 1: about 1.6x), where the filler
    compresses to almost nothing."""
    rng = random.Random(35)
    ident = lambda prefix, n=24: prefix + "_" + "".join(rng.choice(string.ascii_letters + string.digits)
                                                       for _ in range(n))
    event = {
        "id": ident("evt"), "object": "event", "api_version": "2024-06-20", "created": 1733500000,
        "type": "payment_intent.succeeded", "livemode": False, "pending_webhooks": 1,
        "request": {"id": ident("req", 14), "idempotency_key": str(uuid.UUID(int=rng.getrandbits(128)))},
        "data": {"object": {
            "id": ident("pi"), "object": "payment_intent", "amount": 4599, "amount_received": 4599,
            "currency": "usd", "customer": ident("cus", 14), "latest_charge": ident("ch"),
            "payment_method": ident("pm"), "payment_method_types": ["card"], "status": "succeeded",
            "receipt_email": "jenny.rosen@example.com",
            "metadata": {"order_id": str(rng.randrange(10**9)), "sku": "SKU-%d-BLUE-XL" % rng.randrange(10**4)},
            "shipping": {"name": "Jenny Rosen", "address": {
                "line1": "%d Market Street" % rng.randrange(1000), "city": "San Francisco",
                "postal_code": "94103", "state": "CA", "country": "US"}},
            "items": [],
        }},
    }
    items = event["data"]["object"]["items"]
    while len(json.dumps(event)) < payload_bytes - 80:
        items.append({"id": ident("li", 14), "price": ident("price", 14), "quantity": rng.randrange(1, 9)})
    return event


def wrk_script(workdir, app_ids, payload_bytes, payload_shape, idempotency_keys):
    if payload_shape == "event":
        payload = event_payload(payload_bytes)
    else:
        payload = {"filler": "x" * max(0, payload_bytes - 14)}
    body = json.dumps({"eventType": "harness.event", "payload": payload})
    path = os.path.join(workdir, "post.lua")
    paths = ", ".join(f'"/api/v1/app/{a}/msg"' for a in app_ids)
    # With idempotency keys, each request carries a key of its own, random as the Svix SDKs
    # send them ("auto_" and a version-4 UUID): keys that follow each other in order would
    # flatter any index of keys.
    keyed = "true" if idempotency_keys else "false"
    with open(path, "w") as f:
        f.write(f"""
local paths = {{ {paths} }}
local n = 0
local threads = 0
wrk.method = "POST"
wrk.body = {json.dumps(body)}
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {TOKEN}"
setup = function(thread)
    threads = threads + 1
    thread:set("thread_id", threads)
end
request = function()
    n = n + 1
    local path = paths[(n % #paths) + 1]
    if {keyed} then
        local headers = {{}}
        for k, v in pairs(wrk.headers) do headers[k] = v end
        if n == 1 then math.randomseed(os.time() * 100 + thread_id) end
        local r = function() return math.random(0, 65535) end
        headers["Idempotency-Key"] = string.format("auto_%04x%04x-%04x-4%03x-%04x-%04x%04x%04x",
            r(), r(), r(), r() % 4096, 32768 + r() % 16384, r(), r(), r())
        return wrk.format(nil, path, headers)
    end
    return wrk.format(nil, path)
end
done = function(summary, latency, requests)
    local e = summary.errors
    io.write(string.format("HARNESS %d %d %d %d %d %d %.1f %.1f %.1f\\n", summary.requests,
        e.connect + e.read + e.write + e.timeout, e.status, summary.duration,
        latency:percentile(50), latency:percentile(99), latency.mean, latency.max, latency.stdev))
end
""")
    return path


def load(base, script, seconds, args, sampled):
    """wrk for `seconds`, sampling `sampled` meanwhile; its counts: requests, socket errors,
    status errors, duration (µs), ingest p50 and p99 (µs)."""
    wrk = subprocess.Popen(["wrk", "-t", "2", "-c", str(args.connections), "-d", f"{seconds}s",
                            "--timeout", "10s", "-s", script, base], stdout=subprocess.PIPE, text=True)
    while wrk.poll() is None:
        for g in sampled:
            g.sample()
        time.sleep(0.5)
    line = next(l for l in wrk.stdout.read().splitlines() if l.startswith("HARNESS "))
    return line.split()[1:7]


def warm_up(base, url, script, args, receiver):
    """`--pg-steady`: the same load for --warmup seconds, drained, then a checkpoint: the
    measured run then finds WAL segments to reuse and clean buffers, as a cluster that has
    been running does."""
    before = receiver.delivered()
    requests, _, status_errors, _, _, _ = load(base, script, args.warmup, args, [])
    accepted = int(requests) - int(status_errors)
    deadline = time.time() + 600
    while receiver.delivered() - before < accepted and time.time() < deadline:
        time.sleep(0.1)
    psql(url, "CHECKPOINT")


def run(args):
    workdir = tempfile.mkdtemp(prefix="herald-harness-")
    os.chmod(workdir, 0o755)
    processes = []
    try:
        receiver = RECEIVERS[args.destination](workdir)
        processes.append(receiver.process)
        env = dict(os.environ, HERALD_ADMIN_TOKEN=TOKEN, HERALD_ALLOWED_NETWORKS="127.0.0.1/32",
                   HERALD_LOG__LEVEL="warn")
        database = None
        if args.postgres:
            database, url = start_postgres(workdir, args.pg_profile, args.pg_locale, args.pg_steady)
            processes.append(database)
            env["HERALD_DATABASE_URL"] = url
            env["HERALD_SECRET_KEY"] = "aGFybmVzcy1zZWNyZXQta2V5LTAxMjM0NTY3ODkwMTI="
        port = free_port()
        data = os.path.join(workdir, "herald-data")
        herald = subprocess.Popen([args.binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data],
                                  env=env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(workdir, "herald.log"), "w"))
        processes.append(herald)
        base = f"http://127.0.0.1:{port}"
        wait_for("herald", lambda: urllib.request.urlopen(base + "/api/v1/health/ping", timeout=2).status == 204)
        app_ids = []
        for i in range(APPS):
            app = api(base, "POST", "/api/v1/app", {"name": f"harness-{i}"})
            api(base, "POST", f"/api/v1/app/{app['id']}/endpoint", receiver.endpoint(i))
            app_ids.append(app["id"])
        script = wrk_script(workdir, app_ids, args.payload_bytes, args.payload_shape, args.idempotency_keys)
        if args.pg_steady:
            warm_up(base, url, script, args, receiver)
        delivered_before = receiver.delivered()

        if args.pg_profile:
            psql(url, PROFILE_RESET)
        wal_before = wal_bytes(url) if args.postgres else 0
        groups = [Group(herald.pid)]
        if database is not None:
            groups.append(Group(database.pid))
        broker = Group(receiver.process.pid)
        broker.sample()
        broker_before = broker.totals()
        for g in groups:
            g.sample()
        before = [g.totals() for g in groups]
        seen_before = [dict(g.seen) for g in groups]
        started = time.time()
        requests, socket_errors, status_errors, wrk_us, p50, p99 = load(base, script, args.duration, args, groups[1:])
        accepted = int(requests) - int(status_errors)

        def delivered():
            return receiver.delivered() - delivered_before

        # wrk stops counting at the end of its duration, with up to one request per
        # connection still in flight (and possibly accepted): the drain ends when nginx has
        # at least what wrk counted and Herald's queue is empty.
        def drained():
            summary = api(base, "GET", "/api/v1/stats/summary")
            idle = summary["pending"] == 0 and summary["awaitingRetry"] == 0 and summary["inFlight"] == 0
            return idle and delivered() >= accepted

        deadline = time.time() + 600
        while not drained() and time.time() < deadline:
            for g in groups[1:]:
                g.sample()
            time.sleep(0.05)
        ended = time.time()
        got = delivered()
        if args.pg_steady:
            # What the load dirtied and is not yet on disk is written now, and counted.
            psql(url, "CHECKPOINT")
        for g in groups + [broker]:
            g.sample()
        after = [g.totals() for g in groups]
        broker_cpu = broker.totals()[0] - broker_before[0]
        herald_cpu = after[0][0] - before[0][0]
        herald_written = after[0][1] - before[0][1]
        db_cpu = (after[1][0] - before[1][0]) if database is not None else 0.0
        db_written = (after[1][1] - before[1][1]) if database is not None else 0
        wal_written = (wal_bytes(url) - wal_before) if args.postgres else 0
        per = max(got, 1)
        report = {
            "backend": "postgres" if args.postgres else "sqlite",
            "destination": args.destination,
            "binary": args.binary,
            "seconds": round(ended - started, 2),
            "acceptedCountedByWrk": accepted,
            "refused": int(status_errors),
            "socketErrors": int(socket_errors),
            "delivered": got,
            "missing": max(0, accepted - got),
            "acceptedPerSecond": round(accepted / (int(wrk_us) / 1e6), 1),
            "deliveredPerSecond": round(got / (ended - started), 1),
            "heraldCpuMicrosPerMessage": round(herald_cpu * 1e6 / per, 1),
            "databaseCpuMicrosPerMessage": round(db_cpu * 1e6 / per, 1),
            "totalCpuMicrosPerMessage": round((herald_cpu + db_cpu) * 1e6 / per, 1),
            "receiverCpuMicrosPerMessage": round(broker_cpu * 1e6 / per, 1),
            "bytesWrittenPerMessage": round((herald_written + db_written) / per),
            "walBytesPerMessage": round(wal_written / per),
            "idempotencyKeys": args.idempotency_keys,
            "payloadShape": args.payload_shape,
            "pgSteady": args.pg_steady,
            "ingestLatencyP50Ms": round(float(p50) / 1000, 2),
            "ingestLatencyP99Ms": round(float(p99) / 1000, 2),
        }
        if args.json:
            print(json.dumps(report))
        else:
            for k, v in report.items():
                print(f"{k:>28}: {v}")
        if args.pg_profile:
            pg_profile(url, got, groups[1].written_by_name(seen_before[1]))
        if report["missing"] != 0 or not drained():
            sys.exit(f"not drained: {report['missing']} accepted messages never reached the {args.destination} receiver")
    finally:
        for p in reversed(processes):
            # A server started in a session of its own (RabbitMQ, through runuser) is
            # stopped with everything it started.
            group = os.getpgid(p.pid) == p.pid if p.poll() is None else False
            (os.killpg if group else os.kill)(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                (os.killpg if group else os.kill)(p.pid, signal.SIGKILL)
        shutil.rmtree(workdir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/herald/target"))
    parser.add_argument("--binary", default=os.path.join(target, "release", "herald"))
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--destination", choices=sorted(RECEIVERS), default="http")
    parser.add_argument("--duration", type=int, default=20)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--payload-bytes", type=int, default=1024)
    parser.add_argument("--payload-shape", choices=["filler", "event"], default="filler",
                        help="filler: one repeated letter (the default, comparable with earlier runs); "
                             "event: a payment event with ids, which compresses as real payloads do")
    parser.add_argument("--idempotency-keys", action="store_true",
                        help="send an Idempotency-Key of its own with every message, as the Svix SDKs do")
    parser.add_argument("--pg-profile", action="store_true",
                        help="with --postgres: print the statements by WAL volume, the buffers written and "
                             "each table's row changes, per delivered message")
    parser.add_argument("--pg-locale", metavar="LOCALE",
                        help="the cluster's locale (initdb --locale), e.g. en_US.UTF-8 as many deployments "
                             "have; implies --postgres (default: the environment's)")
    parser.add_argument("--pg-steady", action="store_true",
                        help="PostgreSQL as a cluster that has been running (implies --postgres): sized for the "
                             "load (STEADY_SETTINGS), warmed up by the same load for --warmup seconds and a "
                             "checkpoint, and the run's own dirty pages written by a checkpoint at its end and counted")
    parser.add_argument("--warmup", type=int, default=15, help="seconds of warm-up load for --pg-steady")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.postgres |= args.pg_profile or args.pg_steady or args.pg_locale is not None
    run(args)


if __name__ == "__main__":
    main()
