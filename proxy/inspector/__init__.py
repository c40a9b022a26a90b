"""The session inspector: the last requests tailfloor sent upstream, per session, and the
pages on the admin listener that show them (what the model saw, message by message)."""
