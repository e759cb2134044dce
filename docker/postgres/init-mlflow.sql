-- The MLflow server's own database beside the ledger's (POSTGRES_DB): its tables never mix with the ledger's.
-- Runs once, when the data volume is first initialised.
CREATE DATABASE mlflow;
