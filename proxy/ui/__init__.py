"""The dashboard at /ctxproxy/ui: server-rendered, read-only pages over the archive (no build step).

Figures come from proxy/report.py (the same functions as `ctxproxy report`); pages are in overview,
sessions, exchange, search and settings; who may see them is decided in auth.
"""

from proxy.ui.views import routes

__all__ = ["routes"]
