-- 0003_metric_params.sql - one name per metric: parameters of a
-- measurement (such as the batch size) move out of its name into params,
-- and the old names of the experiments are mapped to the names of
-- results/README.md, so databases written before still read.
--
-- params is the canonical JSON object (keys sorted, no whitespace) of what a
-- measurement varied within its run that the run's configuration does not
-- say; '{}' for most. A run may then hold decode.tokens_per_s at batch 1
-- and at batch 4: one metric per (run, name, params, repetition).
--
-- The mapping: decode.bN_tokens_per_s -> decode.tokens_per_s {"batch":N};
-- prefill.bN_ttft_s -> prefill.ttft_s {"batch":N}; prefill.ttft_ms and
-- decode.tpot_ms -> prefill.ttft_s and decode.tpot_s (value / 1000, unit s).
CREATE TEMP TABLE metrics_0002 AS SELECT * FROM metrics;
DROP TABLE metrics;
CREATE TABLE metrics (
    id         INTEGER PRIMARY KEY,
    run_id     INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    name       TEXT NOT NULL CHECK (instr(name, '.') > 1),
    value      REAL NOT NULL,
    unit       TEXT NOT NULL CHECK (unit <> ''),
    repetition INTEGER NOT NULL DEFAULT 0 CHECK (repetition >= 0),
    simulated  INTEGER NOT NULL DEFAULT 0 CHECK (simulated IN (0, 1)),
    params     TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(params) AND json_type(params) = 'object'),
    UNIQUE (run_id, name, params, repetition)
);
INSERT INTO metrics (id, run_id, name, value, unit, repetition, simulated, params)
SELECT id, run_id,
       CASE
           WHEN name GLOB 'decode.b[0-9]*_tokens_per_s' THEN 'decode.tokens_per_s'
           WHEN name GLOB 'prefill.b[0-9]*_ttft_s' THEN 'prefill.ttft_s'
           WHEN name = 'prefill.ttft_ms' THEN 'prefill.ttft_s'
           WHEN name = 'decode.tpot_ms' THEN 'decode.tpot_s'
           ELSE name
       END,
       CASE WHEN name IN ('prefill.ttft_ms', 'decode.tpot_ms') THEN value / 1000 ELSE value END,
       CASE WHEN name IN ('prefill.ttft_ms', 'decode.tpot_ms') THEN 's' ELSE unit END,
       repetition, simulated,
       CASE
           WHEN name GLOB 'decode.b[0-9]*_tokens_per_s' OR name GLOB 'prefill.b[0-9]*_ttft_s'
           THEN json_object('batch', CAST(substr(name, instr(name, '.b') + 2,
                                                 instr(name, '_') - instr(name, '.b') - 2) AS INTEGER))
           ELSE '{}'
       END
FROM metrics_0002 ORDER BY id;
DROP TABLE metrics_0002;
CREATE INDEX metrics_by_name ON metrics(name);
