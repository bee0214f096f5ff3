"""Everything persistent, behind one interface: the archive writer (exchanges, messages, tool results,
session state, tickets), the read side (search, recall, read-back, state lookups, reports) and pins.

SQLite in `<data_dir>/archive.db` is the embedded default for one process; `archive.url:
postgresql://...` puts all of it in PostgreSQL, shared by several replicas (proxy/store/postgres*.py).
`open_storage` picks one from the config (proxy/store/storage.py)."""
