-- schema.sql - the results database as the migrations leave it (schema
-- version 3), to read; the program builds it from migrations/*.sql, applied
-- in order by qi_db_open. The unit tests check that this file and the
-- migrations describe the same tables. Change both together: add a migration
-- (never edit an applied one) and update this file.
--
-- Times are UTC, ISO 8601 with milliseconds ('2025-01-31T12:34:56.789Z').

-- One row per experiment script name. Running a script again under the same
-- name adds runs to the same experiment; script_path and script_sha256 then
-- describe the script as it was last run.
CREATE TABLE experiments (
    id            INTEGER PRIMARY KEY,
    name          TEXT NOT NULL UNIQUE CHECK (name <> ''),
    script_path   TEXT,
    script_sha256 TEXT,
    created       TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- One row per configuration of an experiment. config_key identifies the
-- configuration (sha256 of its canonical JSON unless the caller chose one);
-- at most one row per key, so a rerun replaces a failed row instead of adding
-- a second one. 'running' exists only inside the writer's open transaction:
-- a run is committed once, at its end, as 'done' or 'failed'. AUTOINCREMENT:
-- a replaced run's id is never given to another run.
CREATE TABLE runs (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    experiment_id  INTEGER NOT NULL REFERENCES experiments(id) ON DELETE CASCADE,
    config_json    TEXT NOT NULL CHECK (json_valid(config_json)),
    config_key     TEXT NOT NULL CHECK (config_key <> ''),
    status         TEXT NOT NULL CHECK (status IN ('running', 'done', 'failed')),
    error          TEXT,                 -- why a run failed; NULL otherwise
    git_rev        TEXT,                 -- NULL: not a git checkout, or no git
    git_dirty      INTEGER CHECK (git_dirty IN (0, 1)),  -- NULL: unknown
    cpu            TEXT,
    cores          INTEGER,              -- physical cores
    mem_bytes      INTEGER,
    gpu            TEXT,                 -- NULL: no GPU
    gpu_driver     TEXT,
    model_path     TEXT,
    model_sha256   TEXT,
    engine_version TEXT,
    seed           INTEGER,              -- NULL: the run draws nothing at random
    simulated      INTEGER NOT NULL DEFAULT 0 CHECK (simulated IN (0, 1)),
    started        TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    finished       TEXT,
    -- the placement plan the run's engines ran under (JSON, as qi_plan_json
    -- writes it: devices, embedding and head device, per layer the
    -- attention and MLP devices); NULL when it created none
    placement      TEXT CHECK (placement IS NULL OR json_valid(placement)),
    UNIQUE (experiment_id, config_key)
);

-- One row per measured number. name is area.what_unit ('decode.tokens_per_s',
-- the names of results/README.md); unit is spelled out again ('tok/s', 's',
-- 'B', '1' for a pure number); repetition counts from 0 for repeated
-- measurements of one configuration; params is the canonical JSON object of
-- what the measurement varied within its run that the configuration does not
-- say ('{"batch":4}'), '{}' for most: a parameter is never part of a name.
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

-- Figures select one metric across runs. (The UNIQUE constraints already
-- index runs by experiment and metrics by run.)
CREATE INDEX metrics_by_name ON metrics(name);
