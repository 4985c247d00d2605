-- 0002_placement.sql - the placement plan a run's engines ran under.
--
-- JSON as qi_plan_json writes it: {"devices":[...],"embd":D,"head":D,
-- "layers":[[attn,mlp(,split,split_dev)],...]}, device indices into
-- "devices". NULL: the run created no engine (or was recorded before this
-- column existed).
ALTER TABLE runs ADD COLUMN placement TEXT CHECK (placement IS NULL OR json_valid(placement));
