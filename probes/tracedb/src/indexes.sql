-- Query indexes, created by merge and import (not by the recorder, to keep ingest fast).
CREATE INDEX IF NOT EXISTS spans_rank_begin ON spans(rank, begin_ns);
CREATE INDEX IF NOT EXISTS spans_step ON spans(step, rank);
CREATE INDEX IF NOT EXISTS collectives_group_seq ON collectives(group_name, seq, rank);
CREATE INDEX IF NOT EXISTS grad_stats_step ON grad_stats(step, rank, layer);
CREATE INDEX IF NOT EXISTS counters_name ON counters(name, rank, ts_ns);
CREATE INDEX IF NOT EXISTS alerts_ts ON alerts(ts_ns);
