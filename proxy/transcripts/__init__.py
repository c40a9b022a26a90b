"""Follow agent session transcripts (Pi, OpenClaw JSONL and SQLite), read-only."""
