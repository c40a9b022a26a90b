"""Context overflow recovery: detect overflows, make summaries, remember compactions.

detect / patterns / silent: is an upstream answer an overflow (pure).
prompt / chunks / response / summarizer: summarization requests and the async Summarizer.
fingerprint / store: which request prefix a stored compaction replaces, kept in SQLite.
"""
