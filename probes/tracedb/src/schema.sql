-- tpscope trace format, version 2. THE source of truth: compiled into the library (schema.cpp includes it) and
-- documented column by column in docs/schema.md. Times are ns since the file's epoch (meta 'epoch_unix_ns'),
-- sizes are bytes. PRAGMA user_version holds the format version. Version 2 adds the optional summary tables, which
-- this schema does not create: tracedb/src/summary.cpp writes them beside the records of a merged or imported file.
CREATE TABLE meta(
  key   TEXT PRIMARY KEY,
  value TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE strings(
  id    INTEGER PRIMARY KEY,
  value TEXT NOT NULL UNIQUE
);

CREATE TABLE ranks(
  rank                 INTEGER PRIMARY KEY,
  host                 TEXT NOT NULL DEFAULT '',
  pid                  INTEGER NOT NULL DEFAULT 0,
  world_size           INTEGER NOT NULL DEFAULT 1,
  local_rank           INTEGER NOT NULL DEFAULT 0,
  tp_rank              INTEGER NOT NULL DEFAULT 0,
  tp_size              INTEGER NOT NULL DEFAULT 1,
  dp_rank              INTEGER NOT NULL DEFAULT 0,
  dp_size              INTEGER NOT NULL DEFAULT 1,
  device               TEXT NOT NULL DEFAULT 'cpu',
  clock_offset_ns      INTEGER NOT NULL DEFAULT 0,
  clock_uncertainty_ns INTEGER NOT NULL DEFAULT 0,
  start_ns             INTEGER,
  end_ns               INTEGER,
  exit_reason          TEXT
);

CREATE TABLE threads(
  rank   INTEGER NOT NULL,
  thread INTEGER NOT NULL,
  kind   TEXT NOT NULL DEFAULT 'cpu',
  name   TEXT NOT NULL DEFAULT '',
  PRIMARY KEY(rank, thread)
) WITHOUT ROWID;

CREATE TABLE span_kinds(id INTEGER PRIMARY KEY, name TEXT NOT NULL);
INSERT INTO span_kinds VALUES (0,'compute'),(1,'comm'),(2,'data'),(3,'optimizer'),(4,'step'),(5,'checkpoint'),
  (6,'kernel'),(7,'memcpy'),(8,'memset'),(9,'nccl_kernel'),(10,'other'),(11,'wait');

CREATE TABLE phases(id INTEGER PRIMARY KEY, name TEXT NOT NULL);
INSERT INTO phases VALUES (0,'none'),(1,'fwd'),(2,'bwd'),(3,'optimizer'),(4,'data'),(5,'checkpoint'),(6,'other');

CREATE TABLE spans(
  id          INTEGER PRIMARY KEY,
  rank        INTEGER NOT NULL,
  thread      INTEGER NOT NULL,
  kind        INTEGER NOT NULL,
  name        INTEGER NOT NULL,
  begin_ns    INTEGER NOT NULL,
  dur_ns      INTEGER NOT NULL,
  step        INTEGER NOT NULL DEFAULT -1,
  layer       INTEGER NOT NULL DEFAULT -1,
  phase       INTEGER NOT NULL DEFAULT 0,
  correlation INTEGER
);

CREATE TABLE process_groups(
  name    TEXT PRIMARY KEY,
  ranks   TEXT NOT NULL,
  size    INTEGER NOT NULL,
  backend TEXT NOT NULL DEFAULT ''
) WITHOUT ROWID;

CREATE TABLE collectives(
  id         INTEGER PRIMARY KEY,
  rank       INTEGER NOT NULL,
  group_name TEXT NOT NULL,
  seq        INTEGER NOT NULL,
  op         TEXT NOT NULL,
  dtype      TEXT NOT NULL DEFAULT '',
  shape      TEXT NOT NULL DEFAULT '[]',
  numel      INTEGER NOT NULL DEFAULT 0,
  bytes      INTEGER NOT NULL DEFAULT 0,
  callsite   TEXT NOT NULL DEFAULT '',
  step       INTEGER NOT NULL DEFAULT -1,
  layer      INTEGER NOT NULL DEFAULT -1,
  phase      INTEGER NOT NULL DEFAULT 0,
  thread     INTEGER NOT NULL DEFAULT 0,
  enqueue_ns INTEGER NOT NULL,
  start_ns   INTEGER,
  end_ns     INTEGER,
  state      TEXT NOT NULL,
  UNIQUE(rank, group_name, seq)
);

CREATE TABLE grad_stats(
  rank      INTEGER NOT NULL,
  step      INTEGER NOT NULL,
  param     INTEGER NOT NULL,
  layer     INTEGER NOT NULL DEFAULT -1,
  l2_norm   REAL,            -- NULL: NaN (SQLite stores NaN as NULL)
  max_abs   REAL,            -- NULL: NaN
  nan_count INTEGER NOT NULL DEFAULT 0,
  inf_count INTEGER NOT NULL DEFAULT 0,
  numel     INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE step_stats(
  rank       INTEGER NOT NULL,
  step       INTEGER NOT NULL,
  loss       REAL,
  lr         REAL,
  grad_norm  REAL,
  loss_scale REAL,
  tokens     INTEGER,
  begin_ns   INTEGER,
  end_ns     INTEGER,
  skipped    INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY(rank, step)
);

CREATE TABLE alerts(
  id       INTEGER PRIMARY KEY,
  rank     INTEGER NOT NULL,
  step     INTEGER NOT NULL DEFAULT -1,
  ts_ns    INTEGER NOT NULL,
  severity TEXT NOT NULL,
  kind     TEXT NOT NULL,
  layer    INTEGER NOT NULL DEFAULT -1,
  param    TEXT NOT NULL DEFAULT '',
  message  TEXT NOT NULL,
  evidence TEXT NOT NULL DEFAULT '{}'
);

CREATE TABLE counters(
  rank  INTEGER NOT NULL,
  name  INTEGER NOT NULL,
  ts_ns INTEGER NOT NULL,
  value REAL NOT NULL
);

CREATE TABLE recorder_stats(
  rank               INTEGER NOT NULL,
  ts_ns              INTEGER NOT NULL,
  spans_written      INTEGER NOT NULL,
  spans_dropped      INTEGER NOT NULL,
  records_written    INTEGER NOT NULL,
  records_dropped    INTEGER NOT NULL,
  flushes            INTEGER NOT NULL,
  flush_ns_max       INTEGER NOT NULL,
  flush_ns_total     INTEGER NOT NULL,
  probe_overhead_ns  INTEGER NOT NULL DEFAULT 0
);

CREATE VIEW span_view AS
  SELECT s.id, s.rank, s.thread, k.name AS kind, n.value AS name, s.begin_ns, s.begin_ns + s.dur_ns AS end_ns,
         s.dur_ns, s.step, s.layer, p.name AS phase, s.correlation
  FROM spans s JOIN strings n ON n.id = s.name JOIN span_kinds k ON k.id = s.kind JOIN phases p ON p.id = s.phase;

CREATE VIEW grad_view AS
  SELECT g.rank, g.step, n.value AS param, g.layer, g.l2_norm, g.max_abs, g.nan_count, g.inf_count, g.numel
  FROM grad_stats g JOIN strings n ON n.id = g.param;

CREATE VIEW counter_view AS
  SELECT c.rank, n.value AS name, c.ts_ns, c.value FROM counters c JOIN strings n ON n.id = c.name;
